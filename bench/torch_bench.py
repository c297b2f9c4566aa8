#!/usr/bin/env python3
"""PyTorch's torch.nn.functional.rms_norm on the shapes of bench/rmsnorm_bench.cu.

The comparison point for the library's benchmark: same shapes, same byte
counting, same method, its own copy ceiling measured in the same run.

What is timed (CUDA events around each call, after warm-up; median of --reps):
  forward  F.rms_norm(x, (D,), w, eps) under torch.no_grad() (no rstd saved),
           including the allocation of y by the caching allocator (no
           cudaMalloc after warm-up).
  vjp      torch.autograd.grad(y, [x, w], gy, retain_graph=True), where
           y = F.rms_norm(x, (D,), w, eps) was computed once per operand set
           OUTSIDE the timed region, with x (a leaf) and w requiring grad. The
           events bracket every kernel the autograd engine launches for
           rms_norm's backward (gx, gw and any reduction or cast kernels) and
           the gaps between them; not the forward. gw comes back in w's dtype.
  decode   20 calls captured in one torch.cuda.CUDAGraph and replayed; per call
           = replay time / 20 (the vjp graph captures the 20 autograd.grad calls,
           with the forwards run before the capture).

Like the C++ benchmark, the timed calls are queued behind a torch.cuda._sleep
head start so that Python's per-call overhead stays out of the event pairs;
"b2b" is one event pair around all calls back to back (gaps included).

Bytes (minimal): forward 2*rows*D*esize + D*esize; vjp 3*rows*D*esize + 2*D*esize.
Ceiling: dst.copy_(src) of a 1 GiB tensor, read + write bytes, median of 20.
Inputs: random normal, never zeros; rotated over k sets, k = ceil(max(200 MiB,
3 x L2) / forward bytes), so that no call finds its inputs in L2.

Exits 0 with a message when torch or CUDA is missing (and writes a JSON that
says so when --json is given).
"""

import argparse
import json
import math
import sys
import time

from run_meta import COPY_BYTES, copy_times_us, driver_version, git_commit, json_safe, utc_now  # bench/run_meta.py

EPS = 1e-5
GRAPH_CALLS = 20
MIB = 1024 * 1024
SMALL_RULE_BYTES = 256 * MIB

# (rows, cols, dtype, group, base offset in elements): the list of
# bench/rmsnorm_bench.cu (kShapes), then the decode shapes (kDecode).
SHAPES = [
    (8192, 4096, "f16", "default", 0),
    (8192, 4096, "bf16", "default", 0),
    (8192, 4096, "f32", "default", 0),
    (32768, 512, "bf16", "default", 0),
    (32768, 384, "f16", "default", 0),
    (131072, 128, "bf16", "default", 0),
    (16384, 7168, "bf16", "default", 0),
    (4096, 16384, "bf16", "default", 0),
    (1024, 65536, "bf16", "default", 0),
    (1024, 262144, "bf16", "default", 0),
    (16384, 4096, "f16", "extra", 0),
    (131072, 1024, "bf16", "extra", 0),
    (262144, 512, "bf16", "extra", 0),
    (524288, 384, "f16", "extra", 0),
    (1048576, 128, "bf16", "extra", 0),
    (8192, 4096, "bf16", "slow_path", 1),
    (8192, 4095, "bf16", "slow_path", 0),
]
DECODE = [(1, 4096, "bf16"), (128, 4096, "bf16")]


def write_json(path, doc):
    if not path:
        return
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"\nwrote {path}")


def skip(args, reason):
    print(f"torch_bench: skipped: {reason}")
    write_json(args.json, {"tool": "torch_bench", "skipped": reason, "date_utc": utc_now(),
                           "commit": git_commit(args.commit), "cases": []})
    return 0


