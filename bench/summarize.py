#!/usr/bin/env python3
"""Markdown summary of a rmsnorm_bench JSON, optionally next to a torch_bench JSON.

  python3 bench/summarize.py bench.json [--torch torch.json] [--out summary.md]
  python3 bench/summarize.py bench/results/h200.json    (torch results merged under "torch")

Every number printed comes from the inputs: times and GB/s as measured,
% of copy against each tool's own copy ceiling of the same run, speedup =
torch us / ours us for the same (op, shape, dtype, variant), targets and their
PASS/MISS as rmsnorm_bench recorded them. A missing value prints as "-".
"""

import argparse
import json
import math
import sys

OP_NAMES = {
    "forward": "fwd",
    "vjp": "VJP",
    "backward_recompute": "bwd (recompute rstd)",
    "vjp_two_pass": "VJP two-pass",
    "decode_forward": "decode fwd (graph)",
    "decode_vjp": "decode VJP (graph)",
    "decode_forward_fp8_static": "decode fwd fp8 static (graph)",
    "decode_forward_fp8_per_row": "decode fwd fp8 per row (graph)",
    "forward_fp8_per_row": "fwd fp8 per row",
    "forward_fp8_static": "fwd fp8 static",
    "forward_int8_per_row": "fwd int8 per row",
    "forward_fp8_block128": "fwd fp8 1x128 blocks",
    "forward_int8_block128": "fwd int8 1x128 blocks",
}



def same_size_memcpy(doc):
    """GB/s of a cudaMemcpyAsync that moves `bytes` (read + write), from the
    run's memcpy_by_size: linear in log2(bytes) between measured sizes,
    clamped outside them. None when the run has fewer than two sizes."""
    pts = sorted((2.0 * p["bytes_copied"], p["gbps"]) for p in doc.get("memcpy_by_size") or []
                 if num(p.get("bytes_copied")) and num(p.get("gbps")))
    if len(pts) < 2:
        return None

    def at(nbytes):
        if nbytes <= pts[0][0]:
            return pts[0][1]
        if nbytes >= pts[-1][0]:
            return pts[-1][1]
        for (b0, g0), (b1, g1) in zip(pts, pts[1:]):
            if b0 <= nbytes <= b1:
                f = (math.log2(nbytes) - math.log2(b0)) / (math.log2(b1) - math.log2(b0))
                return g0 + f * (g1 - g0)
        return pts[-1][1]

    return at

