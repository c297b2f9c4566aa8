#!/usr/bin/env bash
# Builds here, without a GPU, every target that scripts/gpu_check.sh runs on the GPU machine, small enough for the
# device tool to carry (64 MiB in all), so that the GPU call spends no time building:
#
#   scripts/prebuild.sh [DIR]          (default .carry/gbuild; the working tree as it is)
#
# SRC=TREE builds that source tree instead (scripts/gpu_ab.sh prebuild: an exported revision) and TARGETS="..."
# only those targets.
#
# then, in the device call (carry [".carry/gbuild"]):
#
#   BUILD_DIR=.carry/gbuild STEPS="env ctest memcheck racecheck initcheck synccheck cli bench summarize" \
#     RMSNORM_COMMIT=... bash scripts/gpu_check.sh
#
# The device copy of the working tree lies at the same absolute path as this one, so the CTest files' paths (and the
# binaries' RPATH) hold there. Device code for sm_90 only (no PTX), without source line tables (compute-sanitizer
# then reports no source lines: rebuild with line tables to read one), the fatbinaries compressed for size, the
# binaries stripped and the objects and CMake's scratch removed. The code is the same as a default build's (line
# tables and compression change neither the SASS nor the launch); the GPU tests run in CI only as far as "they
# compile", so the device call is where they are checked.
# SHARED=ON (the default): the library is built as one shared library with every symbol visible
# (RMSNORM_SHARED_INTERNAL, CMakeLists.txt) that the tests, the CLI and the benchmark load, so the kernels are in the
# tree once: 15 MB at 3badf2a, 5.6 minutes on 2 cores (a ctest run here over it: 240 tests, the GPU ones skipped),
# which leaves room for the A/B sides of scripts/gpu_ab.sh in the same call's carry. The processes then hold two
# copies of the CUDA runtime (the library's static one and the test's), as the PyTorch extension does beside
# PyTorch's. SHARED=OFF: each binary links the static library and holds every kernel (about 7 MB each, near the
# device tool's 64 MiB with the drops below).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

dir="${1:-.carry/gbuild}"
src="${SRC:-.}"
rm -rf "$dir"
cmake -S "$src" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90-real \
  -DCMAKE_CUDA_FLAGS="--compress-mode=size" -DRMSNORM_LINEINFO=OFF -DRMSNORM_SHARED_INTERNAL="${SHARED:-ON}" >/dev/null
# shellcheck disable=SC2086  # TARGETS: target names, split on spaces
cmake --build "$dir" -j "${JOBS:-2}" ${TARGETS:+--target $TARGETS}
# What ctest and the steps need: the executables, the shared libraries (the export tests read them), the CTest
# files and the discovered test lists. The static libraries and objects go; the executables are stripped.
find "$dir" \( -name '*.o' -o -name '*.a' \) -delete
find "$dir" -depth -type d -name CMakeFiles -exec rm -rf {} +
find "$dir" -type f -perm -u+x -size +1M ! -name '*.so*' -exec strip {} +
find "$dir" -type f -name '*.so*' -size +1M -exec strip --strip-unneeded {} +
# Left out: what no gpu_check step runs. The diagnostic probes (bench/copy_probe.cu, bench/pdl_probe.cu); the test
# binaries that read no GPU and run in CI (the CPU backend's, the planner's, the host 16-bit conversions' and the
# test harness's: gpu_check leaves their tests out of a prebuilt tree that lacks them); and the public shared
# library, which only the symbol-export tests read (left out of a prebuilt tree too: their CTest files name this
# machine's cmake), where the tools load the internal one.
rm -f "$dir/rmsnorm_copy_probe" "$dir/rmsnorm_pdl_probe"
rm -f "$dir/tests/rmsnorm_cpu_test" "$dir/tests/rmsnorm_plan_test" "$dir/tests/rmsnorm_half_test"
rm -f "$dir/tests/rmsnorm_harness_test"
if [ -e "$dir/librmsnorm_internal.so" ]; then rm -f "$dir"/librmsnorm.so*; fi
# PREBUILD_REVISION marks a prebuilt tree for gpu_check (which then leaves out the host-only tests removed above): the
# revision of SRC where it is the top of a git work tree, else SRC's path (scripts/gpu_ab.sh: an exported revision).
if [ "$(git -C "$src" rev-parse --show-toplevel 2>/dev/null)" = "$(cd "$src" && pwd -P)" ]; then
  git -C "$src" rev-parse --short HEAD >"$dir/PREBUILD_REVISION"
  if [ -n "$(git -C "$src" status --porcelain --untracked-files=no | head -n 1)" ]; then
    echo "(with uncommitted changes)" >>"$dir/PREBUILD_REVISION"
  fi
else
  echo "$src" >"$dir/PREBUILD_REVISION"
fi
echo "built $(tr '\n' ' ' <"$dir/PREBUILD_REVISION")into $dir: $(du -sh "$dir" | cut -f1)"
