#!/usr/bin/env bash
# One-command GPU check, run from the repository root on a machine with a GPU:
#
#   OUT=/some/dir bash scripts/gpu_check.sh        (OUT defaults to ./gpu_out)
#
# Steps (each under its own `timeout`; a failing step is recorded and the
# script goes on):
#   env        nvidia-smi, nvcc, cmake, ninja, compute-sanitizer, torch versions
#   build      cmake -G Ninja Release, sm_90, into build-gpu; every target
#   ctest      all tests (the GPU ones run: there is a GPU), --timeout 600 each
#   memcheck, racecheck, initcheck, synccheck
#              compute-sanitizer over rmsnorm_cuda_test --gtest_filter='*Sanitizer*'
#   bench      build-gpu/rmsnorm_bench --json $OUT/bench.json
#   torch      python3 bench/torch_bench.py --json $OUT/torch.json
#   summarize  python3 bench/summarize.py -> $OUT/summary.md
#   cli        build-gpu/rmsnorm (the CLI's default run) --json $OUT/cli.json, then the fused and
#              mixed-dtype ops on the CUDA backend, each checked against the float64 reference
#   python     scripts/gpu_python.sh: pip install the PyTorch package with CUDA, pytest with the GPU
#              tests -> $OUT/pytest.xml. Not in the default STEPS (it builds the kernels again, for
#              the wheel): STEPS="env python" bash scripts/gpu_check.sh
# then a table of steps (PASS/FAIL, seconds) and summary.md.
#
# $OUT holds at most these files, no sub-folders (the device tool returns 8
# files): logs.txt (every step's output, one after another, with headers),
# bench.json, torch.json, summary.md, ctest.xml, cli.json, pytest.xml.
#
# Time: the whole script keeps within GPU_CHECK_BUDGET_S seconds (default 530,
# under the device tool's 10-minute command limit). Each step has a cap (CAP
# below), cut further when needed so that every later selected step keeps its
# minimum (MIN below). When everything does not fit in one call, run the steps
# in two calls (the build directory stays on a warm machine), e.g.
#   STEPS="build ctest memcheck racecheck initcheck synccheck" bash scripts/gpu_check.sh
#   STEPS="build bench torch summarize cli" bash scripts/gpu_check.sh
#
# Exit code: 0 only if build, ctest and the sanitizers passed (those of them
# that were selected), and the python step's tests when it was selected; the
# benchmark's targets are reported, never part of it.
#
# Knobs (environment): STEPS (all), BUILD_DIR (build-gpu), JOBS (16), CTEST_JOBS (8), SAN_FILTER (*Sanitizer*:
#   the sanitizer steps' gtest filter, e.g. CudaSanitizer.PairedForward for one case), SAN_PAR (4: sanitizer
#   cases run at once), SAN_BAND_S (120: the limit of one case under one tool, four sharing the GPU; 90 for racecheck),
# BUILD_TARGETS (all; e.g. "rmsnorm_cuda_test") and CTEST_REGEX (all; a ctest -R expression) for a short
# device budget: STEPS="build ctest" BUILD_TARGETS=rmsnorm_cuda_test CTEST_REGEX='Cuda\.Forward' (the
# tests of targets not built would fail as not found, so narrow both together; a selection of no test
# fails the step),
# BENCH_ARGS (e.g. "--quick"), TORCH_ARGS, GTEST_SRC (a googletest source tree
# to build when find_package(GTest) fails; default .carry/googletest),
# RMSNORM_COMMIT (recorded instead of git's commit).
# shellcheck disable=SC2016  # step bodies are single-quoted on purpose: the inner bash expands them
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
ROOT="$(pwd)"

OUT="${OUT:-./gpu_out}"
mkdir -p "$OUT" || exit 2
OUT="$(cd "$OUT" && pwd)"
LOG="$OUT/logs.txt"
: >"$LOG"

