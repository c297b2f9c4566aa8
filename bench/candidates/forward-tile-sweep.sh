#!/usr/bin/env bash
# Tile-size sweep of the rows-band forward, with forward-tile-knobs.patch
# applied to the working tree (an experiment build: it never lands).
#
#   here:    git apply bench/candidates/forward-tile-knobs.patch
#            (device call, carry nothing extra) bash bench/candidates/forward-tile-sweep.sh [SHAPE ...]
#            then git checkout src/plan.cpp
#   SHAPE:   rmsnorm_bench --shape specs (ROWSxCOLS:DTYPE[:offset]); default: session 6's 17 aligned shapes.
#   env:     TILES (default "0 4 8 2 0": 0 = persistent, run first and last for the drift), WAVES (default 1:
#            tiles wherever there are TILE groups per resident CTA), REPS (40).
# Writes $OUT/k<tile>[b].json and prints forward and VJP us per shape and tile size (VJP is untouched: its spread
# is the run's noise).
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
OUT="${OUT:-./gpu_out}"
mkdir -p "$OUT"
grep -q RMSNORM_EXP_TILE src/plan.cpp || { echo "apply bench/candidates/forward-tile-knobs.patch first"; exit 2; }
if ! { cmake -S . -B build-sweep -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
         -DRMSNORM_BUILD_TESTS=OFF >/dev/null && cmake --build build-sweep -j16 --target rmsnorm_bench >/dev/null; }; then
  echo "build failed"
  exit 1
fi
shapes=("$@")
[ ${#shapes[@]} -gt 0 ] || shapes=(8192x4096:f16 16384x4096:f16 32768x4096:f16 65536x4096:f16 4096x7168:bf16
  8192x7168:bf16 16384x7168:bf16 32768x7168:bf16 2048x16384:bf16 4096x16384:bf16 8192x16384:bf16 8192x8192:f16
  16384x8192:f16 8192x4096:f32 16384x4096:f32 65536x2048:bf16 131072x2048:bf16)
args=()
for s in "${shapes[@]}"; do args+=(--shape "$s"); done
labels=()
seen=" "
for t in ${TILES:-0 4 8 2 0}; do
  label="$t"
  while [[ "$seen" == *" $label "* ]]; do label="${label}b"; done
  seen="$seen$label "
  labels+=("$label")
  RMSNORM_EXP_TILE="$t" RMSNORM_EXP_WAVES="${WAVES:-1}" timeout 150 build-sweep/rmsnorm_bench --reps "${REPS:-40}" \
    "${args[@]}" --commit "tile$label" --json "$OUT/k$label.json" >"$OUT/log_k$label.txt" 2>&1 || echo "tile $label failed"
done
OUT="$OUT" LABELS="${labels[*]}" python3 - <<'PY'
import json, os
out, labels = os.environ["OUT"], os.environ["LABELS"].split()
data = {}
for k in labels:
    try:
        d = json.load(open(f"{out}/k{k}.json"))
    except (OSError, ValueError) as e:
        print("no result for", k, e)
        continue
    for c in d["cases"]:
        if c["op"] in ("forward", "vjp"):
            key = (c["op"], f'{c["rows"]}x{c["cols"]} {c["dtype"]} {c["variant"]}')
            data.setdefault(key, {})[k] = c["us"]
print("| op | shape | " + " | ".join("tile " + k for k in labels) + " |")
print("|---|---|" + "---:|" * len(labels))
for (op, shape), v in data.items():
    print(f"| {op} | {shape} | " + " | ".join(f"{v[k]:.2f}" if k in v else "-" for k in labels) + " |")
PY
