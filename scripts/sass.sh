#!/usr/bin/env bash
# SASS of chosen kernel instantiations, without a GPU: how many instructions
# each kernel has, what ptxas spilled, and (with --kernel) the code itself.
# The numbers in docs/performance.md that read "SASS instructions" come from
# this (nvcc -cubin, then cuobjdump -sass).
#
#   scripts/sass.sh [--arch sm_90] [--kernel SUBSTRING] FILE.cu
#
# FILE.cu is a translation unit that includes the kernel headers (the
# repository's src/ and include/ are on the include path) and instantiates
# the kernels to look at, for example
#
#   #include "cuda/forward.cuh"
#   namespace rmsnorm::cuda {
#   template __global__ void forward_rows_direct_kernel<__nv_bfloat16, 4, 4, false, false, QuantKind::kNone,
#                                                       __nv_bfloat16>(const ForwardParams<__nv_bfloat16>);
#   }
#
# Output: per kernel (mangled name), ptxas' registers and spill bytes, and
# the SASS instruction count (every instruction cuobjdump lists, the NOPs
# that pad the end included). --kernel prints each matching
# kernel's SASS, one "address instruction" per line.
#
# cuobjdump: $CUOBJDUMP, else the CUDA toolkit's, else one from the PyPI
# wheel (the toolkit image here lacks it):
#   python3 -m pip download --no-deps -d /tmp/cuobj nvidia-cuda-cuobjdump &&
#   (cd /tmp/cuobj && unzip -qo nvidia_cuda_cuobjdump-*.whl) &&
#   export CUOBJDUMP=$(find /tmp/cuobj -name cuobjdump -type f)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

arch=sm_90
kernel=""
file=""
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch="$2"; shift 2 ;;
    --kernel) kernel="$2"; shift 2 ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) file="$1"; shift ;;
  esac
done
[ -n "$file" ] || { sed -n '2,28p' "$0"; exit 2; }

cuobjdump="${CUOBJDUMP:-}"
if [ -z "$cuobjdump" ]; then
  if command -v cuobjdump >/dev/null 2>&1; then
    cuobjdump=cuobjdump
  elif [ -x "$(dirname "$(command -v nvcc)")/cuobjdump" ]; then
    cuobjdump="$(dirname "$(command -v nvcc)")/cuobjdump"
  else
    echo "no cuobjdump: set CUOBJDUMP (see the comment at the top of $0)" >&2
    exit 2
  fi
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
nvcc -std=c++17 -O3 -arch="$arch" -Isrc -Iinclude -cubin -Xptxas=-v -o "$tmp/k.cubin" "$file" 2>"$tmp/ptxas.txt"
"$cuobjdump" -sass "$tmp/k.cubin" >"$tmp/k.sass"

python3 - "$tmp/ptxas.txt" "$tmp/k.sass" "$kernel" <<'EOF'
import re
import sys

ptxas, sass, want = sys.argv[1], sys.argv[2], sys.argv[3]
stats, name = {}, None
for line in open(ptxas):
    m = re.search(r"Compiling entry function '(\S+)'", line)
    if m:
        name = m.group(1)
        stats[name] = {}
        continue
    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m and name:
        stats[name]["spill"] = f"spill {m.group(1)}/{m.group(2)} B"
    m = re.search(r"Used (\d+) registers", line)
    if m and name:
        stats[name]["regs"] = f"{m.group(1)} regs"
code, name = {}, None
for line in open(sass):
    m = re.search(r"Function : (\S+)", line)
    if m:
        name = m.group(1)
        code[name] = []
        continue
    m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
    if m and name:
        code[name].append((m.group(1), m.group(2)))
for name, ins in code.items():
    s = stats.get(name, {})
    n = len(ins)
    print(f"{n:6d} instructions  {s.get('regs', '?'):>8}  {s.get('spill', ''):<16} {name}")
    if want and want in name:
        for addr, i in ins:
            print(f"    {addr} {i}")
EOF
