#!/usr/bin/env bash
# Builds here, without a GPU, the PyTorch package's wheel with the CUDA backend (sm_90), so that the GPU call of
# scripts/gpu_python.sh installs it instead of building (about 220 s of the device's time on its 16 cores; here
# about 15 minutes on 2):
#
#   PYTHON=/path/to/python scripts/prebuild_wheel.sh [DIR]      (default .carry/pywheel; the working tree as it is)
#
# PYTHON must import the torch the GPU machine has, the same version string (2.11.0+cu130 there): the C++ autograd
# node (_autograd.so) uses torch's regular C++ API and is loaded only under the torch it was built against. _ops.so
# uses only the stable ABI and would run on any torch >= 2.10. Such a torch, in a virtual environment:
#
#   python3 -m venv /tmp/t211 && /tmp/t211/bin/pip install torch==2.11.0 scikit-build-core numpy
#
# then, in the device call (carry [".carry/pywheel", ".whl"]):
#
#   WHEEL=$(ls .carry/pywheel/*.whl) PYTEST=1 BENCH=1 RMSNORM_COMMIT=... bash scripts/gpu_python.sh
#
# Device code for sm_90 only, without line tables, compressed for size, as scripts/prebuild.sh builds it (the same
# SASS as a default build).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

dir="${1:-.carry/pywheel}"
py="${PYTHON:-python3}"
"$py" -c "import torch; assert torch.version.cuda, 'this torch has no CUDA: the wheel would have no CUDA backend'
print('building against torch', torch.__version__)"
rm -rf "$dir"
mkdir -p "$dir"
build="$(mktemp -d)"
trap 'rm -rf "$build"' EXIT
CMAKE_BUILD_PARALLEL_LEVEL="${JOBS:-2}" "$py" -m pip wheel . --no-build-isolation --no-deps -w "$dir" \
  -Cbuild-dir="$build" -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90-real -Ccmake.define.RMSNORM_LINEINFO=OFF \
  -Ccmake.define.CMAKE_CUDA_FLAGS=--compress-mode=size
git rev-parse --short HEAD >"$dir/PREBUILD_REVISION"
if [ -n "$(git status --porcelain --untracked-files=no | head -n 1)" ]; then echo "(with uncommitted changes)" >>"$dir/PREBUILD_REVISION"; fi
echo "built $(tr '\n' ' ' <"$dir/PREBUILD_REVISION")into $dir: $(du -sh "$dir" | cut -f1)"