BUILD_DIR="${BUILD_DIR:-build-gpu}"
JOBS="${JOBS:-16}"
CTEST_JOBS="${CTEST_JOBS:-8}"
BENCH_ARGS="${BENCH_ARGS:-}"
TORCH_ARGS="${TORCH_ARGS:-}"
GTEST_SRC="${GTEST_SRC:-$ROOT/.carry/googletest}"
BUDGET="${GPU_CHECK_BUDGET_S:-530}"
START="$(date +%s)"
STATE="$(mktemp -d)"  # flags passed between steps (kept out of $OUT)
trap 'rm -rf "$STATE"' EXIT
BUILD_TARGETS="${BUILD_TARGETS:-}"
CTEST_REGEX="${CTEST_REGEX:-}"
export ROOT OUT BUILD_DIR JOBS CTEST_JOBS GTEST_SRC STATE BUILD_TARGETS CTEST_REGEX PYTHONUNBUFFERED=1

# The commit the results belong to; "-dirty" when the tree has changes, since
# such results cannot be traced to sources.
if [ -n "${RMSNORM_COMMIT:-}" ]; then
  COMMIT="$RMSNORM_COMMIT"
else
  COMMIT="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  if [ "$COMMIT" != unknown ] && [ -n "$(git status --porcelain 2>/dev/null | head -n 1)" ]; then
    COMMIT="$COMMIT-dirty"
  fi
fi
export COMMIT

SANITIZER="$(command -v compute-sanitizer || true)"
for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
  [ -z "$SANITIZER" ] && [ -x "$c" ] && SANITIZER="$c"
done
export SANITIZER

ALL_STEPS="env build ctest memcheck racecheck initcheck synccheck bench torch summarize cli python"
STEPS="${STEPS:-${ALL_STEPS% python}}"
# Seconds: the most a step may take, and the least it is left when earlier
# steps ran long. Caps are generous guesses (the build of every target on 16
# cores, the GPU test matrix on 8 ctest jobs, a sanitizer pass over the
# CudaSanitizer subset at its 10-100x slowdown); the minima add up to 320 s.
declare -A CAP=([env]=20 [build]=240 [ctest]=300 [memcheck]=90 [racecheck]=140 [initcheck]=60 [synccheck]=60
                [bench]=150 [torch]=100 [summarize]=15 [cli]=120 [python]=480)
declare -A MIN=([env]=5 [build]=60 [ctest]=45 [memcheck]=30 [racecheck]=30 [initcheck]=20 [synccheck]=20
                [bench]=20 [torch]=30 [summarize]=5 [cli]=15 [python]=120)
for s in $STEPS; do
  [ -n "${CAP[$s]:-}" ] || { echo "gpu_check: unknown step '$s' (steps: $ALL_STEPS)"; exit 2; }
done
selected() { [[ " $STEPS " == *" $1 "* ]]; }

declare -a STEP_NAMES=() STEP_RESULTS=() STEP_SECONDS=() STEP_LIMITS=()