def quantile(sorted_vals, q):
    if not sorted_vals:
        return float("nan")
    pos = q * (len(sorted_vals) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (pos - lo) * (sorted_vals[hi] - sorted_vals[lo])


def summarize(us, b2b=float("nan")):
    s = sorted(us)
    return {"reps": len(s), "median_us": quantile(s, 0.5), "p10_us": quantile(s, 0.1), "p90_us": quantile(s, 0.9),
            "min_us": s[0] if s else float("nan"), "mean_us": sum(s) / len(s) if s else float("nan"), "b2b_us": b2b}


class Bench:
    def __init__(self, torch, args):
        self.torch = torch
        self.F = torch.nn.functional
        self.args = args
        self.dev = torch.device("cuda")
        props = torch.cuda.get_device_properties(0)
        self.props = props
        self.l2 = int(getattr(props, "L2_cache_size", 60 * 10**6))
        self.rotation_bytes = max(200 * MIB, 3 * self.l2)
        self.dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
        self.copy_gbps = float("nan")
        self.cases = []

    # ---- timing ----------------------------------------------------------------------------

    def head_start(self, calls, host_us_per_call):
        # torch.cuda._sleep spins for a number of cycles; 2000 cycles is about
        # 1 us at the H200's 1.98 GHz (longer at lower clocks, which is harmless).
        sleep = getattr(self.torch.cuda, "_sleep", None)
        if sleep is None:
            return 0.0
        us = min(100000.0, max(2000.0, host_us_per_call * calls))
        sleep(int(us * 2000))
        return us / 1e3

    def time_calls(self, fn, nsets, host_us_per_call):
        torch = self.torch
        reps = self.args.reps
        i = 0
        t0 = time.perf_counter()
        while True:
            for _ in range(max(nsets, 8)):
                fn(i % nsets)
                i += 1
            torch.cuda.synchronize()
            if (time.perf_counter() - t0) * 1e3 >= self.args.warm_ms:
                break
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        stops = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        lead_ms = self.head_start(reps, host_us_per_call)
        q0 = time.perf_counter()
        for r in range(reps):
            starts[r].record()
            fn(i % nsets)
            i += 1
            stops[r].record()
        queue_ms = (time.perf_counter() - q0) * 1e3
        torch.cuda.synchronize()
        us = [1e3 * a.elapsed_time(b) for a, b in zip(starts, stops)]
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        self.head_start(reps, host_us_per_call)
        e0.record()
        for _ in range(reps):
            fn(i % nsets)
            i += 1
        e1.record()
        torch.cuda.synchronize()
        st = summarize(us, 1e3 * e0.elapsed_time(e1) / reps)
        # When queueing outran the head start, the GPU may have waited on
        # Python inside an event pair: those times can be too high.
        st["host_us_per_call"] = 1e3 * queue_ms / reps
        st["host_bound"] = queue_ms > lead_ms
        return st

    def time_graph(self, graph):
        torch = self.torch
        reps = max(self.args.reps, 50)
        t0 = time.perf_counter()
        n = 0
        while n < 10 or (time.perf_counter() - t0) * 1e3 < self.args.warm_ms:
            graph.replay()
            torch.cuda.synchronize()
            n += 1
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        stops = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        self.head_start(reps, 50.0)
        for r in range(reps):
            starts[r].record()
            graph.replay()
            stops[r].record()
        torch.cuda.synchronize()
        return summarize([1e3 * a.elapsed_time(b) / GRAPH_CALLS for a, b in zip(starts, stops)])

    def measure_copy(self):
        st = summarize(copy_times_us(self.torch, self.dev, self.args.copy_reps))
        return st, 2.0 * COPY_BYTES / st["median_us"] / 1e3

    # ---- operands --------------------------------------------------------------------------

    def randn(self, rows, cols, dtype, offset):
        """rows x cols normal values whose base is `offset` elements into its allocation."""
        buf = self.torch.randn(rows * cols + offset, dtype=dtype, device=self.dev)
        return buf[offset:].view(rows, cols)

    def record(self, group, op, variant, rows, cols, dt, nbytes, sets, st, graph=False, error=""):
        gbps = nbytes / st["median_us"] / 1e3 if st and st["median_us"] == st["median_us"] else float("nan")
        c = {"group": group, "op": op, "variant": variant, "rows": rows, "cols": cols, "dtype": dt,
             "bytes": nbytes, "sets": sets, "graph": graph, "calls_per_graph": GRAPH_CALLS if graph else 0,
             "us": st["median_us"] if st else float("nan"), "stats": st, "gbps": gbps,
             "pct_copy": 100.0 * gbps / self.copy_gbps, "error": error}
        self.cases.append(c)
        shape = f"{rows}x{cols}"
        if error:
            print(f"{op:<16} {shape:<13} {dt:<5} {variant:<14}  ERROR: {error}", flush=True)
            return
        b2b = "-" if st["b2b_us"] != st["b2b_us"] else f"{st['b2b_us']:.2f}"
        rng = f"{st['p10_us']:.2f}..{st['p90_us']:.2f}"
        small = " (small)" if nbytes < SMALL_RULE_BYTES and not graph else ""
        host = "  HOST-BOUND: times may include Python's queueing" if st.get("host_bound") else ""
        print(f"{op:<16} {shape:<13} {dt:<5} {variant:<14} {st['median_us']:10.2f} {rng:>19} {b2b:>9} "
              f"{gbps:9.1f} {c['pct_copy']:6.1f}%{small}{host}", flush=True)

    # ---- cases -----------------------------------------------------------------------------

    def run_shape(self, rows, cols, dt, group, offset):
        torch, F = self.torch, self.F
        dtype = self.dtypes[dt]
        esize = torch.empty((), dtype=dtype).element_size()
        fwd_bytes = 2 * rows * cols * esize + cols * esize
        vjp_bytes = 3 * rows * cols * esize + 2 * cols * esize
        # Named as in rmsnorm_bench: base+Nelem (every row start off 16 bytes),
        # unaligned_rows (D * esize % 16 != 0), aligned.
        variant = (f"base+{offset}elem" if offset else "unaligned_rows" if (cols * esize) % 16 else "aligned")
        k = max(1, min(1024, math.ceil(self.rotation_bytes / fwd_bytes)))
        # Per set: x, gy, y (kept for the vjp), gx and the saved rstd; half of free memory at most.
        free, _ = torch.cuda.mem_get_info()
        set_bytes = 4 * rows * cols * esize + 4 * rows
        k_mem = int(free * 0.5 // set_bytes)
        if k_mem < 1:
            self.record(group, "forward", variant, rows, cols, dt, fwd_bytes, 0, None, error="not enough device memory")
            return
        k = min(k, k_mem)
        xs = [self.randn(rows, cols, dtype, offset) for _ in range(k)]
        gys = [self.randn(rows, cols, dtype, offset) for _ in range(k)]
        w = (1.0 + 0.25 * torch.randn(cols, dtype=torch.float32, device=self.dev)).to(dtype)

        def fwd(i):
            with torch.no_grad():
                return F.rms_norm(xs[i], (cols,), w, EPS)

        st = self.time_calls(fwd, k, 30.0)
        self.record(group, "forward", variant, rows, cols, dt, fwd_bytes, k, st)

        # detach() keeps the (possibly offset) storage and makes a leaf that requires grad.
        xl = [x.detach().requires_grad_(True) for x in xs]
        wl = w.detach().requires_grad_(True)
        ys = [F.rms_norm(x, (cols,), wl, EPS) for x in xl]

        def vjp(i):
            return torch.autograd.grad(ys[i], [xl[i], wl], gys[i], retain_graph=True)

        try:
            st = self.time_calls(vjp, k, 150.0)
            self.record(group, "vjp", variant, rows, cols, dt, vjp_bytes, k, st)
        except RuntimeError as e:  # an op without a backward on this build, say
            self.record(group, "vjp", variant, rows, cols, dt, vjp_bytes, k, None, error=str(e).splitlines()[0])
        del xs, gys, xl, ys
        torch.cuda.empty_cache()

    def run_decode(self, rows, cols, dt):
        torch, F = self.torch, self.F
        dtype = self.dtypes[dt]
        esize = torch.empty((), dtype=dtype).element_size()
        # One set per captured call; these fit in L2, as a decode step's activations do.
        xs = [self.randn(rows, cols, dtype, 0) for _ in range(GRAPH_CALLS)]
        gys = [self.randn(rows, cols, dtype, 0) for _ in range(GRAPH_CALLS)]
        w = (1.0 + 0.25 * torch.randn(cols, dtype=torch.float32, device=self.dev)).to(dtype)
        cap = torch.cuda.Stream()
        cap.wait_stream(torch.cuda.current_stream())
        fwd_bytes = 2 * rows * cols * esize + cols * esize
        vjp_bytes = 3 * rows * cols * esize + 2 * cols * esize

        # Forward graph; warm-up on the capture stream first (as torch.cuda.graph requires).
        try:
            with torch.cuda.stream(cap), torch.no_grad():
                for _ in range(3):
                    [F.rms_norm(x, (cols,), w, EPS) for x in xs]
            torch.cuda.current_stream().wait_stream(cap)
            g = torch.cuda.CUDAGraph()
            with torch.no_grad(), torch.cuda.graph(g, stream=cap):
                outs = [F.rms_norm(x, (cols,), w, EPS) for x in xs]
            st = self.time_graph(g)
            self.record("decode", "decode_forward", "aligned", rows, cols, dt, fwd_bytes, GRAPH_CALLS, st, graph=True)
            del g, outs
        except RuntimeError as e:
            self.record("decode", "decode_forward", "aligned", rows, cols, dt, fwd_bytes, GRAPH_CALLS, None,
                        graph=True, error="graph capture failed: " + str(e).splitlines()[0])

        # VJP graph: the forwards run on the capture stream (autograd runs a
        # backward op on its forward's stream), then the 20 grads are captured.
        try:
            xl = [x.detach().requires_grad_(True) for x in xs]
            wl = w.detach().requires_grad_(True)
            with torch.cuda.stream(cap):
                ys = [F.rms_norm(x, (cols,), wl, EPS) for x in xl]
                for _ in range(3):
                    for j in range(GRAPH_CALLS):
                        torch.autograd.grad(ys[j], [xl[j], wl], gys[j], retain_graph=True)
            torch.cuda.current_stream().wait_stream(cap)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=cap):
                grads = [torch.autograd.grad(ys[j], [xl[j], wl], gys[j], retain_graph=True) for j in range(GRAPH_CALLS)]
            st = self.time_graph(g)
            self.record("decode", "decode_vjp", "aligned", rows, cols, dt, vjp_bytes, GRAPH_CALLS, st, graph=True)
            del g, grads
        except RuntimeError as e:
            self.record("decode", "decode_vjp", "aligned", rows, cols, dt, vjp_bytes, GRAPH_CALLS, None,
                        graph=True, error="graph capture failed: " + str(e).splitlines()[0])
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=100, help="timed calls per case (default 100)")
    ap.add_argument("--quick", action="store_true", help="20 reps, short warm-up, no extra shapes (smoke)")
    ap.add_argument("--shapes", default="", help='only shapes whose "ROWSxCOLS dtype group" contains this')
    ap.add_argument("--no-extra", action="store_true", help="skip the extra large-data shapes")
    ap.add_argument("--json", default="", help="write the results here")
    ap.add_argument("--commit", default="", help="commit recorded in the JSON (default $RMSNORM_COMMIT or git)")
    args = ap.parse_args()
    args.copy_reps = 20
    args.warm_ms = 30.0
    if args.quick:
        if "--reps" not in sys.argv:
            args.reps = 20
        args.copy_reps = 5
        args.warm_ms = 5.0
        args.no_extra = True

    try:
        import torch
    except ImportError as e:
        return skip(args, f"torch not importable ({e})")
    if not torch.cuda.is_available():
        return skip(args, "torch has no CUDA device")
    if not hasattr(torch.nn.functional, "rms_norm"):
        return skip(args, f"torch {torch.__version__} has no torch.nn.functional.rms_norm")

    b = Bench(torch, args)
    props = b.props
    print(f"torch_bench  torch {torch.__version__} (CUDA {torch.version.cuda})  {props.name}  "
          f"SMs {props.multi_processor_count}  L2 {b.l2 / 1e6:.0f} MB")
    print(f"reps {args.reps}{' (quick: not for reporting)' if args.quick else ''}; operands rotated over >= "
          f"{b.rotation_bytes / MIB:.0f} MiB; random normal data; eps {EPS}")
    copy_st, b.copy_gbps = b.measure_copy()
    print(f"copy ceiling: tensor.copy_ 1 GiB, read+write, median of {copy_st['reps']}: "
          f"{copy_st['median_us']:.1f} us -> {b.copy_gbps:.1f} GB/s")
    print(f"\n{'case':<16} {'shape':<13} {'dtype':<5} {'variant':<14} {'us(med)':>10} {'p10..p90':>19} "
          f"{'b2b us':>9} {'GB/s':>9} {'%copy':>7}")
    print("-" * 111)

    def selected(rows, cols, dt, group):
        if args.no_extra and group == "extra":
            return False
        return args.shapes in f"{rows}x{cols} {dt} {group}"

    fatal = None
    try:
        for rows, cols, dt, group, offset in SHAPES:
            if selected(rows, cols, dt, group):
                b.run_shape(rows, cols, dt, group, offset)
        for rows, cols, dt in DECODE:
            if selected(rows, cols, dt, "decode"):
                b.run_decode(rows, cols, dt)
    except Exception as e:  # keep what was measured; the JSON says what broke
        fatal = f"{type(e).__name__}: {e}"
        print(f"torch_bench: FATAL: {fatal}", file=sys.stderr)
    copy_end, copy_gbps_end = b.measure_copy()
    print(f"\ncopy ceiling again at the end: {copy_gbps_end:.1f} GB/s (start {b.copy_gbps:.1f} GB/s)")

    doc = {
        "tool": "torch_bench",
        "torch_version": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "date_utc": utc_now(),
        "commit": git_commit(args.commit),
        "gpu": {"name": props.name, "sm_count": props.multi_processor_count, "l2_bytes": b.l2,
                "memory_bytes": props.total_memory, "compute_capability": f"{props.major}.{props.minor}"},
        "driver_version": driver_version(),
        "method": {"timing": "CUDA events around each call behind a _sleep head start, after warm-up; "
                             "median/p10/p90; b2b = one event pair around all calls",
                   "forward": "F.rms_norm(x, (D,), w, eps) under no_grad",
                   "vjp": "torch.autograd.grad(y, [x, w], gy, retain_graph=True); y computed outside timing",
                   "decode": "20 calls per torch.cuda.CUDAGraph, per call = replay / 20",
                   "reps": args.reps, "quick": args.quick, "rotation_min_bytes": b.rotation_bytes, "eps": EPS,
                   "bytes": "forward 2*rows*D*esize + D*esize; vjp 3*rows*D*esize + 2*D*esize"},
        "copy": {"bytes_per_copy": 2.0 * (1 << 30), "gbps": b.copy_gbps, "stats": copy_st,
                 "gbps_end": copy_gbps_end, "stats_end": copy_end},
        "cases": b.cases,
        "fatal_error": fatal,
    }
    write_json(args.json, json_safe(doc))
    return 1 if fatal else 0


if __name__ == "__main__":
    sys.exit(main())
