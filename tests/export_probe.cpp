// A shared library that exports a C++ function next to a C one, so that the
// export check (check_exports.cmake) is seen to fail on what it must catch.
namespace rmsnorm::probe {
__attribute__((visibility("default"))) int exported_cxx_function(int v) { return v + 1; }
}  // namespace rmsnorm::probe

extern "C" __attribute__((visibility("default"))) int rmsnorm_probe_only(int v) {
  return rmsnorm::probe::exported_cxx_function(v);
}