# run_step NAME BODY
#   BODY: a bash snippet run under `timeout`. Its limit is CAP[NAME] seconds,
#   or less so that the MIN of every selected later step remains of the
#   budget. Result: PASS (exit 0), FAIL (other exit), TIMEOUT, SKIP (no time
#   left). A step not in STEPS is not run and not reported.
run_step() {
  local name="$1" body="$2"
  selected "$name" || return 0
  local now elapsed left limit rc result t0 t1 reserve=0 later=0 s
  for s in $ALL_STEPS; do
    if [ "$s" = "$name" ]; then later=1; continue; fi
    if [ "$later" = 1 ] && selected "$s"; then reserve=$((reserve + MIN[$s])); fi
  done
  now="$(date +%s)"
  elapsed=$((now - START))
  left=$((BUDGET - elapsed - reserve))
  limit=$((CAP[$name] < left ? CAP[$name] : left))
  # A step always gets its own minimum while the budget lasts, even when that
  # eats into the later steps' minima (they are cut in turn).
  if [ "$limit" -lt "${MIN[$name]}" ]; then
    limit=$((MIN[$name] < BUDGET - elapsed ? MIN[$name] : BUDGET - elapsed))
  fi
  {
    printf '\n===== %s (limit %ss, %ss into the run, %s UTC) =====\n' "$name" "$limit" "$elapsed" "$(date -u +%H:%M:%S)"
  } >>"$LOG"
  if [ "$limit" -lt 5 ]; then
    echo "no time left in the ${BUDGET}s budget" >>"$LOG"
    result=SKIP
    t0="$now"
    t1="$now"
  else
    printf '[%4ss] %-10s running (limit %ss)\n' "$elapsed" "$name" "$limit"
    t0="$(date +%s)"
    # The step runs in its own process group, and a timeout kills the whole
    # group: `timeout` alone signals only its child, so processes that child
    # started (ctest's test binaries) survived a cut step and shared the GPU
    # with the benchmark that followed (seen on 2026-11-30, run of 9801510).
    setsid bash -c "$body" >>"$LOG" 2>&1 &
    local pid=$! flag="$STATE/timeout_$name"
    # The watchdog's output goes nowhere and its sleep is killed with it: a sleep left running held the
    # script's stdout open, so a caller reading it (the device tool) waited out the last step's whole limit.
    (
      sleep "$limit"
      touch "$flag"
      kill -TERM -- "-$pid" 2>/dev/null
      sleep 10
      kill -KILL -- "-$pid" 2>/dev/null
    ) </dev/null >/dev/null 2>&1 &
    local watchdog=$!
    wait "$pid"
    rc=$?
    local sleeper
    sleeper="$(pgrep -P "$watchdog" 2>/dev/null || true)"
    kill "$watchdog" 2>/dev/null
    wait "$watchdog" 2>/dev/null
    # shellcheck disable=SC2086  # sleeper: pids, split on spaces
    [ -z "$sleeper" ] || kill $sleeper 2>/dev/null
    kill -KILL -- "-$pid" 2>/dev/null  # anything the step left behind
    t1="$(date +%s)"
    if [ -e "$flag" ]; then
      result=TIMEOUT
    elif [ "$rc" = 0 ]; then
      result=PASS
    else
      result="FAIL(rc=$rc)"
    fi
  fi
  printf -- '----- %s: %s in %ss\n' "$name" "$result" "$((t1 - t0))" >>"$LOG"
  STEP_NAMES+=("$name")
  STEP_RESULTS+=("$result")
  STEP_SECONDS+=("$((t1 - t0))")
  STEP_LIMITS+=("$limit")
}

# ---- (a) environment ---------------------------------------------------------------------------
run_step env '
  set -x
  uname -a
  nvidia-smi
  nvcc --version
  cmake --version | head -n 1
  ninja --version
  c++ --version | head -n 1
  echo "compute-sanitizer: ${SANITIZER:-not found}"
  [ -n "$SANITIZER" ] && "$SANITIZER" --version | tail -n 2
  python3 -c "import torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, torch.cuda.is_available())"
  echo "commit: $COMMIT"
  true'

# ---- (b) configure + build ---------------------------------------------------------------------
# find_package(GTest) may fail on a bare image: then build googletest from
# GTEST_SRC (carried with the tree) into a temporary prefix and configure
# again; failing that, configure without tests so that the benchmark and the
# CLI still build (the ctest step then fails, saying why).
run_step build '
  configure() {
    rm -f "$BUILD_DIR/CMakeCache.txt"
    cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 "$@"
  }
  if ! configure; then
    if [ -f "$GTEST_SRC/CMakeLists.txt" ]; then
      echo "configure failed; building googletest from $GTEST_SRC"
      cmake -S "$GTEST_SRC" -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF \
            -DCMAKE_INSTALL_PREFIX=/tmp/gtest-install -DCMAKE_POSITION_INDEPENDENT_CODE=ON &&
        cmake --build /tmp/gtest-build -j "$JOBS" && cmake --install /tmp/gtest-build
    fi
    if ! configure -DCMAKE_PREFIX_PATH=/tmp/gtest-install; then
      echo "configure failed again; configuring without tests (RMSNORM_BUILD_TESTS=OFF)"
      touch "$STATE/tests_disabled"
      configure -DRMSNORM_BUILD_TESTS=OFF || exit 1
    fi
  fi
  # -k 0: build every target that can be built, so one broken target does not
  # hide the others (the step still fails).
  # shellcheck disable=SC2086  # BUILD_TARGETS: target names, split on spaces
  cmake --build "$BUILD_DIR" -j "$JOBS" ${BUILD_TARGETS:+--target $BUILD_TARGETS} -- -k 0'

