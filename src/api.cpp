// The C ABI: argument validation and backend selection, nothing else.
// Every check runs before any memory is touched, so a failing call writes
// nothing; the message names the argument and the reason.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <new>
#include <optional>
#include <string>
#include <thread>

#include "args.hpp"
#include "cpu/cpu_backend.hpp"
#include "error.hpp"
#include "plan.hpp"
#include "rmsnorm/rmsnorm.h"
#if defined(RMSNORM_WITH_CUDA)
#include "cuda/cuda_backend.hpp"
#endif

namespace rmsnorm {

namespace {
thread_local std::string g_last_error;
// Set instead of g_last_error where a message could not be built (no memory for it); a literal.
thread_local const char* g_fixed_error = nullptr;
}

void set_last_error(std::string message) {
  g_fixed_error = nullptr;
  g_last_error = std::move(message);
}
void clear_last_error() {
  g_fixed_error = nullptr;
  g_last_error.clear();
}

rmsnorm_status_t fail(rmsnorm_status_t status, const std::string& what, const std::string& why) {
  set_last_error(what + ": " + why);
  return status;
}

namespace {

// Every entry point runs its body through this, so that no C++ exception crosses the C ABI. What can throw is
// std::bad_alloc: building an error message, or the CPU backend's scratch (which the backend itself turns into
// INTERNAL_ERROR before it writes anything). A message is built while validating, before anything is written, so
// "a failing call writes nothing" holds here too.
template <typename Fn>
rmsnorm_status_t guarded(Fn&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    g_fixed_error = "out of host memory (while validating the arguments or building the error message)";
  } catch (...) {
    g_fixed_error = "unexpected C++ exception inside the library";
  }
  return RMSNORM_STATUS_INTERNAL_ERROR;
}

}  // namespace

namespace {

constexpr uint32_t kKnownFlags =
    RMSNORM_FLAG_WEIGHT_OFFSET | RMSNORM_FLAG_ROUND_XHAT | RMSNORM_FLAG_NO_PDL | RMSNORM_FLAG_TRUSTED_MEMORY |
    RMSNORM_FLAG_WEIGHT_F32 | RMSNORM_FLAG_Y_DTYPE_MASK | RMSNORM_FLAG_RESIDUAL_F32 | RMSNORM_FLAG_WEIGHT_Y_DTYPE;

std::string num(int64_t v) { return std::to_string(v); }

// Byte extent [begin, end) of an operand plus, for matrices, the row geometry
// used by the exact overlap test of equal-stride matrices.
struct Extent {
  const char* name = "";
  uintptr_t begin = 0;
  uintptr_t end = 0;
  int64_t rows = 1;          // 1 for vectors
  int64_t stride_bytes = 0;  // 0 for vectors
  int64_t row_bytes = 0;     // bytes of one row (or the whole vector)
  bool present() const { return end > begin; }
};

// The byte extent of a rows x cols operand with a row stride (vectors: one
// row), or an empty Extent for a null pointer or no rows. Rejects, as
// INVALID_SHAPE naming the operand, a size that overflows int64 and an
// extent that runs past the top of the address space: p + bytes must be
// representable (as C requires of a one-past-the-end pointer), so no check
// or kernel below ever computes a wrapped address.
rmsnorm_status_t extent_of(const char* name, const void* p, int64_t rows, int64_t cols, int64_t stride, size_t esize,
                           Extent* e) {
  *e = Extent{};
  e->name = name;
  if (p == nullptr || rows <= 0) return RMSNORM_STATUS_SUCCESS;
  // cols >= 1 and stride >= cols were checked; bytes = ((rows - 1) * stride + cols) * esize.
  const int64_t es = static_cast<int64_t>(esize);
  const int64_t max_elems = std::numeric_limits<int64_t>::max() / es;
  if (cols > max_elems || (rows > 1 && stride > (max_elems - cols) / (rows - 1))) {
    const std::string what = rows > 1 ? num(rows) + " rows of stride " + num(stride) : num(cols);
    return fail(RMSNORM_STATUS_INVALID_SHAPE, name, what + " elements of " + num(es) + " bytes overflow int64");
  }
  const int64_t bytes = ((rows - 1) * stride + cols) * es;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p);
  if (static_cast<uint64_t>(bytes) > static_cast<uint64_t>(std::numeric_limits<uintptr_t>::max() - begin)) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "%lld bytes from address 0x%llx wrap past the top of the address space",
                  static_cast<long long>(bytes), static_cast<unsigned long long>(begin));
    return fail(RMSNORM_STATUS_INVALID_SHAPE, name, buf);
  }
  e->begin = begin;
  e->end = begin + static_cast<uintptr_t>(bytes);
  e->rows = rows;
  e->row_bytes = cols * es;
  // A single row has no stride to speak of: y == x with rows == 1 is the same view whatever the strides.
  e->stride_bytes = rows > 1 ? stride * es : e->row_bytes;
  return RMSNORM_STATUS_SUCCESS;
}

rmsnorm_status_t vector_extent(const char* name, const void* p, int64_t n, size_t esize, Extent* e) {
  return extent_of(name, p, 1, n, n, esize, e);
}

// True when some byte belongs to both. Equal-stride matrices (interleaved
// views of one buffer, e.g. q and k in a packed qkv tensor) are tested row by
// row; otherwise the byte ranges decide, which is conservative.
bool overlaps(const Extent& a, const Extent& b) {
  if (!a.present() || !b.present()) return false;
  if (a.end <= b.begin || b.end <= a.begin) return false;
  if (a.rows > 1 && b.rows > 1 && a.stride_bytes == b.stride_bytes) {
    const int64_t s = a.stride_bytes;
    const int64_t d = static_cast<int64_t>(b.begin - a.begin);  // two's complement difference
    // Row i of a meets row j of b iff [i*s, i*s + la) meets [d + j*s, d + j*s + lb).
    // Only k = i - j near d / s can work; check the neighbours of the quotient.
    const int64_t q = d >= 0 ? d / s : -((-d + s - 1) / s);
    for (int64_t k = q - 1; k <= q + 1; ++k) {
      if (k <= -b.rows || k >= a.rows) continue;
      const int64_t lo = k * s, hi = lo + a.row_bytes;  // a's row, relative to b's row j = i - k
      if (lo < d + b.row_bytes && d < hi) return true;
    }
    return false;
  }
  return true;
}

bool same_view(const Extent& a, const Extent& b) {
  return a.begin == b.begin && a.stride_bytes == b.stride_bytes && a.end == b.end;
}

rmsnorm_status_t check_overlap(const Extent& out, const Extent& other) {
  if (overlaps(out, other))
    return fail(RMSNORM_STATUS_OVERLAP, out.name, std::string("overlaps ") + other.name);
  return RMSNORM_STATUS_SUCCESS;
}

bool aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

