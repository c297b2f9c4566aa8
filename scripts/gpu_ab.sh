#!/usr/bin/env bash
# A/B benchmark of two source trees in one GPU call, so that a kernel change
# is judged against its baseline on the same machine, minutes apart.
#
#   Here (no GPU):   scripts/gpu_ab.sh prepare REV [DIR]
#                    exports commit REV (e.g. a candidate, or the baseline) to
#                    DIR (default .carry/variant, ignored by git) so that it
#                    travels with the working tree (device tool: carry .carry).
#   On the GPU:      OUT=... scripts/gpu_ab.sh run [DIR]
#                    builds rmsnorm_bench for the working tree (A) and for DIR
#                    (B), runs both back to back, and prints the forward and
#                    VJP rows of each side by side. Nothing else runs on the
#                    GPU meanwhile. Correctness is not checked here: run
#                    scripts/gpu_check.sh on whichever side lands.
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
    echo "$rev" >"$dir/AB_REVISION"
    echo "exported $rev to $dir; pass carry: [\"${dir%%/*}\"] to the device call"
    ;;
  run)
    dir="${2:-.carry/variant}"
    out="${OUT:-./gpu_out}"
    mkdir -p "$out"
    [ -d "$dir" ] || { echo "no variant tree at $dir (run 'prepare' first)"; exit 2; }
    jobs="${JOBS:-16}"
    build() {  # build SRC BUILD
      cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DRMSNORM_BUILD_TESTS=OFF >/dev/null
      cmake --build "$2" -j "$jobs" --target rmsnorm_bench >/dev/null
    }
    build . build-ab-a &
    build "$dir" build-ab-b &
    wait
    a_rev="$(git rev-parse --short HEAD 2>/dev/null || echo working-tree)"
    b_rev="$(cat "$dir/AB_REVISION" 2>/dev/null || echo variant)"
    build-ab-a/rmsnorm_bench ${BENCH_ARGS:-} --commit "A:$a_rev" --json "$out/ab_a.json" >"$out/ab_a.txt" 2>&1
    build-ab-b/rmsnorm_bench ${BENCH_ARGS:-} --commit "B:$b_rev" --json "$out/ab_b.json" >"$out/ab_b.txt" 2>&1
    python3 bench/summarize.py "$out/ab_a.json" --out "$out/ab_a.md" >/dev/null
    python3 bench/summarize.py "$out/ab_b.json" --out "$out/ab_b.md" >/dev/null
    echo "A = $a_rev, B = $b_rev   (case | shape | dtype | variant | us | % copy)"
    paste -d'#' <(grep -E '^\| (fwd|VJP)' "$out/ab_a.md" | cut -d'|' -f2-6,8) \
                <(grep -E '^\| (fwd|VJP)' "$out/ab_b.md" | cut -d'|' -f6,8) | sed 's/#/ || B:/'
    ;;
  *)
    sed -n '2,15p' "$0"
    exit 2
    ;;
esac
