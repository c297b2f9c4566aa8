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
# The device copy of the working tree lies at the same absolute path as this one, so the CTest files' paths hold
# there. Device code for sm_90 only (no PTX), without source line tables (compute-sanitizer then reports no source
# lines: rebuild with line tables to read one), the fatbinaries compressed for size, the binaries stripped and the
# objects and CMake's scratch removed: about 7 MB a binary instead of 65, 63 MiB in all at 9636c8f (a ctest run here
# over it: 335 tests, the GPU ones skipped). The code is the same as a default build's (line tables and
# compression change neither the SASS nor the launch). Takes about 8 minutes on 2 cores (7m47s at 9636c8f); the GPU tests run in
# CI only as far as "they compile", so the device call is where they are checked.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

dir="${1:-.carry/gbuild}"
src="${SRC:-.}"
rm -rf "$dir"
cmake -S "$src" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90-real \
  -DCMAKE_CUDA_FLAGS="--compress-mode=size" -DRMSNORM_LINEINFO=OFF >/dev/null
# shellcheck disable=SC2086  # TARGETS: target names, split on spaces
cmake --build "$dir" -j "${JOBS:-2}" ${TARGETS:+--target $TARGETS}
# What ctest and the steps need: the executables, the shared libraries (the export tests read them), the CTest
# files and the discovered test lists. The static libraries and objects go; the executables are stripped.
find "$dir" \( -name '*.o' -o -name '*.a' \) -delete
find "$dir" -depth -type d -name CMakeFiles -exec rm -rf {} +
find "$dir" -type f -perm -u+x -size +1M ! -name '*.so*' -exec strip {} +
find "$dir" -type f -name '*.so*' -size +1M -exec strip --strip-unneeded {} +
# The diagnostic probes (bench/copy_probe.cu, bench/pdl_probe.cu) are no gpu_check step's, and their 2 MB are what
# puts the tree plus the working tree over the device tool's 64 MiB.
rm -f "$dir/rmsnorm_copy_probe" "$dir/rmsnorm_pdl_probe"
# Nor is the CPU backend's test binary (7 MB; its tests read no GPU and run in CI): gpu_check leaves its tests out
# of a prebuilt tree that lacks it. With it the tree was 64.1 MiB at eab602c.
rm -f "$dir/tests/rmsnorm_cpu_test"
# Nor the planner's and the host 16-bit conversions' (0.8 and 0.6 MB, host only, run in CI): with them the tree
# plus the working tree was over 64 MiB at 6172cd9.
rm -f "$dir/tests/rmsnorm_plan_test" "$dir/tests/rmsnorm_half_test"
[ "$src" = . ] || exit 0  # the caller names what it built
git rev-parse --short HEAD >"$dir/PREBUILD_REVISION"
if [ -n "$(git status --porcelain --untracked-files=no | head -n 1)" ]; then echo "(with uncommitted changes)" >>"$dir/PREBUILD_REVISION"; fi
echo "built $(tr '\n' ' ' <"$dir/PREBUILD_REVISION")into $dir: $(du -sh "$dir" | cut -f1)"