struct Common {
  DType dtype = DType::kF32;
  size_t esize = 4;  // dtype_size(dtype)
  size_t wsize = 4;  // the weight's element size: dtype_size(weight_dtype)
  bool weight_f32 = false;  // RMSNORM_FLAG_WEIGHT_F32 with 16-bit x
  DType weight_dtype = DType::kF32;  // the weight's (and gw's in the non-F32 modes)
  DType y_dtype = DType::kF32;  // y's (and gy's) dtype: dtype unless RMSNORM_FLAG_Y_DTYPE says otherwise
  size_t ysize = 4;             // dtype_size(y_dtype)
  bool residual_f32 = false;    // RMSNORM_FLAG_RESIDUAL_F32 with 16-bit x
  size_t rsize = 4;             // the residual stream's element size (residual, h; g_h and gx in the add backward)
  bool cuda = false;
  int device = -1;
  void* stream = nullptr;
  int threads = 0;
  bool trusted_memory = false;  // RMSNORM_FLAG_TRUSTED_MEMORY
};

#define RMSNORM_TRY(expr)                                          \
  do {                                                             \
    const rmsnorm_status_t rmsnorm_status_ = (expr);               \
    if (rmsnorm_status_ != RMSNORM_STATUS_SUCCESS) return rmsnorm_status_; \
  } while (0)

rmsnorm_status_t check_problem_and_backend(const rmsnorm_problem_t* p, const rmsnorm_backend_t* b, Common* c) {
  if (p == nullptr) return fail(RMSNORM_STATUS_NULL_POINTER, "problem", "must not be NULL");
  if (b == nullptr) return fail(RMSNORM_STATUS_NULL_POINTER, "backend", "must not be NULL");
  if (!known_dtype(p->dtype))
    return fail(RMSNORM_STATUS_INVALID_DTYPE, "dtype", "unknown dtype " + num(p->dtype));
  if ((p->flags & ~kKnownFlags) != 0)
    return fail(RMSNORM_STATUS_INVALID_OPTION, "flags", "unknown flag bits " + num(p->flags & ~kKnownFlags));
  c->trusted_memory = (p->flags & RMSNORM_FLAG_TRUSTED_MEMORY) != 0;
  if (p->rows < 0) return fail(RMSNORM_STATUS_INVALID_SHAPE, "rows", "must be >= 0 (got " + num(p->rows) + ")");
  if (p->cols <= 0) return fail(RMSNORM_STATUS_INVALID_SHAPE, "cols", "must be >= 1 (got " + num(p->cols) + ")");
  if (p->cols > plan::kMaxCols)
    return fail(RMSNORM_STATUS_INVALID_SHAPE, "cols", "must be at most " + num(plan::kMaxCols) + " (got " + num(p->cols) + ")");
  if (!std::isfinite(p->eps) || p->eps < 0.0f) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "must be finite and >= 0 (got %g)", static_cast<double>(p->eps));
    return fail(RMSNORM_STATUS_INVALID_EPS, "eps", buf);
  }
  c->dtype = static_cast<DType>(p->dtype);
  c->esize = dtype_size(c->dtype);
  c->weight_f32 = (p->flags & RMSNORM_FLAG_WEIGHT_F32) != 0 && c->dtype != DType::kF32;
  const uint32_t y_bits = (p->flags & RMSNORM_FLAG_Y_DTYPE_MASK) >> 8;
  c->y_dtype = y_bits == 0 ? c->dtype : static_cast<DType>(y_bits - 1);
  c->ysize = dtype_size(c->y_dtype);
  const bool weight_y = (p->flags & RMSNORM_FLAG_WEIGHT_Y_DTYPE) != 0;
  if (weight_y && (c->dtype != DType::kF32 || c->y_dtype == DType::kF32 || (p->flags & RMSNORM_FLAG_WEIGHT_F32) != 0))
    return fail(RMSNORM_STATUS_INVALID_OPTION, "flags",
                "RMSNORM_FLAG_WEIGHT_Y_DTYPE needs fp32 x and RMSNORM_FLAG_Y_DTYPE of f16 or bf16, without "
                "RMSNORM_FLAG_WEIGHT_F32");
  c->weight_dtype = c->weight_f32 ? DType::kF32 : weight_y ? c->y_dtype : c->dtype;
  c->wsize = dtype_size(c->weight_dtype);
  c->residual_f32 = (p->flags & RMSNORM_FLAG_RESIDUAL_F32) != 0 && c->dtype != DType::kF32;
  c->rsize = c->residual_f32 ? sizeof(float) : c->esize;
  if (b->kind == RMSNORM_BACKEND_CPU) {
    if (b->num_threads < 0)
      return fail(RMSNORM_STATUS_INVALID_OPTION, "backend.num_threads", "must be >= 0 (got " + num(b->num_threads) + ")");
    c->cuda = false;
    c->threads = b->num_threads;
    return RMSNORM_STATUS_SUCCESS;
  }
  if (b->kind != RMSNORM_BACKEND_CUDA)
    return fail(RMSNORM_STATUS_INVALID_OPTION, "backend.kind", "unknown backend kind " + num(b->kind));
  if (b->device < -1)
    return fail(RMSNORM_STATUS_INVALID_OPTION, "backend.device", "must be a device ordinal or -1 (got " + num(b->device) + ")");
  c->cuda = true;
  c->stream = b->stream;
#if defined(RMSNORM_WITH_CUDA)
  if (!cuda::available())
    return fail(RMSNORM_STATUS_BACKEND_UNAVAILABLE, "backend.kind", "no CUDA device is present");
  return cuda::resolve_device(b->device, &c->device);
#else
  return fail(RMSNORM_STATUS_BACKEND_UNAVAILABLE, "backend.kind", "this build has no CUDA backend");
#endif
}

rmsnorm_status_t check_stride(const char* name, int64_t stride, int64_t cols) {
  if (stride < cols)
    return fail(RMSNORM_STATUS_INVALID_STRIDE, name, num(stride) + " is less than cols (" + num(cols) + ")");
  return RMSNORM_STATUS_SUCCESS;
}

rmsnorm_status_t check_pointer(const char* name, const void* p, size_t align) {
  if (p == nullptr) return fail(RMSNORM_STATUS_NULL_POINTER, name, "must not be NULL");
  if (!aligned(p, align))
    return fail(RMSNORM_STATUS_MISALIGNED, name, "must be aligned to " + num(static_cast<int64_t>(align)) + " bytes");
  return RMSNORM_STATUS_SUCCESS;
}

// The only check that asks the CUDA runtime anything, so it runs after every
// arithmetic check: a bad shape, stride or extent gets the same status on
// either backend.
rmsnorm_status_t check_memory_space(std::initializer_list<const Extent*> operands, const Common& c) {
#if defined(RMSNORM_WITH_CUDA)
  if (c.trusted_memory) return RMSNORM_STATUS_SUCCESS;  // the caller vouches (rmsnorm.h)
  // The queries run with the call's device current, as its launches will
  // (a failure to make it current is the launch's to report).
  std::optional<cuda::DeviceScope> scope;
  if (c.cuda) scope.emplace(c.device);
  for (const Extent* e : operands) {
    if (!e->present()) continue;
    const char* name = e->name;
    int owner = -1;
    const char* why = "";
    const cuda::MemorySpace space = cuda::memory_space(reinterpret_cast<const void*>(e->begin), &owner, &why);
    // The CPU backend works without a usable CUDA runtime: then nothing is
    // device memory. The CUDA backend cannot launch without one.
    if (space == cuda::MemorySpace::kUnknown) {
      if (!c.cuda) continue;
      return fail(RMSNORM_STATUS_CUDA_ERROR, name, std::string("cudaPointerGetAttributes failed: ") + why);
    }
    if (!c.cuda && space == cuda::MemorySpace::kDevice)
      return fail(RMSNORM_STATUS_WRONG_MEMORY_SPACE, name, "is device memory, but the backend is CPU");
    if (c.cuda && space == cuda::MemorySpace::kDevice && owner != c.device)
      return fail(RMSNORM_STATUS_WRONG_MEMORY_SPACE, name,
                  "is memory of device " + num(owner) + ", but the backend runs on device " + num(c.device));
    if (c.cuda && space == cuda::MemorySpace::kHost)
      return fail(RMSNORM_STATUS_WRONG_MEMORY_SPACE, name, "is pageable host memory, but the backend is CUDA");
  }
#else
  (void)operands;
  (void)c;
#endif
  return RMSNORM_STATUS_SUCCESS;
}