# ---- (c) tests ---------------------------------------------------------------------------------
run_step ctest '
  if [ -f "$STATE/tests_disabled" ]; then echo "tests were not built (configuring with tests failed: GTest missing, or a broken tests/CMakeLists.txt; see the build step)"; exit 1; fi
  [ -f "$BUILD_DIR/CTestTestfile.cmake" ] || { echo "no $BUILD_DIR/CTestTestfile.cmake: the build step failed"; exit 1; }
  # A tree from scripts/prebuild.sh names the building machine'"'"'s cmake (/usr/bin/cmake) in the two symbol-export
  # tests, which this machine lacks (CTest: "Not Run"); they read no GPU and run in CI, so they are left out here.
  exclude=""
  if [ -f "$BUILD_DIR/PREBUILD_REVISION" ]; then
    exclude="shared_library_exports_only_the_c_abi|export_check_catches_a_cxx_symbol"
    # scripts/prebuild.sh drops the CPU backend'"'"'s test binary (tests/cpu_test.cpp: its suites, no GPU read).
    [ -e "$BUILD_DIR/tests/rmsnorm_cpu_test" ] || exclude="$exclude|^(Cols/CpuProduct|Dtypes/CpuSweep|Cpu[A-Za-z]*)[.]"
    # So are the planner'"'"'s and the host 16-bit conversions'"'"' (tests/plan_test.cpp, half_test.cpp: host only).
    [ -e "$BUILD_DIR/tests/rmsnorm_plan_test" ] || exclude="$exclude|^Plan[.]"
    [ -e "$BUILD_DIR/tests/rmsnorm_half_test" ] || exclude="$exclude|^(Half[A-Za-z]*|[A-Za-z0-9_]*/HalfTest)[.]"
    [ -e "$BUILD_DIR/tests/rmsnorm_harness_test" ] || exclude="$exclude|^Harness[A-Za-z]*[.]"
    echo "prebuilt tree ($(head -n 1 "$BUILD_DIR/PREBUILD_REVISION")): leaving out $exclude (host tools, run in CI)"
  fi
  ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout 600 -j "$CTEST_JOBS" \
        --no-tests=error ${CTEST_REGEX:+-R "$CTEST_REGEX"} ${exclude:+-E "$exclude"} --output-junit "$OUT/ctest.xml"'

