#!/usr/bin/env python3
"""The fused operations of the rmsnorm PyTorch package against the same work done another way, in one run.

Operations and implementations (bf16 x, residual and w, eps 1e-5, the same tensors for all):
  add forward    h = x + residual, y = rms_norm(h) * w; returns y and h
    fused          rmsnorm.add_rms_norm (one kernel on the fused path)
    2 passes       torch's add, then rmsnorm.rms_norm of h (our norm, the add separate)
    eager          torch's add, then F.rms_norm
    compile        torch.compile of the eager formula (x + r, then the fp32 formula; Inductor fuses them)
  add fwd+bwd    the same with autograd: y, h = f(x, r, w); grad of (y, h) against (gy, g_h) for x, r and w
  quant fp8/row  y quantized to float8_e4m3fn with per-row scales (vLLM's rule, docs/fusions.md); returns q, scales
    fused          rmsnorm.rms_norm_quant
    2 passes       rmsnorm.rms_norm, then the quantization in eager torch ops
    eager          F.rms_norm, then the same eager quantization
    compile        torch.compile of the fp32 formula and the quantization
  quant fp8/static, int8/row: the same with a static scale, and int8 per row.
  add f32res fwd the add forward with an fp32 residual stream (bf16 x, fp32 residual and h, bf16 y and w)
    fused          rmsnorm.add_rms_norm(x, residual_f32, ...)
    2 passes       torch's add (x.float() + residual), then rmsnorm.rms_norm(h, w, out_dtype=bfloat16)
    eager          torch's add, then F.rms_norm(h, w.float()) rounded to bf16
    compile        torch.compile of the add and the fp32 formula (y rounded once to bf16)
  add f32res fwd+bwd  the same with autograd: gradients for x, the fp32 residual and w (g_h in fp32)
  w f32 fwd      the forward with an fp32 weight and bf16 x (AMP master weights); y bf16
    fused          rmsnorm.rms_norm(x, D, w_f32)
    2 passes       -
    eager          F.rms_norm(x.float(), w_f32) rounded to bf16
    compile        torch.compile of the fp32 formula
  f32 to bf16 fwd  the forward of fp32 x (an fp32 stream's h) with y in bf16 (rms_norm's out_dtype); w bf16
    fused          rmsnorm.rms_norm(x, D, w, out_dtype=bfloat16) (the bf16 weight as it is)
    2 passes       rmsnorm.rms_norm in fp32, then .to(bfloat16)
    eager          F.rms_norm in fp32, then .to(bfloat16)
    compile        torch.compile of the fp32 formula rounded once to bf16
  quant fp8/block128, int8/block128: the same with one scale per 128 columns of a row (rms_norm_quant's
    group_size=128, row-major scales); the eager and compiled forms reduce max|y| over a (rows, D / 128, 128) view.
  fused (no PDL)   diagnostic, not a peer, forward ops only: the fused op's operator called directly with
    RMSNORM_FLAG_NO_PDL. With PDL our kernel is resident before the kernel ahead of it (the timing marker) has ended,
    and CUPTI counts that wait in its kernel time; this column shows how much of a gap at a small shape that is.

Timing as in bench/torch_ops_bench.py (its Bench class does it): kernel_us is the CUPTI span of one call's kernels
with the L2 flushed before it, call_us the CUDA-event time per call; medians of --reps calls.
Bytes (minimal): add forward reads x, residual, w and writes h and y: (4nD + D) * 2; add fwd+bwd adds the backward's
reads of gy, g_h, x (h), w and writes of gx and gw: (9nD + 3D) * 2 for the whole; quant reads x and w and writes q
(1 byte each) and the per-row scales: 2nD + 2D + nD (+ 4n; 4n D / 128 for block scales); add f32res fwd reads x (2)
and the residual (4) and writes h (4) and y (2): 12nD + 2D; its backward adds reads of gy (2), g_h (4) and h (4) and
writes of the residual's (4) and x's (2) gradients: 28nD + 6D for the whole; w f32 fwd reads x, writes y and reads w in fp32: 4nD + 4D;
f32 to bf16 fwd reads x (4) and writes y (2): 6nD + 2D.

The verdict per shape and operation: the fused op against the fastest other implementation (kernel time).
Output: a table, --json FILE. Without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch_ops_bench as tob  # bench/torch_ops_bench.py: Bench (timing), call_spans, write_json
from run_meta import git_commit, utc_now  # bench/run_meta.py

EPS = 1e-5
SHAPES = [(1, 4096), (128, 4096), (8192, 4096), (16384, 7168), (4096, 16384), (65536, 2048)]
QUICK_SHAPES = [(1, 4096), (8192, 4096)]
OPS = ["add forward", "add fwd+bwd", "quant fp8/row", "quant fp8/static", "quant int8/row", "quant fp8/block128",
       "quant int8/block128", "add f32res fwd", "add f32res fwd+bwd", "w f32 fwd", "f32 to bf16 fwd"]
GROUP = 128
IMPLS = ["fused", "2 passes", "eager", "compile", "fused (no PDL)"]
DIAGNOSTIC = {"fused (no PDL)"}  # shown, never the verdict's "best other"


def eager_quant(torch, y, fp8, scale):
    """vLLM's rule in eager torch ops (as python/tests/test_fused.py checks it)."""
    yf = y.float()
    if scale is not None:
        v = yf * (1.0 / scale)
        s = None
    else:
        amax = yf.abs().amax(dim=-1, keepdim=True)
        s = torch.clamp(amax / (448.0 if fp8 else 127.0), min=1.0 / (448.0 * 512.0) if fp8 else 2.0**-23)
        v = yf / s if fp8 else yf * (1.0 / s)
    if fp8:
        return v.clamp(-448.0, 448.0).to(torch.float8_e4m3fn), s
    return torch.round(v).clamp(-128, 127).to(torch.int8), s