def num(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def fmt(v, spec):
    v = num(v)
    return "-" if v is None else format(v, spec)


def cell(v):
    """A table cell: a "|" inside it would end the cell early."""
    return str(v).replace("|", "\\|")


def key(c):
    return (c.get("op"), c.get("rows"), c.get("cols"), c.get("dtype"), c.get("variant"))


def verdicts(c):
    """(target labels, verdicts) of a case: one entry per target."""
    ts = c.get("targets")
    if ts is None:  # older files kept one target
        ts = [c["target"]] if c.get("target") else []
    labels = "; ".join(t.get("label", "") for t in ts)
    vs = "; ".join(t.get("verdict") or ("PASS" if t.get("pass") else "MISS") for t in ts)
    return labels, vs


def cuda_version(v):
    """13000 -> "13.0" (cudaDriverGetVersion / cudaRuntimeGetVersion encoding)."""
    v = num(v)
    return "-" if v is None else f"{int(v) // 1000}.{int(v) % 1000 // 10}"


def build(ours, torch_doc):
    lines = []
    gpu = ours.get("gpu", {})
    # rmsnorm_bench records the CUDA driver API version; torch_bench the NVIDIA driver's (nvidia-smi).
    drv = (torch_doc or {}).get("driver_version")
    nvidia_driver = f"NVIDIA driver {drv}, " if isinstance(drv, str) and drv else ""
    lines.append("# rmsnorm benchmark summary")
    lines.append("")
    lines.append(f"- GPU: {gpu.get('name', '-')} ({gpu.get('sm_count', '-')} SMs, L2 "
                 f"{fmt((gpu.get('l2_bytes') or 0) / 1e6, '.0f')} MB), {nvidia_driver}CUDA driver API "
                 f"{cuda_version(ours.get('driver_version'))}, CUDA runtime {cuda_version(ours.get('runtime_version'))}")
    lines.append(f"- commit {ours.get('commit', '-')}, date {ours.get('date_utc', '-')}, reps "
                 f"{ours.get('method', {}).get('reps', '-')}{' (quick run: not for reporting)' if ours.get('method', {}).get('quick') else ''}"
                 f"{' (--no-pdl: every call without PDL; a diagnostic, not for reporting)' if ours.get('method', {}).get('no_pdl') else ''}")
    copy = ours.get("copy", {})
    lines.append(f"- copy ceiling (D2D 1 GiB, read+write, median): {fmt(copy.get('gbps'), '.1f')} GB/s "
                 f"(again at the end: {fmt(copy.get('gbps_end'), '.1f')} GB/s)")
    for field, what in (("kernel_copy", "plain SM copy kernel"), ("memcpy_by_size", "cudaMemcpyAsync D2D")):
        kc = ours.get(field) or []
        if kc:
            parts = []
            for k in kc:
                g, b = num(k.get("gbps")), num(k.get("bytes_copied"))
                pct = f", {100.0 * g / copy['gbps']:.1f}%" if g is not None and num(copy.get("gbps")) else ""
                parts.append(f"{fmt((b or 0) / (1 << 20), '.0f')} MiB copied {fmt(g, '.1f')} GB/s{pct}")
            lines.append(f"- {what} by size (diagnostic, same run; moved = 2x copied): " + "; ".join(parts))
    tcases = {}
    if torch_doc is not None:
        if torch_doc.get("skipped"):
            lines.append(f"- torch: skipped ({torch_doc['skipped']})")
        else:
            tcopy = torch_doc.get("copy", {})
            lines.append(f"- torch {torch_doc.get('torch_version', '-')} F.rms_norm; its copy ceiling "
                         f"{fmt(tcopy.get('gbps'), '.1f')} GB/s; torch % copy is against that ceiling")
            for c in torch_doc.get("cases", []):
                tcases[key(c)] = c
        if torch_doc.get("fatal_error"):
            lines.append(f"- torch_bench stopped early: {torch_doc['fatal_error']}")
    else:
        lines.append("- torch: no torch results given")
    if ours.get("fatal_error"):
        lines.append(f"- **rmsnorm_bench stopped early: {ours['fatal_error']}**")
    lines.append("- \"(small)\": under 256 MiB of data, where the BRIEF's % targets are not stated; "
                 "decode rows are per call inside a CUDA graph of 20 calls")
    msize = same_size_memcpy(ours)
    if msize is not None:
        lines.append("- \"% size memcpy\": of a cudaMemcpyAsync moving as many bytes, interpolated (log size) "
                     "between the sizes measured above; clamped outside them (diagnostic, not a target)")
    lines.append("")
    lines.append("| case | shape | dtype | variant | ours us | ours GB/s | % copy | % size memcpy | torch us "
                 "| torch % copy | speedup vs torch | target | verdict |")
    lines.append("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
    n_pass = n_miss = n_small = 0
    for c in ours.get("cases", []):
        t = tcases.get(key(c))
        labels, vs = verdicts(c)
        n_pass += vs.count("PASS")
        n_miss += vs.count("MISS")
        n_small += vs.count("MISS (small)")
        ours_us = num(c.get("us"))
        torch_us = num(t.get("us")) if t else None
        speedup = fmt(torch_us / ours_us, ".2f") + "x" if ours_us and torch_us else "-"
        err = c.get("error")
        if err:
            labels = (labels + "; " if labels else "") + "error: " + err
        if t and t.get("error"):
            speedup = "torch: " + t["error"]
        variant = c.get("variant", "-")
        if num(c.get("vs_aligned")):
            variant += f" ({c['vs_aligned']:.2f}x the time of aligned {c.get('vs_aligned_case', '')})"
        lines.append("| " + " | ".join(cell(v) for v in [
            OP_NAMES.get(c.get("op"), c.get("op", "-")),
            f"{c.get('rows')}x{c.get('cols')}",
            c.get("dtype", "-"),
            variant,
            fmt(c.get("us"), ".2f"),
            fmt(c.get("gbps"), ".0f"),
            fmt(c.get("pct_copy"), ".1f"),
            fmt(100.0 * c["gbps"] / msize(c["bytes"]), ".1f")
            if msize is not None and num(c.get("gbps")) and num(c.get("bytes")) and not c.get("graph") else "-",
            fmt(t.get("us"), ".2f") if t else "-",
            fmt(t.get("pct_copy"), ".1f") if t else "-",
            speedup,
            labels or "-",
            vs or "-",
        ]) + " |")
    comps = ours.get("fused_vs_two_pass", [])
    if comps:
        lines.append("")
        lines.append("Fused vs two-pass backward (VJP, gw in dtype; extra = peak extra device memory)")
        lines.append("")
        lines.append("| shape | dtype | fused us | two-pass us | speedup | fused extra MiB | two-pass extra MiB "
                     "| target | verdict |")
        lines.append("|---|---|---:|---:|---:|---:|---:|---|---|")
        for c in comps:
            tgt = c.get("target") or {}
            v = tgt.get("verdict") or ("PASS" if tgt.get("pass") else "MISS") if tgt else "-"
            if tgt:
                n_pass += v.count("PASS")
                n_miss += v.count("MISS")
            fe, te = num(c.get("fused_extra_device_bytes")), num(c.get("two_pass_extra_device_bytes"))
            lines.append("| " + " | ".join(cell(v) for v in [
                f"{c.get('rows')}x{c.get('cols')}", c.get("dtype", "-"), fmt(c.get("fused_us"), ".2f"),
                fmt(c.get("two_pass_us"), ".2f"), fmt(c.get("speedup"), ".2f") + "x",
                fmt(fe / 2**20 if fe is not None else None, ".2f"), fmt(te / 2**20 if te is not None else None, ".1f"),
                tgt.get("label", "-") if tgt else "-", v,
            ]) + " |")
    lines.append("")
    lines.append(f"Targets: {n_pass} PASS, {n_miss} MISS ({n_small} of the MISSes on (small) data); "
                 "reported, not asserted.")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description="Markdown summary of rmsnorm_bench (and torch_bench) JSON")
    ap.add_argument("bench_json")
    ap.add_argument("--torch", default="", help="torch_bench JSON (optional)")
    ap.add_argument("--out", default="", help="also write the markdown here")
    args = ap.parse_args()
    try:
        with open(args.bench_json) as f:
            ours = json.load(f)
    except (OSError, ValueError) as e:
        print(f"summarize: cannot read {args.bench_json}: {e}", file=sys.stderr)
        return 1
    # bench/results/<gpu>.json carries its torch_bench JSON under "torch".
    torch_doc = ours.get("torch") if isinstance(ours.get("torch"), dict) else None
    if args.torch:
        try:
            with open(args.torch) as f:
                torch_doc = json.load(f)
        except (OSError, ValueError) as e:
            torch_doc = {"skipped": f"cannot read {args.torch}: {e}"}
    md = build(ours, torch_doc)
    sys.stdout.write(md)
    if args.out:
        with open(args.out, "w") as f:
            f.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