rmsnorm_status_t check_optional_pointer(const char* name, const void* p, size_t align) {
  return p == nullptr ? RMSNORM_STATUS_SUCCESS : check_pointer(name, p, align);
}

// The fields forward and backward share, from a problem that passed
// check_problem_and_backend.
template <typename Args>
void set_problem_fields(const rmsnorm_problem_t& p, const Common& c, Args* a) {
  a->rows = p.rows;
  a->cols = p.cols;
  a->dtype = c.dtype;
  a->eps = p.eps;
  a->weight_offset = (p.flags & RMSNORM_FLAG_WEIGHT_OFFSET) != 0;
  a->weight_f32 = c.weight_f32;
  a->weight_dtype = static_cast<int32_t>(c.weight_dtype);
  a->pdl = (p.flags & RMSNORM_FLAG_NO_PDL) == 0;
  a->y_dtype = static_cast<int32_t>(c.y_dtype);
}

// RMSNORM_FLAG_RESIDUAL_F32: the residual-add forward and backward take it.
rmsnorm_status_t check_residual_f32(const Common& c, bool op_takes_it, const char* op) {
  if (!c.residual_f32 || op_takes_it) return RMSNORM_STATUS_SUCCESS;
  return fail(RMSNORM_STATUS_INVALID_OPTION, "flags", std::string("RMSNORM_FLAG_RESIDUAL_F32 is not supported by ") + op);
}

// RMSNORM_FLAG_Y_DTYPE: the operations that take it.
rmsnorm_status_t check_y_dtype(const Common& c, bool op_takes_it, const char* op) {
  if (c.y_dtype == c.dtype || op_takes_it) return RMSNORM_STATUS_SUCCESS;
  return fail(RMSNORM_STATUS_INVALID_OPTION, "flags",
              std::string("RMSNORM_FLAG_Y_DTYPE with a dtype other than x's is not supported by ") + op);
}

int cpu_threads(int requested) {
  if (requested > 0) return requested;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

}  // namespace
}  // namespace rmsnorm

using namespace rmsnorm;