def eager_block_quant(torch, y, fp8, group):
    """The per-row rule applied to each block of `group` columns (D a multiple of it here)."""
    rows, d = y.shape
    q, s = eager_quant(torch, y.view(rows, d // group, group), fp8, None)
    return q.view(rows, d), s.view(rows, d // group)


def make_no_pdl(torch, rmsnorm, op):
    """The forward op's operator with RMSNORM_FLAG_NO_PDL, arguments as `make`'s fused form takes them."""
    ops = torch.ops.rmsnorm
    f = tob.FLAG_NO_PDL
    if "fwd+bwd" in op:
        raise NotImplementedError("forward ops only")
    if op == "f32 to bf16 fwd":
        return lambda x, r, w: ops.forward_inference(x, w, EPS, f | rmsnorm._Y_DTYPE_FLAG[torch.bfloat16])
    if op == "w f32 fwd":
        return lambda x, r, w: ops.forward_inference(x, w, EPS, f)
    if op.startswith("add"):
        return lambda x, r, w: ops.add_forward(x, r, w, EPS, f)[:2]
    qdtype = torch.float8_e4m3fn if "fp8" in op else torch.int8
    if "block" in op:
        return lambda x, w, scale: ops.forward_block_quant(x, w, EPS, f, qdtype, GROUP, False, None)
    static = "static" in op
    return lambda x, w, scale: ops.forward_quant(x, w, EPS, f, qdtype, scale if static else None, None)


def make(torch, rmsnorm, op, impl, cols):
    F = torch.nn.functional
    if impl == "fused (no PDL)":
        return make_no_pdl(torch, rmsnorm, op)

    def formula(h, w):
        hf = h.float()
        return (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(h.dtype)

    if op.startswith("add f32res"):  # x bf16, r fp32: h = x.float() + r (fp32), y = bf16(rms_norm(h) * w)
        if impl == "fused":
            return lambda x, r, w: rmsnorm.add_rms_norm(x, r, cols, w, EPS)
        if impl == "2 passes":
            return lambda x, r, w: (lambda h: (rmsnorm.rms_norm(h, cols, w, EPS, out_dtype=x.dtype), h))(x.float() + r)
        if impl == "eager":
            return lambda x, r, w: (lambda h: (F.rms_norm(h, (cols,), w.float(), EPS).to(x.dtype), h))(x.float() + r)

        def f32res_formula(x, r, w):
            h = x.float() + r
            return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype), h

        return torch.compile(f32res_formula, fullgraph=True, dynamic=False)
    if op == "f32 to bf16 fwd":  # x fp32 (an fp32 residual stream's h), w bf16, y bf16: out_dtype
        if impl == "fused":
            return lambda x, r, w: rmsnorm.rms_norm(x, cols, w, EPS, out_dtype=torch.bfloat16)
        if impl == "2 passes":
            return lambda x, r, w: rmsnorm.rms_norm(x, cols, w.float(), EPS).to(torch.bfloat16)
        if impl == "eager":
            return lambda x, r, w: F.rms_norm(x, (cols,), w.float(), EPS).to(torch.bfloat16)
        return torch.compile(lambda x, r, w: formula(x, w).to(torch.bfloat16), fullgraph=True, dynamic=False)
    if op == "w f32 fwd":  # x bf16, w fp32, y bf16
        if impl == "fused":
            return lambda x, r, w: rmsnorm.rms_norm(x, cols, w, EPS)
        if impl == "2 passes":
            raise NotImplementedError("no two-pass form")
        if impl == "eager":
            return lambda x, r, w: F.rms_norm(x.float(), (cols,), w, EPS).to(x.dtype)
        return torch.compile(lambda x, r, w: formula(x, w), fullgraph=True, dynamic=False)
    if op.startswith("add"):
        if impl == "fused":
            return lambda x, r, w: rmsnorm.add_rms_norm(x, r, cols, w, EPS)
        if impl == "2 passes":
            return lambda x, r, w: (lambda h: (rmsnorm.rms_norm(h, cols, w, EPS), h))(x + r)
        if impl == "eager":
            return lambda x, r, w: (lambda h: (F.rms_norm(h, (cols,), w, EPS), h))(x + r)

        def add_formula(x, r, w):
            h = x + r
            return formula(h, w), h

        return torch.compile(add_formula, fullgraph=True, dynamic=False)
    fp8 = "fp8" in op
    qdtype = torch.float8_e4m3fn if fp8 else torch.int8
    static = "static" in op
    if "block" in op:
        if impl == "fused":
            return lambda x, w, scale: rmsnorm.rms_norm_quant(x, cols, w, EPS, dtype=qdtype, group_size=GROUP)
        if impl == "2 passes":
            return lambda x, w, scale: eager_block_quant(torch, rmsnorm.rms_norm(x, cols, w, EPS), fp8, GROUP)
        if impl == "eager":
            return lambda x, w, scale: eager_block_quant(torch, F.rms_norm(x, (cols,), w, EPS), fp8, GROUP)
        return torch.compile(lambda x, w, scale: eager_block_quant(torch, formula(x, w), fp8, GROUP), fullgraph=True,
                             dynamic=False)
    if impl == "fused":
        return lambda x, w, scale: rmsnorm.rms_norm_quant(x, cols, w, EPS, dtype=qdtype,
                                                          scale=scale if static else None)
    if impl == "2 passes":
        return lambda x, w, scale: eager_quant(torch, rmsnorm.rms_norm(x, cols, w, EPS), fp8, scale if static else None)
    if impl == "eager":
        return lambda x, w, scale: eager_quant(torch, F.rms_norm(x, (cols,), w, EPS), fp8, scale if static else None)

    def quant_formula(x, w, scale):
        return eager_quant(torch, formula(x, w), fp8, scale if static else None)

    return torch.compile(quant_formula, fullgraph=True, dynamic=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--shapes", default="", help="ROWSxCOLS,... (default: every shape; --quick: two)")
    ap.add_argument("--impls", default=",".join(IMPLS),
                    help="a subset of " + ",".join(IMPLS) + " (an A/B: fused,compile)")
    ap.add_argument("--json", default="")
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    try:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s] or (
            QUICK_SHAPES if args.quick else SHAPES)
        if any(len(sh) != 2 or min(sh) < 1 for sh in shapes):
            raise ValueError
    except ValueError:
        ap.error(f"--shapes: expected ROWSxCOLS,... with positive sizes, got {args.shapes!r}")
    impls = [i for i in args.impls.split(",") if i]
    if not impls or any(i not in IMPLS for i in impls):
        ap.error(f"--impls: expected a subset of {','.join(IMPLS)}, got {args.impls!r}")
    args.profile = False
    meta = {"tool": "fused_bench", "date_utc": utc_now(), "commit": git_commit(args.commit)}
    import torch

    if not torch.cuda.is_available():
        print("fused_bench: skipped: no CUDA device")
        tob.write_json(args.json, {**meta, "skipped": "no CUDA device", "cases": []})
        return 0
    b = tob.Bench(torch, args)
    rmsnorm = b.rmsnorm
    props = torch.cuda.get_device_properties(0)
    copy_us, copy_gbps = b.measure_copy()
    meta.update({"gpu": props.name, "cuda": torch.version.cuda, "torch": torch.__version__, "reps": args.reps,
                 "copy_gbps": copy_gbps, "l2_flush": b.flush_method})
    print(f"{props.name}, CUDA {torch.version.cuda}, torch {torch.__version__}, commit {meta['commit']}; "
          f"copy ceiling {copy_gbps:.0f} GB/s")
    dev = torch.device("cuda")
    ops = [o for o in args.ops.split(",") if o]
    cases = []
    print(f"\n{'shape':<12} {'op':<17} {'impl':<14} {'kernel us':>9} {'call us':>9} {'GB/s':>8} {'%copy':>7}")
    for rows, cols in shapes:
        gen = torch.Generator(device=dev).manual_seed(rows * 7 + cols)
        x = torch.randn(rows, cols, dtype=torch.bfloat16, device=dev, generator=gen)
        r = torch.randn(rows, cols, dtype=torch.bfloat16, device=dev, generator=gen)
        w = (1.0 + 0.25 * torch.randn(cols, device=dev, generator=gen)).to(torch.bfloat16)
        r32 = torch.randn(rows, cols, dtype=torch.float32, device=dev, generator=gen)
        w32 = w.float()
        gy = torch.randn_like(x)
        gh = torch.randn_like(x)
        scale = torch.tensor([0.05], device=dev)
        n, d = rows * cols, cols
        # The forward ops' arguments (the quantized ones take (x, w, scale)), and the backward ops' inputs and g_h.
        fwd_args = {"add forward": (x, r, w), "add f32res fwd": (x, r32, w), "w f32 fwd": (x, None, w32),
                    "f32 to bf16 fwd": (r32, None, w)}
        grads = {"add fwd+bwd": ((x, r, w), gh), "add f32res fwd+bwd": ((x, r32, w), gh.float())}
        for op in ops:
            nbytes = {"add forward": (4 * n + d) * 2, "add fwd+bwd": (9 * n + 3 * d) * 2,
                      "quant fp8/row": 2 * n + 2 * d + n + 4 * rows, "quant fp8/static": 2 * n + 2 * d + n,
                      "quant int8/row": 2 * n + 2 * d + n + 4 * rows,
                      "quant fp8/block128": 2 * n + 2 * d + n + 4 * rows * (d // GROUP),
                      "quant int8/block128": 2 * n + 2 * d + n + 4 * rows * (d // GROUP),
                      "add f32res fwd": 2 * n + 4 * n + 4 * n + 2 * n + 2 * d,
                      "add f32res fwd+bwd": 28 * n + 6 * d, "w f32 fwd": 2 * n + 2 * n + 4 * d,
                      "f32 to bf16 fwd": 4 * n + 2 * n + 2 * d}[op]
            for impl in impls:
                try:
                    f = make(torch, rmsnorm, op, impl, cols)
                    if op in grads:  # forward and backward: gradients for x, the residual and w
                        ins, g_h = grads[op]
                        xl, rl, wl = (t.detach().requires_grad_(True) for t in ins)

                        def call(f=f, xl=xl, rl=rl, wl=wl, g_h=g_h):
                            y, h = f(xl, rl, wl)
                            return torch.autograd.grad((y, h), (xl, rl, wl), (gy, g_h))
                    else:
                        def call(f=f, a=fwd_args.get(op, (x, w, scale))):
                            with torch.no_grad():
                                return f(*a)
                    for _ in range(3):
                        call()
                    torch.cuda.synchronize()
                    spans = b.kernel_times(call)
                    es = sorted(b.event_times(call))
                    k = statistics.median(s[0] for s in spans)
                    c = {"rows": rows, "cols": cols, "op": op, "impl": impl, "bytes": nbytes, "kernel_us": k,
                         "stream_us": statistics.median(s[1] for s in spans),
                         "call_us": statistics.median(es), "gbps": nbytes / k / 1e3}
                    c["pct_copy"] = 100.0 * c["gbps"] / copy_gbps
                    print(f"{f'{rows}x{cols}':<12} {op:<17} {impl:<14} {k:9.2f} {c['call_us']:9.2f} "
                          f"{c['gbps']:8.1f} {c['pct_copy']:6.1f}%", flush=True)
                except Exception as e:  # noqa: BLE001
                    torch.cuda.synchronize()
                    c = {"rows": rows, "cols": cols, "op": op, "impl": impl, "error": str(e).splitlines()[0][:200]}
                    print(f"{f'{rows}x{cols}':<12} {op:<17} {impl:<14} ERROR {c['error']}", flush=True)
                cases.append(c)
                torch._dynamo.reset()
    print()
    lines = [f"{'shape':<12} {'op':<17} {'fused us':>9} {'%copy':>6} {'no PDL':>8} {'best other':>20} "
             f"{'fused/best':>10}  verdict"]
    keyed = {}
    for c in cases:
        keyed.setdefault((c["rows"], c["cols"], c["op"]), {})[c["impl"]] = c
    for (rows, cols, op), by in keyed.items():
        fu = by.get("fused", {}).get("kernel_us")
        others = [(v["kernel_us"], k) for k, v in by.items()
                  if k != "fused" and k not in DIAGNOSTIC and "kernel_us" in v]
        nopdl = by.get("fused (no PDL)", {}).get("kernel_us")
        nopdl_s = f"{nopdl:8.2f}" if nopdl is not None else f"{'-':>8}"
        best = min(others) if others else (None, "-")
        if fu is None or best[0] is None:
            lines.append(f"{f'{rows}x{cols}':<12} {op:<17} -")
            continue
        ratio = fu / best[0]
        lines.append(f"{f'{rows}x{cols}':<12} {op:<17} {fu:9.2f} {by['fused']['pct_copy']:6.1f} {nopdl_s} "
                     f"{f'{best[1]} {best[0]:.2f}':>20} {ratio:10.3f}  {'ahead' if ratio <= 1 else 'BEHIND'}")
    print("\n".join(lines))
    tob.write_json(args.json, {**meta, "cases": cases, "summary": lines})
    return 0


if __name__ == "__main__":
    sys.exit(main())
