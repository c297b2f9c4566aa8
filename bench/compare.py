#!/usr/bin/env python3
"""Side-by-side table of several rmsnorm_bench JSON files (an A/B/C... run).

  python3 bench/compare.py A=a.json B=b.json [C=c.json ...] [--out compare.md]

One row per (op, shape, dtype, variant) present in the first file; for each
file its median us and % of its own run's copy ceiling, and for every file
after the first its time relative to the first (< 1.00 = faster). Every
number comes from the inputs; a case missing from a file prints as "-".
"""

import argparse
import json
import math

from summarize import OP_NAMES as OPS  # bench/summarize.py: one table of case names


def finite(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def key(c):
    return (c.get("op"), c.get("rows"), c.get("cols"), c.get("dtype"), c.get("variant"))


def table(runs):
    labels = [label for label, _ in runs]
    by_key = [{key(c): c for c in doc.get("cases", [])} for _, doc in runs]
    head = ["case", "shape", "dtype", "variant"]
    for i, label in enumerate(labels):
        head += [f"{label} us", f"{label} % copy"] + ([f"{label}/{labels[0]}"] if i else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 4 + "---:|" * (len(head) - 4)]
    for c in runs[0][1].get("cases", []):
        k = key(c)
        row = [OPS.get(c.get("op"), str(c.get("op"))), f"{c.get('rows')}x{c.get('cols')}", str(c.get("dtype")),
               str(c.get("variant")).replace("|", "\\|")]
        base = c.get("us")
        for i, cases in enumerate(by_key):
            o = cases.get(k)
            us = o.get("us") if o else None
            pct = o.get("pct_copy") if o else None
            row += [f"{us:.2f}" if finite(us) else "-", f"{pct:.1f}" if finite(pct) else "-"]
            if i:
                row.append(f"{us / base:.3f}" if finite(us) and finite(base) and base > 0 else "-")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description="Side-by-side table of rmsnorm_bench JSON files")
    ap.add_argument("runs", nargs="+", help="LABEL=bench.json, the first is the baseline")
    ap.add_argument("--out", default="", help="also write the markdown here")
    args = ap.parse_args()
    runs = []
    for spec in args.runs:
        label, sep, path = spec.partition("=")
        if not sep:
            ap.error(f"expected LABEL=FILE, got {spec!r}")
        with open(path) as f:
            runs.append((label, json.load(f)))
    md = table(runs)
    print(md, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(md)


if __name__ == "__main__":
    main()
