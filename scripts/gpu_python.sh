#!/usr/bin/env bash
# The PyTorch package on a GPU machine, from the repository root:
#
#   OUT=/some/dir bash scripts/gpu_python.sh        (OUT defaults to ./gpu_out)
#
# 1. builds and installs the package with the CUDA backend against the installed torch
#    (pip install --no-build-isolation --no-deps: nothing is fetched; the build folder build-python/ is kept, so
#    a second run on a warm machine rebuilds only what changed);
# 2. checks that the extension has CUDA and sees the GPU;
# 3. runs the pytest suite, GPU tests included, with a junit report in $OUT/pytest.xml;
# 4. with BENCH=1, runs bench/torch_ops_bench.py (JSON and PNG under $OUT). Liger's RMSNorm is timed when
#    liger_kernel imports: carry its wheel in .whl/ and this script installs it into /tmp/site first.
# 5. with FUSED_BENCH=1, runs bench/fused_bench.py ($OUT/fused.json; FUSED_ARGS, e.g. "--quick").
#
# WHEEL=PATH (a wheel from scripts/prebuild_wheel.sh, carried in .carry/) installs that wheel instead of step 1's
# build, which takes about 220 s of device time on 16 cores; the script checks that it has the CUDA backend and that
# its _autograd.so loads (built against this very torch), and builds from the tree as in step 1 if either fails.
#
# scripts/gpu_check.sh runs this as its `python` step. Knobs: JOBS (16), PYTEST (1; 0 skips the tests),
# PYTEST_ARGS (shell words, e.g. "-x -k 'cuda and not slow'"), BENCH (0), BENCH_ARGS (e.g. "--quick"), RMSNORM_COMMIT. The benchmark after the
# tests may not fit in one 10-minute call; then run it alone on the warm machine:
#   PYTEST=0 BENCH=1 bash scripts/gpu_python.sh
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
OUT="${OUT:-./gpu_out}"
mkdir -p "$OUT" || exit 2
OUT="$(cd "$OUT" && pwd)"
export CMAKE_BUILD_PARALLEL_LEVEL="${JOBS:-16}"

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi

python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'devices', torch.cuda.device_count())" ||
  exit 1
python3 -m pip list 2>/dev/null | grep -i -E '^(scikit-build-core|transformers|liger-kernel|matplotlib|pytest) '

installed=0
if [ -n "${WHEEL:-}" ]; then
  echo "== pip install $WHEEL (prebuilt: $(cat "$(dirname "$WHEEL")/PREBUILD_REVISION" 2>/dev/null | tr '\n' ' '))"
  # The prebuilt wheel must be what a build here would give: the CUDA backend, and the C++ autograd node loaded
  # (rmsnorm.cpp_autograd: _build_info.TORCH_VERSION is this torch's), or the host-cost figures would time the
  # Python Function instead.
  if python3 -m pip install -q --no-index --no-deps --force-reinstall "$WHEEL" &&
    (cd /tmp && python3 -c "
import torch, rmsnorm
assert rmsnorm.cuda_built(), 'no CUDA backend in the wheel'
assert rmsnorm.cpp_autograd, 'the wheel was built against torch %s, this is %s' % (rmsnorm._build_info.TORCH_VERSION, torch.__version__)
print('prebuilt wheel: CUDA backend and C++ autograd loaded')"); then
    installed=1
  else
    echo "the prebuilt wheel is not usable here; building from the tree"
  fi
fi
if [ "$installed" = 0 ]; then
  echo "== pip install (CUDA backend, sm_90)"
  t0=$(date +%s)
  python3 -m pip install --no-build-isolation --no-deps --force-reinstall -v . || { echo "pip install failed"; exit 1; }
  echo "pip install: $(($(date +%s) - t0)) s"
fi

# From another folder, so that nothing in the tree shadows the installed package.
(cd /tmp && python3 -c "
import torch, rmsnorm
assert torch.cuda.is_available(), 'torch sees no GPU'
assert rmsnorm.cuda_built(), 'the extension was built without its CUDA backend (nvcc or CUDA torch missing at build time?)'
print('rmsnorm', rmsnorm.__file__, 'CUDA backend: yes')") || exit 1

rc=0
if [ "${PYTEST:-1}" = 1 ]; then
  echo "== pytest"
  # PYTEST_ARGS is parsed as shell words, so quoted arguments stay whole: PYTEST_ARGS="-k 'autograd or ops'".
  eval "pytest_args=(${PYTEST_ARGS:-})"
  python3 -m pytest -q -ra python/tests --junitxml "$OUT/pytest.xml" "${pytest_args[@]}" || rc=$?
fi

if [ "${BENCH:-0}" = 1 ]; then
  echo "== bench/torch_ops_bench.py"
  # shellcheck disable=SC2086
  python3 bench/torch_ops_bench.py --json "$OUT/torch_ops.json" --png "$OUT/torch_ops.png" \
    --commit "${RMSNORM_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}" ${BENCH_ARGS:-} || rc=1
fi
if [ "${FUSED_BENCH:-0}" = 1 ]; then
  echo "== bench/fused_bench.py"
  # shellcheck disable=SC2086
  (cd bench && python3 fused_bench.py --json "$OUT/fused.json" \
    --commit "${RMSNORM_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}" ${FUSED_ARGS:-}) || rc=1
fi
exit "$rc"