# ---- (d) compute-sanitizer ---------------------------------------------------------------------
# Over the CudaSanitizer suite (a subset of tests/cuda_test.cu that covers
# every dispatch band). A filter that matches no test passes vacuously under
# gtest, so "0 tests" is a failure here.
SAN_BODY='
  tool="$1"; shift
  exe="$BUILD_DIR/tests/rmsnorm_cuda_test"
  [ -n "$SANITIZER" ] || { echo "compute-sanitizer not found"; exit 1; }
  [ -x "$exe" ] || { echo "$exe was not built"; exit 1; }
  # One run per *Sanitizer* test (CudaSanitizer.RowsBand, .PersistentReuse, ..., CudaMixedSanitizer.*: the
  # list comes from the binary, suite and test names joined), each with its own time limit, so a slow one
  # cannot hide the others. SAN_PAR of them run at once, separate processes on the one GPU (one after another
  # they used up the step limits and left the last cases unrun); each case output goes to the log whole, under
  # a lock, as it ends.
  bands="$("$exe" --gtest_list_tests --gtest_filter="${SAN_FILTER:-*Sanitizer*}" | awk "/^[^ ]/{s=\$1} /^  /{print s \$1}")"
  [ -n "$bands" ] || { echo "no *Sanitizer* test listed"; exit 1; }
  : >"$STATE/san_$tool.txt"
  # `timeout` runs in a process group of its own, out of reach of the group kill of the step: a cut step kills
  # the cases still running through their groups, so that none shares the GPU with the benchmark after it.
  trap '"'"'trap - TERM; for f in "$STATE"/san_pg_*; do [ -e "$f" ] && read -r g b <"$f" && rm -f "$f" && kill -TERM -- "-$g" 2>/dev/null && echo "sanitizer $tool $b: cut by the step limit"; done; exit 143'"'"' TERM
  i=0
  for band in $bands; do
    (
      f="$STATE/san_${tool}_$i"
      timeout "${SAN_BAND_S:-120}" "$SANITIZER" --tool "$tool" --error-exitcode 1 "$@" "$exe" \
        --gtest_filter="$band" >"$f.txt" 2>&1 &
      t=$!
      echo "$t $band" >"$STATE/san_pg_${tool}_$i"
      wait "$t"
      r=$?
      rm -f "$STATE/san_pg_${tool}_$i"
      echo "$r" >"$f.rc"
      report="cat \"$f.txt\"; cat \"$f.txt\" >>\"$STATE/san_$tool.txt\"; echo \"sanitizer $tool $band: exit $r\""
      if command -v flock >/dev/null; then flock "$STATE/san.lock" sh -c "$report"; else sh -c "$report"; fi
    ) &
    i=$((i + 1))
    while [ "$(jobs -rp | wc -l)" -ge "${SAN_PAR:-4}" ]; do wait -n; done
  done
  wait
  rc=0
  for ((k = 0; k < i; k++)); do
    r="$(cat "$STATE/san_${tool}_$k.rc" 2>/dev/null || echo 1)"
    [ "$r" = 0 ] || rc=$r
  done
  if grep -q "Running 0 tests" "$STATE/san_$tool.txt"; then echo "no test matched *Sanitizer*"; exit 1; fi
  if grep -q "\[  SKIPPED \]" "$STATE/san_$tool.txt"; then echo "note: some sanitizer tests were skipped"; fi
  exit $rc'
run_step memcheck "set -- memcheck; $SAN_BODY"
# racecheck tracks every shared-memory access; the test's stale-shared-memory
# poison kernel (hundreds of CTAs x 227 KB before each launch) would dominate
# it, and hazards do not depend on the stale contents, so it is skipped there.
run_step racecheck "export RMSNORM_TEST_SKIP_SMEM_POISON=1 SAN_BAND_S=90; set -- racecheck --racecheck-report all; $SAN_BODY"
run_step initcheck "set -- initcheck; $SAN_BODY"
run_step synccheck "set -- synccheck; $SAN_BODY"

# ---- (e) benchmark -----------------------------------------------------------------------------
run_step bench '
  [ -x "$BUILD_DIR/rmsnorm_bench" ] || { echo "$BUILD_DIR/rmsnorm_bench was not built"; exit 1; }
  "$BUILD_DIR/rmsnorm_bench" --json "$OUT/bench.json" --commit "$COMMIT" '"$BENCH_ARGS"

# ---- (f) PyTorch reference ---------------------------------------------------------------------
run_step torch 'python3 bench/torch_bench.py --json "$OUT/torch.json" --commit "$COMMIT" '"$TORCH_ARGS"

# ---- (g) summary -------------------------------------------------------------------------------
run_step summarize '
  [ -f "$OUT/bench.json" ] || { echo "no bench.json"; exit 1; }
  torch_arg=()
  [ -f "$OUT/torch.json" ] && torch_arg=(--torch "$OUT/torch.json")
  python3 bench/summarize.py "$OUT/bench.json" "${torch_arg[@]}" --out "$OUT/summary.md"'

# ---- (h) CLI default ---------------------------------------------------------------------------
run_step cli '
  [ -x "$BUILD_DIR/rmsnorm" ] || { echo "$BUILD_DIR/rmsnorm was not built"; exit 1; }
  "$BUILD_DIR/rmsnorm" --json "$OUT/cli.json"
  # The fused and mixed-dtype forms on the CUDA backend (ctest runs them on the CPU only: CI has no GPU).
  # Each checks every element against the float64 reference and exits 1 on a mismatch.
  fails=0
  while read -r args; do
    echo "== rmsnorm --backend cuda --reps 20 $args"
    eval "\"$BUILD_DIR/rmsnorm\" --backend cuda --reps 20 $args" || { echo "FAILED: $args"; fails=$((fails + 1)); }
  done <<EOS