extern "C" {

const char* rmsnorm_status_string(rmsnorm_status_t status) {
  switch (status) {
    case RMSNORM_STATUS_SUCCESS: return "RMSNORM_STATUS_SUCCESS";
    case RMSNORM_STATUS_NULL_POINTER: return "RMSNORM_STATUS_NULL_POINTER";
    case RMSNORM_STATUS_INVALID_SHAPE: return "RMSNORM_STATUS_INVALID_SHAPE";
    case RMSNORM_STATUS_INVALID_STRIDE: return "RMSNORM_STATUS_INVALID_STRIDE";
    case RMSNORM_STATUS_INVALID_EPS: return "RMSNORM_STATUS_INVALID_EPS";
    case RMSNORM_STATUS_INVALID_DTYPE: return "RMSNORM_STATUS_INVALID_DTYPE";
    case RMSNORM_STATUS_INVALID_OPTION: return "RMSNORM_STATUS_INVALID_OPTION";
    case RMSNORM_STATUS_MISALIGNED: return "RMSNORM_STATUS_MISALIGNED";
    case RMSNORM_STATUS_WORKSPACE_TOO_SMALL: return "RMSNORM_STATUS_WORKSPACE_TOO_SMALL";
    case RMSNORM_STATUS_OVERLAP: return "RMSNORM_STATUS_OVERLAP";
    case RMSNORM_STATUS_WRONG_MEMORY_SPACE: return "RMSNORM_STATUS_WRONG_MEMORY_SPACE";
    case RMSNORM_STATUS_BACKEND_UNAVAILABLE: return "RMSNORM_STATUS_BACKEND_UNAVAILABLE";
    case RMSNORM_STATUS_CUDA_ERROR: return "RMSNORM_STATUS_CUDA_ERROR";
    case RMSNORM_STATUS_INTERNAL_ERROR: return "RMSNORM_STATUS_INTERNAL_ERROR";
  }
  return "RMSNORM_STATUS_UNKNOWN";
}

const char* rmsnorm_last_error(void) { return g_fixed_error != nullptr ? g_fixed_error : g_last_error.c_str(); }

int32_t rmsnorm_version(void) { return RMSNORM_VERSION; }

size_t rmsnorm_dtype_size(int32_t dtype) { return known_dtype(dtype) ? dtype_size(static_cast<DType>(dtype)) : 0; }

int rmsnorm_cuda_available(void) {
#if defined(RMSNORM_WITH_CUDA)
  return cuda::available() ? 1 : 0;
#else
  return 0;
#endif
}

rmsnorm_problem_t rmsnorm_problem_default(void) {
  rmsnorm_problem_t p;
  p.rows = 0;
  p.cols = 0;
  p.dtype = RMSNORM_DTYPE_F32;
  p.flags = 0;
  p.eps = 1e-5f;
  return p;
}

rmsnorm_backend_t rmsnorm_backend_cpu(int32_t num_threads) {
  rmsnorm_backend_t b;
  b.kind = RMSNORM_BACKEND_CPU;
  b.device = -1;
  b.stream = nullptr;
  b.num_threads = num_threads;
  return b;
}

rmsnorm_backend_t rmsnorm_backend_cuda(int32_t device, void* stream) {
  rmsnorm_backend_t b;
  b.kind = RMSNORM_BACKEND_CUDA;
  b.device = device;
  b.stream = stream;
  b.num_threads = 0;
  return b;
}

static rmsnorm_status_t forward_entry(const rmsnorm_problem_t* problem, const void* x, int64_t x_row_stride,
                                      const void* weight, void* y, int64_t y_row_stride, float* rstd,
                                      const rmsnorm_backend_t* backend) {
  clear_last_error();
  Common c;
  RMSNORM_TRY(check_problem_and_backend(problem, backend, &c));
  RMSNORM_TRY(check_y_dtype(c, true, "rmsnorm_forward"));
  RMSNORM_TRY(check_residual_f32(c, false, "rmsnorm_forward"));
  if (problem->rows == 0) return RMSNORM_STATUS_SUCCESS;

  // Built once; everything below validates these fields, then hands them over.
  ForwardArgs a;
  set_problem_fields(*problem, c, &a);
  a.round_xhat = (problem->flags & RMSNORM_FLAG_ROUND_XHAT) != 0;
  a.x = x;
  a.x_stride = x_row_stride;
  a.weight = weight;
  a.y = y;
  a.y_stride = y_row_stride;
  a.rstd = rstd;

  RMSNORM_TRY(check_pointer("x", a.x, c.esize));
  RMSNORM_TRY(check_pointer("y", a.y, c.ysize));
  RMSNORM_TRY(check_optional_pointer("weight", a.weight, c.wsize));
  RMSNORM_TRY(check_optional_pointer("rstd", a.rstd, sizeof(float)));
  RMSNORM_TRY(check_stride("x_row_stride", a.x_stride, a.cols));
  RMSNORM_TRY(check_stride("y_row_stride", a.y_stride, a.cols));

  Extent ex, ey, ew, er;
  RMSNORM_TRY(extent_of("x", a.x, a.rows, a.cols, a.x_stride, c.esize, &ex));
  RMSNORM_TRY(extent_of("y", a.y, a.rows, a.cols, a.y_stride, c.ysize, &ey));
  RMSNORM_TRY(vector_extent("weight", a.weight, a.cols, c.wsize, &ew));
  RMSNORM_TRY(vector_extent("rstd", a.rstd, a.rows, sizeof(float), &er));
  RMSNORM_TRY(check_memory_space({&ex, &ey, &ew, &er}, c));
  // y may alias x exactly (in place) when they have one dtype; any other overlap is rejected.
  if ((!same_view(ey, ex) || c.y_dtype != c.dtype) && overlaps(ey, ex))
    return fail(RMSNORM_STATUS_OVERLAP, "y", "overlaps x (only y == x with equal row strides and dtypes is allowed)");
  RMSNORM_TRY(check_overlap(ey, ew));
  RMSNORM_TRY(check_overlap(er, ex));
  RMSNORM_TRY(check_overlap(er, ew));
  RMSNORM_TRY(check_overlap(er, ey));

  if (!c.cuda) return cpu::forward(a, cpu_threads(c.threads));
#if defined(RMSNORM_WITH_CUDA)
  return cuda::forward(a, c.device, c.stream);
#else
  return fail(RMSNORM_STATUS_INTERNAL_ERROR, "backend", "unreachable");
#endif
}

rmsnorm_status_t rmsnorm_forward(const rmsnorm_problem_t* problem, const void* x, int64_t x_row_stride,
                                 const void* weight, void* y, int64_t y_row_stride, float* rstd,
                                 const rmsnorm_backend_t* backend) {
  return guarded([&] { return forward_entry(problem, x, x_row_stride, weight, y, y_row_stride, rstd, backend); });
}

static rmsnorm_status_t workspace_size_impl(const rmsnorm_problem_t* problem, int32_t gw_mode, const Common& c,
                                            size_t* bytes) {
  const GwMode mode = static_cast<GwMode>(gw_mode);
  if (!c.cuda) {
    *bytes = cpu::backward_workspace_bytes(problem->rows, problem->cols, mode);
    return RMSNORM_STATUS_SUCCESS;
  }
#if defined(RMSNORM_WITH_CUDA)
  // The launch backward_entry makes (the fp32 residual stream's runs as the fp32 problem with gy in x's dtype: a
  // mixed one, the looped band's launch, whose workspace does not depend on the element size).
  const cuda::BackwardForm form =
      c.residual_f32 ? cuda::BackwardForm::kMixed
                     : cuda::backward_form(c.dtype, c.weight_dtype, c.y_dtype);
  return cuda::backward_workspace_bytes(problem->rows, problem->cols, c.dtype, mode, form, c.device, bytes);
#else
  return fail(RMSNORM_STATUS_INTERNAL_ERROR, "backend", "unreachable");
#endif
}

static bool valid_gw_mode(int32_t m) { return m >= RMSNORM_GW_NONE && m <= RMSNORM_GW_ACCUMULATE_F32; }

static rmsnorm_status_t add_forward_entry(const rmsnorm_problem_t* problem, const void* x, int64_t x_row_stride,
                                          const void* residual, int64_t residual_row_stride, const void* weight,
                                          void* h, int64_t h_row_stride, void* y, int64_t y_row_stride, float* rstd,
                                          const rmsnorm_backend_t* backend) {
  clear_last_error();
  Common c;
  RMSNORM_TRY(check_problem_and_backend(problem, backend, &c));
  RMSNORM_TRY(check_y_dtype(c, false, "rmsnorm_add_forward"));
  RMSNORM_TRY(check_residual_f32(c, true, "rmsnorm_add_forward"));
  if (problem->rows == 0) return RMSNORM_STATUS_SUCCESS;

  ForwardArgs a;
  set_problem_fields(*problem, c, &a);
  a.round_xhat = (problem->flags & RMSNORM_FLAG_ROUND_XHAT) != 0;
  a.x = x;
  a.x_stride = x_row_stride;
  a.residual = residual;
  a.residual_stride = residual_row_stride;
  a.weight = weight;
  a.h = h;
  a.h_stride = h_row_stride;
  a.residual_f32 = c.residual_f32;
  a.y = y;
  a.y_stride = y_row_stride;
  a.rstd = rstd;

  RMSNORM_TRY(check_pointer("x", a.x, c.esize));
  RMSNORM_TRY(check_pointer("residual", a.residual, c.rsize));
  RMSNORM_TRY(check_pointer("h", a.h, c.rsize));
  RMSNORM_TRY(check_pointer("y", a.y, c.esize));
  RMSNORM_TRY(check_optional_pointer("weight", a.weight, c.wsize));
  RMSNORM_TRY(check_optional_pointer("rstd", a.rstd, sizeof(float)));
  RMSNORM_TRY(check_stride("x_row_stride", a.x_stride, a.cols));
  RMSNORM_TRY(check_stride("residual_row_stride", a.residual_stride, a.cols));
  RMSNORM_TRY(check_stride("h_row_stride", a.h_stride, a.cols));
  RMSNORM_TRY(check_stride("y_row_stride", a.y_stride, a.cols));

  Extent ex, eres, eh, ey, ew, er;
  RMSNORM_TRY(extent_of("x", a.x, a.rows, a.cols, a.x_stride, c.esize, &ex));
  RMSNORM_TRY(extent_of("residual", a.residual, a.rows, a.cols, a.residual_stride, c.rsize, &eres));
  RMSNORM_TRY(extent_of("h", a.h, a.rows, a.cols, a.h_stride, c.rsize, &eh));
  RMSNORM_TRY(extent_of("y", a.y, a.rows, a.cols, a.y_stride, c.esize, &ey));
  RMSNORM_TRY(vector_extent("weight", a.weight, a.cols, c.wsize, &ew));
  RMSNORM_TRY(vector_extent("rstd", a.rstd, a.rows, sizeof(float), &er));
  RMSNORM_TRY(check_memory_space({&ex, &eres, &eh, &ey, &ew, &er}, c));
  // h may be x or residual exactly (each element is read before it is written, by the same thread), and x may
  // be residual exactly; no other overlap (a partial one would let h's stores reach elements not yet read).
  // With an fp32 residual stream, x has another dtype: it may overlap neither residual nor h.
  if ((!same_view(eres, ex) || c.residual_f32) && overlaps(eres, ex))
    return fail(RMSNORM_STATUS_OVERLAP, "residual",
                c.residual_f32 ? "overlaps x (another dtype with RMSNORM_FLAG_RESIDUAL_F32)"
                               : "overlaps x (only residual == x with equal row strides)");
  for (const Extent* in : {&ex, &eres}) {
    if ((!same_view(eh, *in) || (c.residual_f32 && in == &ex)) && overlaps(eh, *in))
      return fail(RMSNORM_STATUS_OVERLAP, "h",
                  std::string("overlaps ") + in->name +
                      (c.residual_f32 ? " (only h == residual, with equal row strides, with RMSNORM_FLAG_RESIDUAL_F32)"
                                      : " (only h == x or h == residual with equal row strides)"));
  }
  RMSNORM_TRY(check_overlap(eh, ew));
  for (const Extent* other : {&ex, &eres, &eh, &ew}) RMSNORM_TRY(check_overlap(ey, *other));
  for (const Extent* other : {&ex, &eres, &eh, &ew, &ey}) RMSNORM_TRY(check_overlap(er, *other));

  if (!c.cuda) return cpu::forward(a, cpu_threads(c.threads));
#if defined(RMSNORM_WITH_CUDA)
  return cuda::forward(a, c.device, c.stream);
#else
  return fail(RMSNORM_STATUS_INTERNAL_ERROR, "backend", "unreachable");
#endif
}

rmsnorm_status_t rmsnorm_add_forward(const rmsnorm_problem_t* problem, const void* x, int64_t x_row_stride,
                                     const void* residual, int64_t residual_row_stride, const void* weight, void* h,
                                     int64_t h_row_stride, void* y, int64_t y_row_stride, float* rstd,
                                     const rmsnorm_backend_t* backend) {
  return guarded([&] {
    return add_forward_entry(problem, x, x_row_stride, residual, residual_row_stride, weight, h, h_row_stride, y,
                             y_row_stride, rstd, backend);
  });
}

// rmsnorm_forward_quant, and with a residual (non-null) rmsnorm_add_forward_quant: h = T(x + residual) written to
// h, then quantized as rmsnorm_forward_quant of h. The add's operand and aliasing rules are rmsnorm_add_forward's.
// The quantized forwards' common part, after the quant struct has been read into qa (q, q_stride included).
static rmsnorm_status_t forward_quant_run(const rmsnorm_problem_t* problem, const Common& c, const void* x,
                                          int64_t x_row_stride, const void* residual, int64_t residual_row_stride,
                                          const void* weight, void* h, int64_t h_row_stride, QuantArgs qa, float* rstd) {
  const bool blocks = qa.block_cols > 0;
  const char* scales_name = blocks ? "quant.scales" : "quant.row_scales";

  ForwardArgs a;
  set_problem_fields(*problem, c, &a);
  a.round_xhat = (problem->flags & RMSNORM_FLAG_ROUND_XHAT) != 0;
  a.x = x;
  a.x_stride = x_row_stride;
  a.weight = weight;
  a.rstd = rstd;
  const bool add = residual != nullptr || h != nullptr;
  if (add) {
    a.residual = residual;
    a.residual_stride = residual_row_stride;
    a.h = h;
    a.h_stride = h_row_stride;
    RMSNORM_TRY(check_pointer("residual", a.residual, c.esize));
    RMSNORM_TRY(check_pointer("h", a.h, c.esize));
    RMSNORM_TRY(check_stride("residual_row_stride", a.residual_stride, a.cols));
    RMSNORM_TRY(check_stride("h_row_stride", a.h_stride, a.cols));
  }
  RMSNORM_TRY(check_pointer("x", a.x, c.esize));
  RMSNORM_TRY(check_pointer("q", qa.q, 1));
  RMSNORM_TRY(check_optional_pointer("weight", a.weight, c.wsize));
  RMSNORM_TRY(check_optional_pointer("rstd", a.rstd, sizeof(float)));
  RMSNORM_TRY(check_optional_pointer("quant.scale", qa.scale, sizeof(float)));
  RMSNORM_TRY(check_optional_pointer(scales_name, qa.row_scales, sizeof(float)));
  RMSNORM_TRY(check_optional_pointer("quant.scale_ub", qa.scale_ub, sizeof(float)));
  RMSNORM_TRY(check_stride("x_row_stride", a.x_stride, a.cols));
  RMSNORM_TRY(check_stride("q_row_stride", qa.q_stride, a.cols));

  Extent ex, eq, ew, er, es, ers, eub, eres, eh;
  RMSNORM_TRY(extent_of("x", a.x, a.rows, a.cols, a.x_stride, c.esize, &ex));
  RMSNORM_TRY(extent_of("residual", a.residual, a.rows, a.cols, a.residual_stride, c.esize, &eres));
  RMSNORM_TRY(extent_of("h", a.h, a.rows, a.cols, a.h_stride, c.esize, &eh));
  RMSNORM_TRY(extent_of("q", qa.q, a.rows, a.cols, qa.q_stride, 1, &eq));
  RMSNORM_TRY(vector_extent("weight", a.weight, a.cols, c.wsize, &ew));
  RMSNORM_TRY(vector_extent("rstd", a.rstd, a.rows, sizeof(float), &er));
  RMSNORM_TRY(vector_extent("quant.scale", qa.scale, 1, sizeof(float), &es));
  if (!blocks) {
    RMSNORM_TRY(vector_extent(scales_name, qa.row_scales, a.rows, sizeof(float), &ers));
  } else {
    // The scales as a matrix (transposed where column-major), so that the overlap checks see every scale.
    const int64_t nb = (a.cols + qa.block_cols - 1) / qa.block_cols;
    const bool row_major = qa.scales_block_stride == 1 && qa.scales_row_stride >= nb;
    RMSNORM_TRY(row_major ? extent_of(scales_name, qa.row_scales, a.rows, nb, qa.scales_row_stride, sizeof(float), &ers)
                          : extent_of(scales_name, qa.row_scales, nb, a.rows, qa.scales_block_stride, sizeof(float), &ers));
  }
  RMSNORM_TRY(vector_extent("quant.scale_ub", qa.scale_ub, 1, sizeof(float), &eub));
  RMSNORM_TRY(check_memory_space({&ex, &eq, &ew, &er, &es, &ers, &eub, &eres, &eh}, c));
  // h may be x or residual exactly, and x may be residual exactly (rmsnorm_add_forward's rules); every other
  // output is disjoint from every other operand.
  if (add) {
    if (!same_view(eres, ex) && overlaps(eres, ex))
      return fail(RMSNORM_STATUS_OVERLAP, "residual", "overlaps x (only residual == x with equal row strides)");
    for (const Extent* in : {&ex, &eres}) {
      if (!same_view(eh, *in) && overlaps(eh, *in))
        return fail(RMSNORM_STATUS_OVERLAP, "h",
                    std::string("overlaps ") + in->name + " (only h == x or h == residual with equal row strides)");
    }
    for (const Extent* other : {&ew, &es, &eub}) RMSNORM_TRY(check_overlap(eh, *other));
  }
  for (const Extent* other : {&ex, &ew, &er, &es, &ers, &eub, &eres, &eh}) RMSNORM_TRY(check_overlap(eq, *other));
  for (const Extent* other : {&ex, &ew, &es, &ers, &eub, &eres, &eh}) RMSNORM_TRY(check_overlap(er, *other));
  for (const Extent* other : {&ex, &ew, &es, &eub, &eres, &eh}) RMSNORM_TRY(check_overlap(ers, *other));
  if (!c.cuda) return cpu::forward_quant(a, qa, cpu_threads(c.threads));
#if defined(RMSNORM_WITH_CUDA)
  return cuda::forward_quant(a, qa, c.device, c.stream);
#else
  return fail(RMSNORM_STATUS_INTERNAL_ERROR, "backend", "unreachable");
#endif
}

// rmsnorm_quant_t's rules into qa; `rows` for the rule that row_scales is needed only with rows (cols unused: the
// signature is read_block_quant's, for quant_entry).
static rmsnorm_status_t read_quant(const rmsnorm_quant_t* quant, int64_t rows, int64_t, QuantArgs* qa) {
  if (quant == nullptr) return fail(RMSNORM_STATUS_NULL_POINTER, "quant", "must not be NULL");
  if (quant->kind != RMSNORM_QUANT_FP8_E4M3 && quant->kind != RMSNORM_QUANT_INT8)
    return fail(RMSNORM_STATUS_INVALID_OPTION, "quant.kind", "unknown kind " + num(quant->kind));
  if (quant->scale_mode != RMSNORM_QUANT_STATIC && quant->scale_mode != RMSNORM_QUANT_PER_ROW)
    return fail(RMSNORM_STATUS_INVALID_OPTION, "quant.scale_mode", "unknown mode " + num(quant->scale_mode));
  qa->fp8 = quant->kind == RMSNORM_QUANT_FP8_E4M3;
  qa->per_row = quant->scale_mode == RMSNORM_QUANT_PER_ROW;
  // Each mode reads one of the two pointers; the other is ignored (not checked), as rmsnorm.h says.
  qa->scale = qa->per_row ? nullptr : quant->scale;
  qa->row_scales = qa->per_row ? quant->row_scales : nullptr;
  qa->scale_ub = quant->scale_ub;
  if (!qa->per_row && qa->scale == nullptr)
    return fail(RMSNORM_STATUS_NULL_POINTER, "quant.scale", "must not be NULL with RMSNORM_QUANT_STATIC");
  if (qa->scale_ub != nullptr && !(qa->per_row && qa->fp8))
    return fail(RMSNORM_STATUS_INVALID_OPTION, "quant.scale_ub", "is only for fp8 with per-row scales");
  if (rows > 0 && qa->per_row && qa->row_scales == nullptr)
    return fail(RMSNORM_STATUS_NULL_POINTER, "quant.row_scales", "must not be NULL with RMSNORM_QUANT_PER_ROW");
  return RMSNORM_STATUS_SUCCESS;
}

// rmsnorm_block_quant_t's rules into qa (per_row set, block_cols > 0).
static rmsnorm_status_t read_block_quant(const rmsnorm_block_quant_t* quant, int64_t rows, int64_t cols,
                                         QuantArgs* qa) {
  if (quant == nullptr) return fail(RMSNORM_STATUS_NULL_POINTER, "quant", "must not be NULL");
  if (quant->kind != RMSNORM_QUANT_FP8_E4M3 && quant->kind != RMSNORM_QUANT_INT8)
    return fail(RMSNORM_STATUS_INVALID_OPTION, "quant.kind", "unknown kind " + num(quant->kind));
  if (quant->block_cols != 64 && quant->block_cols != 128)
    return fail(RMSNORM_STATUS_INVALID_OPTION, "quant.block_cols", "must be 64 or 128, not " + num(quant->block_cols));
  qa->fp8 = quant->kind == RMSNORM_QUANT_FP8_E4M3;
  qa->per_row = true;
  qa->block_cols = quant->block_cols;
  qa->row_scales = quant->scales;
  qa->scales_row_stride = quant->scales_row_stride;
  qa->scales_block_stride = quant->scales_block_stride;
  qa->scale_ub = quant->scale_ub;
  if (qa->scale_ub != nullptr && !qa->fp8)
    return fail(RMSNORM_STATUS_INVALID_OPTION, "quant.scale_ub", "is only for fp8");
  if (rows <= 0 || cols <= 0) return RMSNORM_STATUS_SUCCESS;
  if (qa->row_scales == nullptr) return fail(RMSNORM_STATUS_NULL_POINTER, "quant.scales", "must not be NULL");
  const int64_t nb = (cols + qa->block_cols - 1) / qa->block_cols;
  const int64_t rs = qa->scales_row_stride, bs = qa->scales_block_stride;
  if (!((bs == 1 && rs >= nb) || (rs == 1 && bs >= rows)))
    return fail(RMSNORM_STATUS_INVALID_STRIDE, "quant.scales",
                "strides (row " + num(rs) + ", block " + num(bs) + ") are neither row-major (block stride 1, row stride >= " +
                    num(nb) + ") nor column-major (row stride 1, block stride >= " + num(rows) + ")");
  return RMSNORM_STATUS_SUCCESS;
}

// The entry points: the problem and backend checked, the quant struct read (Read), then forward_quant_run.
// (A template: C++ linkage inside this extern "C" block.)
extern "C++" {
template <typename Q, typename Read>
static rmsnorm_status_t quant_entry(const rmsnorm_problem_t* problem, const rmsnorm_backend_t* backend, const Q* quant,
                                    Read&& read, const void* x, int64_t x_row_stride, const void* residual,
                                    int64_t residual_row_stride, const void* weight, void* h, int64_t h_row_stride,
                                    void* q, int64_t q_row_stride, float* rstd, const char* names, bool is_add) {
  clear_last_error();
  Common c;
  RMSNORM_TRY(check_problem_and_backend(problem, backend, &c));
  RMSNORM_TRY(check_y_dtype(c, false, names));
  RMSNORM_TRY(check_residual_f32(c, false, names));
  QuantArgs qa;
  RMSNORM_TRY(read(quant, problem->rows, problem->cols, &qa));
  if (problem->rows == 0) return RMSNORM_STATUS_SUCCESS;
  // The add forms' residual and h (forward_quant_run takes a null residual as the form without the add).
  if (is_add && (residual == nullptr || h == nullptr))
    return fail(RMSNORM_STATUS_NULL_POINTER, residual == nullptr ? "residual" : "h", "must not be NULL");
  qa.q = q;
  qa.q_stride = q_row_stride;
  return forward_quant_run(problem, c, x, x_row_stride, residual, residual_row_stride, weight, h, h_row_stride, qa,
                           rstd);
}
}  // extern "C++"

static const char kRowQuantNames[] = "rmsnorm_forward_quant and rmsnorm_add_forward_quant";
static const char kBlockQuantNames[] = "rmsnorm_forward_block_quant and rmsnorm_add_forward_block_quant";

rmsnorm_status_t rmsnorm_forward_quant(const rmsnorm_problem_t* problem, const void* x, int64_t x_row_stride,
                                       const void* weight, const rmsnorm_quant_t* quant, void* q, int64_t q_row_stride,
                                       float* rstd, const rmsnorm_backend_t* backend) {
  return guarded([&] {
    return quant_entry(problem, backend, quant, read_quant, x, x_row_stride, nullptr, 0, weight, nullptr, 0, q,
                       q_row_stride, rstd, kRowQuantNames, false);
  });
}

rmsnorm_status_t rmsnorm_forward_block_quant(const rmsnorm_problem_t* problem, const void* x, int64_t x_row_stride,
                                             const void* weight, const rmsnorm_block_quant_t* quant, void* q,
                                             int64_t q_row_stride, float* rstd, const rmsnorm_backend_t* backend) {
  return guarded([&] {
    return quant_entry(problem, backend, quant, read_block_quant, x, x_row_stride, nullptr, 0, weight, nullptr, 0, q,
                       q_row_stride, rstd, kBlockQuantNames, false);
  });
}

rmsnorm_status_t rmsnorm_add_forward_block_quant(const rmsnorm_problem_t* problem, const void* x, int64_t x_row_stride,
                                                 const void* residual, int64_t residual_row_stride, const void* weight,
                                                 void* h, int64_t h_row_stride, const rmsnorm_block_quant_t* quant,
                                                 void* q, int64_t q_row_stride, float* rstd,
                                                 const rmsnorm_backend_t* backend) {
  return guarded([&] {
    return quant_entry(problem, backend, quant, read_block_quant, x, x_row_stride, residual, residual_row_stride,
                       weight, h, h_row_stride, q, q_row_stride, rstd, kBlockQuantNames, true);
  });
}

rmsnorm_status_t rmsnorm_add_forward_quant(const rmsnorm_problem_t* problem, const void* x, int64_t x_row_stride,
                                           const void* residual, int64_t residual_row_stride, const void* weight,
                                           void* h, int64_t h_row_stride, const rmsnorm_quant_t* quant, void* q,
                                           int64_t q_row_stride, float* rstd, const rmsnorm_backend_t* backend) {
  // With no rows nothing is read or written (as in rmsnorm_add_forward).
  return guarded([&] {
    return quant_entry(problem, backend, quant, read_quant, x, x_row_stride, residual, residual_row_stride, weight,
                       h, h_row_stride, q, q_row_stride, rstd, kRowQuantNames, true);
  });
}

rmsnorm_status_t rmsnorm_backward_workspace_size(const rmsnorm_problem_t* problem, int32_t gw_mode,
                                                 const rmsnorm_backend_t* backend, size_t* bytes) {
  return guarded([&] {
    clear_last_error();
    if (bytes == nullptr) return fail(RMSNORM_STATUS_NULL_POINTER, "bytes", "must not be NULL");
    Common c;
    RMSNORM_TRY(check_problem_and_backend(problem, backend, &c));
    RMSNORM_TRY(check_y_dtype(c, true, "rmsnorm_backward_workspace_size"));
    RMSNORM_TRY(check_residual_f32(c, true, "rmsnorm_backward_workspace_size"));
    if (!valid_gw_mode(gw_mode))
      return fail(RMSNORM_STATUS_INVALID_OPTION, "gw_mode", "unknown mode " + num(gw_mode));
    return workspace_size_impl(problem, gw_mode, c, bytes);
  });
}

// rmsnorm_backward, and with is_add rmsnorm_add_backward[_x] (g_h required where there are rows).
static rmsnorm_status_t backward_entry(const rmsnorm_problem_t* problem, const void* x, int64_t x_row_stride,
                                       const void* weight, const void* gy, int64_t gy_row_stride, const float* rstd,
                                       const void* g_h, int64_t g_h_row_stride, void* gx, int64_t gx_row_stride,
                                       void* gw, int32_t gw_mode, void* workspace, size_t workspace_bytes,
                                       const rmsnorm_backend_t* backend, bool is_add, void* gx_x = nullptr,
                                       int64_t gx_x_row_stride = 0, bool with_gx_x = false) {
  clear_last_error();
  Common c;
  RMSNORM_TRY(check_problem_and_backend(problem, backend, &c));
  RMSNORM_TRY(check_y_dtype(c, !is_add, "rmsnorm_add_backward"));
  RMSNORM_TRY(check_residual_f32(c, is_add, "rmsnorm_backward"));
  if (with_gx_x && !c.residual_f32)
    return fail(RMSNORM_STATUS_INVALID_OPTION, "flags",
                "rmsnorm_add_backward_x needs RMSNORM_FLAG_RESIDUAL_F32 (without it x's gradient is gx itself)");
  // The fp32 residual stream's backward: h, g_h and gx are float, gy and the weight stay in x's dtype T. It runs
  // as the fp32 problem with gy in T (y_dtype) and the weight in T (weight_dtype).
  const DType weight_dtype = c.weight_dtype;
  if (c.residual_f32) {
    c.y_dtype = c.dtype;
    c.ysize = c.esize;
    c.dtype = DType::kF32;
    c.esize = sizeof(float);
  }
  if (!valid_gw_mode(gw_mode)) return fail(RMSNORM_STATUS_INVALID_OPTION, "gw_mode", "unknown mode " + num(gw_mode));

  // Built once; everything below validates these fields, then hands them over.
  BackwardArgs a;
  set_problem_fields(*problem, c, &a);
  a.x = x;
  a.x_stride = x_row_stride;
  a.weight = weight;
  a.gy = gy;
  a.gy_stride = gy_row_stride;
  a.rstd = rstd;
  a.gx = gx;
  a.gx_stride = gx_row_stride;
  a.g_h = g_h;
  a.g_h_stride = g_h_row_stride;
  a.gx_x = gx_x;
  a.gx_x_stride = gx_x_row_stride;
  a.gw_mode = static_cast<GwMode>(gw_mode);
  // gw in the weight's dtype: fp32 with RMSNORM_FLAG_WEIGHT_F32.
  if (c.weight_f32 && a.gw_mode == GwMode::kStore) a.gw_mode = GwMode::kStoreF32;
  if (c.weight_f32 && a.gw_mode == GwMode::kAccumulate) a.gw_mode = GwMode::kAccumulateF32;
  a.gw = a.gw_mode == GwMode::kNone ? nullptr : gw;
  a.workspace = workspace;
  a.workspace_bytes = workspace_bytes;
  a.weight_dtype = static_cast<int32_t>(weight_dtype);
  const size_t gw_esize = gw_elem_size(a.gw_mode, weight_dtype);

  if (a.gw_mode != GwMode::kNone) {
    if (a.weight == nullptr)
      return fail(RMSNORM_STATUS_NULL_POINTER, "weight", "must not be NULL when gw_mode is not RMSNORM_GW_NONE");
    RMSNORM_TRY(check_pointer("gw", a.gw, gw_esize));
  }
  // With no rows, x, gy, rstd and gx are never read or written, so they are not checked.
  const bool rows_present = a.rows > 0;
  if (rows_present) {
    if (is_add && a.g_h == nullptr)
      return fail(RMSNORM_STATUS_NULL_POINTER, "g_h", "must not be NULL (rmsnorm_backward is the form without it)");
    RMSNORM_TRY(check_pointer("x", a.x, c.esize));
    RMSNORM_TRY(check_pointer("gy", a.gy, c.ysize));
    RMSNORM_TRY(check_pointer("gx", a.gx, c.esize));
    RMSNORM_TRY(check_optional_pointer("rstd", a.rstd, sizeof(float)));
    RMSNORM_TRY(check_stride("x_row_stride", a.x_stride, a.cols));
    RMSNORM_TRY(check_stride("gy_row_stride", a.gy_stride, a.cols));
    RMSNORM_TRY(check_stride("gx_row_stride", a.gx_stride, a.cols));
    if (a.g_h != nullptr) RMSNORM_TRY(check_stride("g_h_row_stride", a.g_h_stride, a.cols));
    if (with_gx_x) {
      RMSNORM_TRY(check_pointer("gx_x", a.gx_x, c.ysize));
      RMSNORM_TRY(check_stride("gx_x_row_stride", a.gx_x_stride, a.cols));
    }
  } else {
    a.gx_x = nullptr;  // no rows: not touched
  }
  RMSNORM_TRY(check_optional_pointer("weight", a.weight, c.wsize));

  size_t needed = 0;
  RMSNORM_TRY(workspace_size_impl(problem, gw_mode, c, &needed));
  if (needed > 0) {
    if (a.workspace == nullptr)
      return fail(RMSNORM_STATUS_NULL_POINTER, "workspace", "must not be NULL (" + std::to_string(needed) +
                                                                 " bytes needed)");
    if (a.workspace_bytes < needed)
      return fail(RMSNORM_STATUS_WORKSPACE_TOO_SMALL, "workspace",
                  std::to_string(a.workspace_bytes) + " bytes given, " + std::to_string(needed) + " needed");
    RMSNORM_TRY(check_pointer("workspace", a.workspace, 16));
  }

  if (a.g_h != nullptr && rows_present) RMSNORM_TRY(check_pointer("g_h", a.g_h, c.esize));
  Extent ex, egy, egx, ew, er, egw, ews, egh, egxx;
  RMSNORM_TRY(extent_of("x", rows_present ? a.x : nullptr, a.rows, a.cols, a.x_stride, c.esize, &ex));
  RMSNORM_TRY(extent_of("gy", rows_present ? a.gy : nullptr, a.rows, a.cols, a.gy_stride, c.ysize, &egy));
  RMSNORM_TRY(extent_of("gx", rows_present ? a.gx : nullptr, a.rows, a.cols, a.gx_stride, c.esize, &egx));
  RMSNORM_TRY(vector_extent("weight", a.weight, a.cols, c.wsize, &ew));
  RMSNORM_TRY(vector_extent("rstd", rows_present ? a.rstd : nullptr, a.rows, sizeof(float), &er));
  RMSNORM_TRY(vector_extent("gw", a.gw, a.cols, gw_esize, &egw));
  // The backends touch the first `needed` bytes only, so a larger capacity is not held against the caller.
  if (needed > static_cast<size_t>(std::numeric_limits<int64_t>::max()))
    return fail(RMSNORM_STATUS_INVALID_SHAPE, "workspace", std::to_string(needed) + " bytes overflow int64");
  RMSNORM_TRY(vector_extent("workspace", needed > 0 ? a.workspace : nullptr, static_cast<int64_t>(needed), 1, &ews));
  RMSNORM_TRY(extent_of("g_h", rows_present ? a.g_h : nullptr, a.rows, a.cols, a.g_h_stride, c.esize, &egh));
  RMSNORM_TRY(extent_of("gx_x", a.gx_x, a.rows, a.cols, a.gx_x_stride, c.ysize, &egxx));
  RMSNORM_TRY(check_memory_space({&ex, &egy, &egx, &ew, &er, &egw, &ews, &egh, &egxx}, c));
  for (const Extent* other : {&ex, &egy, &egx, &ew, &er, &egw, &ews, &egh}) RMSNORM_TRY(check_overlap(egxx, *other));
  // gx may be g_h exactly (the residual stream's gradient updated in place); g_h overlaps no other operand.
  if (!same_view(egx, egh) && overlaps(egx, egh))
    return fail(RMSNORM_STATUS_OVERLAP, "gx", "overlaps g_h (only gx == g_h with equal row strides is allowed)");
  for (const Extent* other : {&ex, &egy, &ew, &er, &egw, &ews}) RMSNORM_TRY(check_overlap(egh, *other));
  // gx may alias gy exactly (in place) when they have one dtype; every other output must be disjoint.
  if ((!same_view(egx, egy) || c.y_dtype != c.dtype) && overlaps(egx, egy))
    return fail(RMSNORM_STATUS_OVERLAP, "gx",
                "overlaps gy (only gx == gy with equal row strides and dtypes is allowed)");
  for (const Extent* in : {&ex, &ew, &er}) RMSNORM_TRY(check_overlap(egx, *in));
  for (const Extent* other : {&ex, &ew, &er, &egy, &egx}) RMSNORM_TRY(check_overlap(egw, *other));
  for (const Extent* other : {&ex, &ew, &er, &egy, &egx, &egw}) RMSNORM_TRY(check_overlap(ews, *other));

  if (!c.cuda) return cpu::backward(a, cpu_threads(c.threads));
#if defined(RMSNORM_WITH_CUDA)
  return cuda::backward(a, c.device, c.stream);
#else
  return fail(RMSNORM_STATUS_INTERNAL_ERROR, "backend", "unreachable");
#endif
}


rmsnorm_status_t rmsnorm_backward(const rmsnorm_problem_t* problem, const void* x, int64_t x_row_stride,
                                  const void* weight, const void* gy, int64_t gy_row_stride, const float* rstd,
                                  void* gx, int64_t gx_row_stride, void* gw, int32_t gw_mode, void* workspace,
                                  size_t workspace_bytes, const rmsnorm_backend_t* backend) {
  return guarded([&] {
    return backward_entry(problem, x, x_row_stride, weight, gy, gy_row_stride, rstd, nullptr, 0, gx, gx_row_stride,
                          gw, gw_mode, workspace, workspace_bytes, backend, false);
  });
}

rmsnorm_status_t rmsnorm_add_backward(const rmsnorm_problem_t* problem, const void* h, int64_t h_row_stride,
                                      const void* weight, const void* gy, int64_t gy_row_stride, const float* rstd,
                                      const void* g_h, int64_t g_h_row_stride, void* gx, int64_t gx_row_stride,
                                      void* gw, int32_t gw_mode, void* workspace, size_t workspace_bytes,
                                      const rmsnorm_backend_t* backend) {
  return guarded([&] {
    return backward_entry(problem, h, h_row_stride, weight, gy, gy_row_stride, rstd, g_h, g_h_row_stride, gx,
                          gx_row_stride, gw, gw_mode, workspace, workspace_bytes, backend, true);
  });
}

rmsnorm_status_t rmsnorm_add_backward_x(const rmsnorm_problem_t* problem, const void* h, int64_t h_row_stride,
                                        const void* weight, const void* gy, int64_t gy_row_stride, const float* rstd,
                                        const void* g_h, int64_t g_h_row_stride, void* gx, int64_t gx_row_stride,
                                        void* gx_x, int64_t gx_x_row_stride, void* gw, int32_t gw_mode,
                                        void* workspace, size_t workspace_bytes, const rmsnorm_backend_t* backend) {
  return guarded([&] {
    return backward_entry(problem, h, h_row_stride, weight, gy, gy_row_stride, rstd, g_h, g_h_row_stride, gx,
                          gx_row_stride, gw, gw_mode, workspace, workspace_bytes, backend, true, gx_x,
                          gx_x_row_stride, true);
  });
}

}  // extern "C"
