#!/usr/bin/env bash
# A/B benchmark of several source trees in one GPU call, so that a kernel
# change is judged against its baseline on the same machine, minutes apart.
#
#   Here (no GPU):   scripts/gpu_ab.sh prepare REV [DIR]
#                    exports commit REV (e.g. a candidate, or the baseline) to
#                    DIR (default .carry/variant, ignored by git) so that it
#                    travels with the working tree (device tool: carry .carry).
#                    Repeat with other DIRs (.carry/v2, ...) for more variants.
#                    scripts/gpu_ab.sh prepare-patch PATCH [DIR]
#                    the same for the working tree's HEAD with PATCH applied
#                    (a candidate kept on a branch: git diff main BRANCH > PATCH).
#                    scripts/gpu_ab.sh prebuild REV DIR
#                    builds rmsnorm_bench of commit REV here (sm_90 code only,
#                    no line tables, fatbinary compressed for size, stripped:
#                    about a third of a default build's 64 MiB) into DIR, so
#                    that the GPU call runs it without building (the device
#                    tool carries at most 64 MiB in all: two or three sides).
#                    Takes 7-9 minutes on 2 cores.
#   On the GPU:      OUT=... scripts/gpu_ab.sh run [DIR ...]
#                    builds rmsnorm_bench for the working tree (A) and for
#                    each DIR (B, C, ...; default .carry/variant) in parallel,
#                    runs them one after another, and prints one table with
#                    every side's us and % of copy and its time relative to A
#                    (bench/compare.py). A DIR holding a prebuilt
#                    rmsnorm_bench runs that binary unbuilt; with PREBUILT_ONLY=1
#                    the working tree is not a side (the first DIR is A).
#                    Nothing else runs on the GPU
#                    meanwhile. Correctness is not checked here: run
#                    scripts/gpu_check.sh on whichever side lands.
#                    $OUT gets ab_json.tar.gz (ab_<label>.json per side,
#                    re-packed after each side, so a run cut short keeps what
#                    it measured), ab_compare.md and ab_log.txt (few files:
#                    the device tool returns 8).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

mode="${1:-}"
case "$mode" in
  prepare)
    rev="${2:?usage: gpu_ab.sh prepare REV [DIR]}"
    dir="${3:-.carry/variant}"
    rm -rf "$dir"
    mkdir -p "$dir"
    git archive "$rev" | tar -x -C "$dir"
    git rev-parse --short "$rev" >"$dir/AB_REVISION"
    echo "exported $rev to $dir; pass carry: [\"${dir%%/*}\"] to the device call"
    ;;
  prepare-patch)
    patch="${2:?usage: gpu_ab.sh prepare-patch PATCH [DIR]}"
    dir="${3:-.carry/variant}"
    rm -rf "$dir"
    mkdir -p "$dir"
    git archive HEAD | tar -x -C "$dir"
    # Paths in the patch are relative to the repository root; $dir lies inside it.
    git apply --directory="$dir" "$patch"
    echo "$(git rev-parse --short HEAD)+$(basename "$patch" .patch)" >"$dir/AB_REVISION"
    echo "exported HEAD + $patch to $dir; pass carry: [\"${dir%%/*}\"] to the device call"
    ;;
  prebuild)
    rev="${2:?usage: gpu_ab.sh prebuild REV DIR}"
    dir="${3:?usage: gpu_ab.sh prebuild REV DIR}"
    src="$(mktemp -d)"
    git archive "$rev" | tar -x -C "$src"
    # The compact build of scripts/prebuild.sh (this tree's), of the exported revision's benchmark alone.
    SRC="$src" SHARED=OFF TARGETS=rmsnorm_bench bash scripts/prebuild.sh "$src/build" >/dev/null  # one binary, copied
    rm -rf "$dir"
    mkdir -p "$dir"
    cp "$src/build/rmsnorm_bench" "$dir/rmsnorm_bench"
    git rev-parse --short "$rev" >"$dir/AB_REVISION"
    rm -rf "$src"
    echo "built $rev into $dir ($(du -h "$dir/rmsnorm_bench" | cut -f1)); pass carry: [\"$dir\"] (or its parent)"
    ;;
  run)
    shift
    dirs=("$@")
    [ ${#dirs[@]} -gt 0 ] || dirs=(.carry/variant)
    out="${OUT:-./gpu_out}"
    mkdir -p "$out"
    jobs="${JOBS:-16}"
    for d in "${dirs[@]}"; do
      [ -d "$d" ] || { echo "no variant tree at $d (run 'prepare' first)"; exit 2; }
    done
    build() {  # build SRC BUILD
      cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DRMSNORM_BUILD_TESTS=OFF >/dev/null
      cmake --build "$2" -j "$jobs" --target rmsnorm_bench >/dev/null
    }
    labels=(A B C D E F G H I J K L M N)
    [ ${#dirs[@]} -lt ${#labels[@]} ] || { echo "at most $(( ${#labels[@]} - 1 )) variants"; exit 2; }
    srcs=()
    revs=()
    if [ "${PREBUILT_ONLY:-0}" != 1 ]; then
      srcs=(.)
      revs=("$(git rev-parse --short HEAD 2>/dev/null || echo working-tree)")
    fi
    srcs+=("${dirs[@]}")
    for d in "${dirs[@]}"; do revs+=("$(cat "$d/AB_REVISION" 2>/dev/null || echo "$d")"); done
    bins=()
    for i in "${!srcs[@]}"; do
      if [ -x "${srcs[$i]}/rmsnorm_bench" ] && [ ! -f "${srcs[$i]}/CMakeLists.txt" ]; then
        bins+=("${srcs[$i]}/rmsnorm_bench")  # prebuilt (gpu_ab.sh prebuild)
      else
        bins+=("build-ab-${labels[$i]}/rmsnorm_bench")
        build "${srcs[$i]}" "build-ab-${labels[$i]}" &
      fi
    done
    wait
    : >"$out/ab_log.txt"
    args=()
    for i in "${!srcs[@]}"; do
      l="${labels[$i]}"
      echo "== $l = ${revs[$i]} (${srcs[$i]}) at $(date -u +%T)" | tee -a "$out/ab_log.txt"
      mkdir -p "$out/json"
      "${bins[$i]}" ${BENCH_ARGS:-} --commit "$l:${revs[$i]}" --json "$out/json/ab_$l.json" \
        >>"$out/ab_log.txt" 2>&1 || { echo "side $l failed (build or run)" | tee -a "$out/ab_log.txt"; continue; }
      tar -czf "$out/ab_json.tar.gz" -C "$out" json
      args+=("$l=$out/json/ab_$l.json")
    done
    python3 bench/compare.py "${args[@]}" --out "$out/ab_compare.md"
    rm -rf "$out/json"
    ;;
  *)
    sed -n '2,34p' "$0"
    exit 2
    ;;
esac