--op add --rows 8192 --cols 4096 --dtype bf16
--op add --rows 333 --cols 4099 --dtype f16
--op add --rows 64 --cols 320 --dtype f16 --residual-dtype f32 --weight-dtype f32
--op quant-fp8 --rows 8192 --cols 4096 --dtype bf16
--op quant-fp8 --rows 33 --cols 129 --dtype f16
--op quant-int8 --rows 4096 --cols 16384 --dtype bf16
--op quant-int8 --rows 17 --cols 1000 --dtype f32
--op quant-fp8 --rows 8192 --cols 4096 --dtype bf16 --group 128
--op quant-int8 --rows 8192 --cols 4096 --dtype bf16 --group 64
--op quant-fp8 --rows 333 --cols 4095 --dtype f16 --group 128
--op quant-int8 --rows 17 --cols 1000 --dtype f32 --group 128
--rows 37 --cols 1000 --dtype bf16 --y-dtype f32 --weight-dtype f32
--rows 33 --cols 129 --dtype f32 --y-dtype f16
--rows 8192 --cols 4096 --dtype bf16 --weight-dtype f32
--rows 32768 --cols 512 --dtype f16 --weight-dtype f32
--rows 1 --cols 4096 --dtype bf16 --weight-dtype f32
--rows 4096 --cols 16384 --dtype bf16 --weight-dtype f32
--op add --rows 8192 --cols 4096 --dtype bf16 --weight-dtype f32
EOS
  [ "$fails" = 0 ]'

# ---- (i) PyTorch package ----------------------------------------------------------------------
run_step python 'bash scripts/gpu_python.sh'

# ---- (j) report --------------------------------------------------------------------------------
fail=0
for i in "${!STEP_NAMES[@]}"; do
  case "${STEP_NAMES[$i]}" in
    build | ctest | memcheck | racecheck | initcheck | synccheck | python)
      [ "${STEP_RESULTS[$i]}" = PASS ] || fail=1 ;;
  esac
done

{
  # Failing steps first (the end of their logs), so that the table and the
  # summary stay at the very end of the output.
  for i in "${!STEP_NAMES[@]}"; do
    r="${STEP_RESULTS[$i]}"
    if [ "$r" != PASS ] && [ "$r" != SKIP ]; then
      n="${STEP_NAMES[$i]}"
      echo
      echo "---- last lines of step $n ($r) ----"
      awk -v n="$n" '$0 ~ "^===== " n " \\(" {p=1; buf=""; k=0; next} p && $0 ~ "^----- " n ": " {p=0} p {a[k++ % 25]=$0} END {s = k > 25 ? k - 25 : 0; for (j = s; j < k; j++) print a[j % 25]}' "$LOG" | cut -c1-300
    fi
  done
  echo
  echo "GPU check ($(date -u +%Y-%m-%dT%H:%M:%SZ), commit $COMMIT, $(($(date +%s) - START))s of ${BUDGET}s)"
  printf '%-10s %-14s %8s %8s\n' step result seconds limit
  for i in "${!STEP_NAMES[@]}"; do
    printf '%-10s %-14s %8s %8s\n' "${STEP_NAMES[$i]}" "${STEP_RESULTS[$i]}" "${STEP_SECONDS[$i]}" "${STEP_LIMITS[$i]}"
  done
  echo "exit code: $fail (build, ctest and the sanitizers decide it; benchmark targets are reported only)"
  echo "files in $OUT: $(find "$OUT" -maxdepth 1 -type f -printf '%f ')"
  if [ -f "$OUT/summary.md" ]; then
    echo
    cat "$OUT/summary.md"
  fi
} | tee -a "$LOG"

exit "$fail"
