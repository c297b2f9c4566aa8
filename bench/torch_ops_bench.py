#!/usr/bin/env python3
"""The rmsnorm PyTorch package against the RMSNorm a PyTorch user would pick instead, side by side in one run.

Implementations (all on the same tensors, w of x's dtype, or with --weight-dtype f32 an fp32 w with 16-bit x (the
master weights of mixed precision; rmsnorm then runs RMSNORM_FLAG_WEIGHT_F32), eps 1e-5):
  rmsnorm           rmsnorm.rms_norm (the package's C++ operators), eager
  rmsnorm+compile   the same inside torch.compile(fullgraph=True)
  F.rms_norm        torch.nn.functional.rms_norm, eager
  compile(formula)  torch.compile of the eager formula in fp32, one rounding:
                    (x.float() * rsqrt(mean(x.float()^2) + eps) * w.float()).to(x.dtype)
  liger             Liger's LigerRMSNormFunction (casting_mode="llama", in_place=False), when liger_kernel imports
  rmsnorm(no PDL)   diagnostic, not a peer: the package's operators called directly with RMSNORM_FLAG_NO_PDL (plain
                    launches; by default each kernel is a programmatic dependent of the previous one, which CUPTI
                    may see start before that one ends)

Directions: forward (under torch.no_grad()); backward (the VJP alone: y = f(x, w) computed once outside the timed
region with x and w requiring grad, then torch.autograd.grad(y, [x, w], gy, retain_graph=True): the backward of a
retained graph, rstd or whatever the implementation saved given); fwd+bwd (y = f(x, w), then
torch.autograd.grad(y, [x, w], gy): one forward and one backward per call).

What is measured, per case:
  kernel_us  device time from the call's first kernel start (or the end of the marker before it, if later: see
             call_spans) to its last kernel (or memset/memcpy) end, read from CUPTI through torch.profiler, with the
             L2 flushed before every call (a 256 MiB buffer written with the L2 evict_last policy and set back to
             normal priority, then another 256 MiB zeroed: bench/l2_flush.py says why; zeroing alone left Inductor's
             evict_last inputs cached); a
             torch.cuda._sleep marker before and after each call delimits its kernels and gives the GPU a head start,
             so that launch gaps inside a multi-kernel op are the GPU's, not Python's. Median of --reps calls.
  stream_us  the same calls' time from the end of the marker before (the previous kernel on the stream) to the last
             kernel end: kernel_us plus the launch gap in front of the first kernel, the same definition for every
             implementation. A plain launch's gap lies outside kernel_us. A programmatic dependent's (ours by
             default) lies inside it where CUPTI dates its start before the marker's end (lead_us <= 0), which
             charges ours, and only ours, its launch gap in kernel_us (bench/pdl_probe.cu times that gap from
             inside the kernels); stream_us charges every implementation its own. The summary gives a verdict in
             each.
  lead_us    diagnostic: the call's first CUPTI start minus the marker's end (negative: dated before it ended).
  call_us    CUDA events around each call, L2 flushed before it (outside the events), no head start: includes launch
             latency and Python's time where the host is the bottleneck. Median.
  host       at 1 x 4096 only: wall time per call of back-to-back calls (no flush, no sync between them), and that
             minus kernel_us: the eager host overhead per call. It must stay within 1.5x of F.rms_norm's. Ours and
             F.rms_norm are timed in interleaved rounds (HOST_ROUNDS rounds of HOST_CALLS calls each, in turn), the
             median per implementation reported, and the ratio is the median of the rounds' ratios.
Bytes (minimal): forward (2nD + D) * esize (read x, w, write y), backward (3nD + 2D) * esize (read x, gy, w, write
gx, gw), fwd+bwd (5nD + 3D) * esize. GB/s = bytes / kernel_us. The ceiling: dst.copy_(src) of 1 GiB, read + write
bytes, in the same run.

Verdict per shape and direction (the summary): ours (rmsnorm, eager) against the fastest peer, in kernel time and
again in stream time: "ahead" where ours is faster, "tie at ceiling" where it is at most 1% slower and that peer runs
at >= 97% of the copy ceiling, else "BEHIND" (by the ratio).

--profile: no timing; after warm-up, each selected (shape, implementation, direction) runs once between
cudaProfilerStart and cudaProfilerStop, for `ncu --profile-from-start off` to profile those kernels alone (in the
order the script prints them).

Output: a table on stdout, --json FILE (all cases, the GPU, driver, CUDA, torch, commit, date; for bench/results/),
--png FILE (GB/s against D per implementation and direction, the copy ceiling drawn). Exits 0 with a message, and a
JSON that says so, without CUDA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from run_meta import COPY_BYTES, copy_times_us, driver_version, git_commit, json_safe, utc_now  # bench/run_meta.py

EPS = 1e-5
MIB = 1024 * 1024
FLUSH_BYTES = 256 * MIB
HOST_SHAPE = (1, 4096, "bf16")
HOST_RATIO_LIMIT = 1.5
HOST_IMPLS = ("rmsnorm", "F.rms_norm")  # the eager host overhead at HOST_SHAPE: ours against F.rms_norm's
HOST_ROUNDS = 15
HOST_CALLS = 400

TIE_CEILING_PCT = 97.0
TIE_RATIO = 1.01

# The 14 shapes of the forward-speed comparison: bench/torch_bench.py's default group and two of its extra shapes
# (the library benchmark's list), then decode.
SHAPES = [
    (8192, 4096, "f16"),
    (8192, 4096, "bf16"),
    (8192, 4096, "f32"),
    (32768, 512, "bf16"),
    (32768, 384, "f16"),
    (131072, 128, "bf16"),
    (16384, 7168, "bf16"),
    (4096, 16384, "bf16"),
    (1024, 65536, "bf16"),
    (262144, 512, "bf16"),
    (1048576, 128, "bf16"),
    (1024, 262144, "bf16"),
    (1, 4096, "bf16"),
    (128, 4096, "bf16"),
]
QUICK_SHAPES = [(8192, 4096, "f16"), (32768, 512, "bf16"), (1, 4096, "bf16")]
IMPLS = ["rmsnorm", "rmsnorm+compile", "F.rms_norm", "compile(formula)", "liger", "rmsnorm(no PDL)"]
DIRECTIONS = ["forward", "backward", "fwd+bwd"]
FLAG_NO_PDL = 4  # RMSNORM_FLAG_NO_PDL (include/rmsnorm/rmsnorm.h)


def package_version(name):
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001  (not installed as a distribution)
        return None


def write_json(path, doc):
    if path:
        with open(path, "w") as f:
            json.dump(json_safe(doc), f, indent=1)
            f.write("\n")
        print(f"wrote {path}")


class Bench:
    def __init__(self, torch, args):
        self.torch = torch
        self.args = args
        self.dev = torch.device("cuda")
        self.dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
        from l2_flush import make_flush  # bench/l2_flush.py

        self.flush, self.flush_method = make_flush(torch, FLUSH_BYTES)
        self.cases = []
        self.impls = {}
        import rmsnorm

        self.rmsnorm = rmsnorm
        try:
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction

            self.liger = LigerRMSNormFunction
        except Exception as e:  # noqa: BLE001  (any import failure means: not available)
            self.liger = None
            self.liger_error = f"{type(e).__name__}: {e}"

    # ---- implementations -------------------------------------------------------------------

    def make(self, impl, cols):
        """f(x, w) -> y for one shape; compiled variants compile afresh per shape (static shapes, as a user with
        one model gets them)."""
        torch, rmsnorm = self.torch, self.rmsnorm
        if impl == "rmsnorm":
            return lambda x, w: rmsnorm.rms_norm(x, (cols,), w, EPS)
        if impl == "rmsnorm+compile":
            return torch.compile(lambda x, w: rmsnorm.rms_norm(x, (cols,), w, EPS), fullgraph=True, dynamic=False)
        if impl == "F.rms_norm":
            return lambda x, w: torch.nn.functional.rms_norm(x, (cols,), w, EPS)
        if impl == "compile(formula)":
            def formula(x, w):
                xf = x.float()
                return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)

            return torch.compile(formula, fullgraph=True, dynamic=False)
        if impl == "liger":
            if self.liger is None:
                raise RuntimeError(f"liger_kernel not importable ({self.liger_error})")
            fn = self.liger
            return lambda x, w: fn.apply(x, w, EPS, 0.0, "llama", False)
        raise ValueError(impl)

    # ---- timing ----------------------------------------------------------------------------

    def kernel_times(self, call):
        """Device span of each call's kernels (us), L2 flushed before each, from CUPTI."""
        torch = self.torch
        from torch.profiler import ProfilerActivity, profile

        reps = self.args.reps
        head_start = self.head_start_cycles(call)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                self.flush()
                # The marker before, and a head start longer than the host's time for one call (autograd's
                # backward included), so that the call's kernels queue without gaps.
                torch.cuda._sleep(head_start)
                call()
                torch.cuda._sleep(1)  # the marker after
            torch.cuda.synchronize()
        acts = [(e.start_ns(), e.end_ns(), e.name()) for e in prof.profiler.kineto_results.events()
                if e.device_type() == torch.autograd.DeviceType.CUDA]
        spans = call_spans(acts)
        if len(spans) != reps:
            raise RuntimeError(f"profiler: {len(spans)} call spans found for {reps} calls")
        return spans  # (kernel_us, stream_us, lead_us) per call

    def head_start_cycles(self, call):
        """GPU cycles for kernel_times' head start: three times the host's time for one call (the slowest of three,
        measured without the profiler, which adds to it), counted at 1.98 GHz (the H200's boost clock; a slower
        clock only lengthens it), at least 400000 (about 200 us) and at most 20 times that. At one row an autograd
        forward and backward can take the host more than 200 us, and a shorter head start lets the span include
        the host's gaps."""
        torch = self.torch
        worst = 0.0
        for _ in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            call()
            worst = max(worst, time.perf_counter() - t0)
        torch.cuda.synchronize()
        return min(max(400000, int(3.0 * worst * 1.98e9)), 20 * 400000)

    def event_times(self, call):
        torch = self.torch
        reps = self.args.reps
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        stops = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for r in range(reps):
            self.flush()
            starts[r].record()
            call()
            stops[r].record()
        torch.cuda.synchronize()
        return [1e3 * a.elapsed_time(b) for a, b in zip(starts, stops)]

    def wall_per_call(self, call, n):
        torch = self.torch
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n * 1e6

    def host_overheads(self, host_calls, directions, rounds=HOST_ROUNDS, n=HOST_CALLS):
        """Wall time per call of back-to-back calls, ours and F.rms_norm interleaved: `rounds` rounds, each timing
        every implementation for n calls in turn, so that drift of the host (clock, other load) falls on both alike.
        Who goes first alternates between rounds. Per implementation the median over rounds; the ratio is the median
        of the rounds' ratios (so not always the ratio of the two medians)."""
        for d in directions:
            pair = [host_calls.get((impl, d)) for impl in HOST_IMPLS]
            if any(p is None for p in pair):
                continue
            for call, _ in pair:
                for _ in range(50):
                    call()
            walls = [[], []]
            for r in range(rounds):
                for i in ((0, 1) if r % 2 == 0 else (1, 0)):  # who goes first alternates
                    walls[i].append(self.wall_per_call(pair[i][0], n))
            ratios = [(a - pair[0][1]["kernel_us"]) / (b - pair[1][1]["kernel_us"]) for a, b in zip(*walls)]
            for (_, case), w in zip(pair, walls):
                case["host_wall_us_per_call"] = statistics.median(w)
                case["host_overhead_us"] = case["host_wall_us_per_call"] - case["kernel_us"]
                case["host_wall_us_rounds"] = w
            pair[0][1]["host_ratio_rounds"] = ratios
            pair[0][1]["host_ratio_median"] = statistics.median(ratios)
            print(f"host 1x4096 {d}: ours {pair[0][1]['host_overhead_us']:.2f} us, F.rms_norm "
                  f"{pair[1][1]['host_overhead_us']:.2f} us over kernel time; median ratio of {rounds} interleaved "
                  f"rounds {pair[0][1]['host_ratio_median']:.2f} (rounds {min(ratios):.2f}-{max(ratios):.2f})", flush=True)

    # ---- cases -----------------------------------------------------------------------------

    def calls_of(self, impl, f, x, w, gy, xl, wl):
        """{direction: call} for one implementation on one shape's tensors."""
        torch = self.torch
        if impl == "rmsnorm(no PDL)":
            fwd_op, bwd_op = torch.ops.rmsnorm.forward.default, torch.ops.rmsnorm.backward.default
            _, rstd = fwd_op(x, w, EPS, FLAG_NO_PDL)

            def fwd():
                return fwd_op(x, w, EPS, FLAG_NO_PDL)[0]

            def bwd():
                return bwd_op(gy, x, w, rstd, FLAG_NO_PDL, w.dtype)

            def fwd_bwd():
                _, r = fwd_op(x, w, EPS, FLAG_NO_PDL)
                return bwd_op(gy, x, w, r, FLAG_NO_PDL, w.dtype)

            return {"forward": fwd, "backward": bwd, "fwd+bwd": fwd_bwd}

        def fwd():
            with torch.no_grad():
                return f(x, w)

        retained = {}

        def bwd():
            if "y" not in retained:  # once, outside the timed calls (the warm-up makes it)
                retained["y"] = f(xl, wl)
            return torch.autograd.grad(retained["y"], [xl, wl], gy, retain_graph=True)

        def fwd_bwd():
            y = f(xl, wl)
            return torch.autograd.grad(y, [xl, wl], gy)

        return {"forward": fwd, "backward": bwd, "fwd+bwd": fwd_bwd}

    def run_shape(self, rows, cols, dt, impls, directions, copy_gbps):
        torch = self.torch
        dtype = self.dtypes[dt]
        esize = torch.empty((), dtype=dtype).element_size()
        gen = torch.Generator(device=self.dev).manual_seed(rows * 131 + cols)
        x = torch.randn(rows, cols, dtype=dtype, device=self.dev, generator=gen)
        gy = torch.randn(rows, cols, dtype=dtype, device=self.dev, generator=gen)
        wdtype = torch.float32 if self.args.weight_dtype == "f32" else dtype
        w = (1.0 + 0.25 * torch.randn(cols, device=self.dev, generator=gen)).to(wdtype)
        wsize = w.element_size()
        xl = x.detach().requires_grad_(True)
        wl = w.detach().requires_grad_(True)
        nbytes = {"forward": 2 * rows * cols * esize + cols * wsize,
                  "backward": 3 * rows * cols * esize + 2 * cols * wsize,
                  "fwd+bwd": 5 * rows * cols * esize + 3 * cols * wsize}
        host_calls = {}  # (impl, direction) -> (call, its case): timed together after the loop
        for impl in impls:
            try:
                f = None if impl == "rmsnorm(no PDL)" else self.make(impl, cols)
                calls = self.calls_of(impl, f, x, w, gy, xl, wl)
            except Exception as e:  # noqa: BLE001
                for d in directions:
                    self.record(impl, d, rows, cols, dt, nbytes[d], copy_gbps, error=str(e).splitlines()[0])
                continue
            for d in directions:
                call = calls[d]
                try:
                    for _ in range(3):  # compiles on the first call
                        call()
                    torch.cuda.synchronize()
                    if self.args.profile:
                        torch.cuda.profiler.start()
                        call()
                        torch.cuda.synchronize()
                        torch.cuda.profiler.stop()
                        print(f"profiled {rows}x{cols} {dt} {impl} {d}", flush=True)
                        continue
                    k = self.kernel_times(call)
                    ev = self.event_times(call)
                    self.record(impl, d, rows, cols, dt, nbytes[d], copy_gbps, k, ev)
                    if (rows, cols, dt) == HOST_SHAPE and impl in HOST_IMPLS:
                        host_calls[(impl, d)] = (call, self.cases[-1])
                except Exception as e:  # noqa: BLE001  (Liger above 65536 columns, say)
                    torch.cuda.synchronize()
                    self.record(impl, d, rows, cols, dt, nbytes[d], copy_gbps, error=str(e).splitlines()[0][:200])
            del f, calls
            torch._dynamo.reset()
        try:
            self.host_overheads(host_calls, directions)
        except Exception as e:  # noqa: BLE001  (recorded, the run goes on)
            torch.cuda.synchronize()
            for _, case in host_calls.values():
                case["host_error"] = str(e).splitlines()[0][:200]
            print(f"host overhead: ERROR: {e}", flush=True)
        host_calls.clear()
        del x, gy, w, xl, wl
        torch.cuda.empty_cache()

    def record(self, impl, direction, rows, cols, dt, nbytes, copy_gbps, k=None, ev=None, error=""):
        c = {"impl": impl, "direction": direction, "rows": rows, "cols": cols, "dtype": dt, "bytes": nbytes,
             "error": error}
        if not error:
            ks, es = sorted(s[0] for s in k), sorted(ev)
            med = statistics.median(ks)
            stream = statistics.median(s[1] for s in k)
            c.update({
                "kernel_us": med, "kernel_p10_us": ks[len(ks) // 10], "kernel_p90_us": ks[(9 * len(ks)) // 10],
                "stream_us": stream, "lead_us": statistics.median(s[2] for s in k),
                "call_us": statistics.median(es), "gbps": nbytes / med / 1e3,
            })
            c["pct_copy"] = 100.0 * c["gbps"] / copy_gbps
            c["stream_pct_copy"] = 100.0 * nbytes / stream / 1e3 / copy_gbps
        self.cases.append(c)
        shape = f"{rows}x{cols}"
        if error:
            print(f"{shape:<13} {dt:<5} {direction:<8} {impl:<17} ERROR: {error}", flush=True)
            return
        print(f"{shape:<13} {dt:<5} {direction:<8} {impl:<17} {c['kernel_us']:9.2f} {c['stream_us']:9.2f} "
              f"{c['lead_us']:7.2f} {c['call_us']:9.2f} {c['gbps']:8.1f} {c['pct_copy']:6.1f}%", flush=True)

    def measure_copy(self):
        med = statistics.median(copy_times_us(self.torch, self.dev, 20))
        return med, 2.0 * COPY_BYTES / med / 1e3


def call_spans(acts):
    """(start_ns, end_ns, name) of every device activity -> per call (the activities between a pair of spin_kernel
    markers, before and after it), in us: (kernel, stream, lead). kernel: the first start to the last end; a start
    before the end of the marker before counts from that end (a programmatic dependent, ours by default, is
    launched while the marker finishes, and CUPTI may date its start from then). stream: the marker's end to the
    last end. lead: the first start minus the marker's end."""
    spans, inside, first, last, marker_end = [], False, None, None, None
    for start, end, name in sorted(acts):
        if "spin_kernel" in name:
            if inside and first is not None:
                spans.append(((last - max(first, marker_end)) / 1e3, (last - marker_end) / 1e3,
                              (first - marker_end) / 1e3))
            inside, first, last = not inside, None, None
            marker_end = end
        elif inside:
            first = start if first is None else min(first, start)
            last = end if last is None else max(last, end)
    return spans


def verdict(ours, best_us, best_pct):
    """Ours against the fastest peer (kernel time): ahead, tie at the ceiling, or behind."""
    if ours is None or best_us is None:
        return "-"
    if ours <= best_us:
        return "ahead"
    if ours <= TIE_RATIO * best_us and best_pct is not None and best_pct >= TIE_CEILING_PCT:
        return "tie at ceiling"
    return f"BEHIND {ours / best_us:.2f}x"


def summary_lines(cases):
    """Per shape and direction: ours, the fastest peer, the ratio and the verdict, in kernel time and then in stream
    time (each peer ranked by that time); the host check at 1 x 4096."""
    lines = []
    keyed = {}
    for c in cases:
        keyed.setdefault((c["rows"], c["cols"], c["dtype"], c["direction"]), {})[c["impl"]] = c
    fmt = lambda v, w=9, p=2: f"{v:{w}.{p}f}" if v is not None else f"{'-':>{w}}"  # noqa: E731
    for key, pct_key, title in (("kernel_us", "pct_copy", "kernel time"), ("stream_us", "stream_pct_copy",
                                                                             "stream time")):
        lines.append(f"{title}:")
        lines.append(f"{'shape':<20} {'dir':<8} {'ours us':>9} {'%copy':>6} {'no PDL':>9} {'ours+compile':>12} "
                     f"{'best peer':>26} {'%copy':>6} {'ours/best':>9}  verdict")
        for (rows, cols, dt, d), by in keyed.items():
            ours_c = by.get("rmsnorm", {})
            ours, ours_pct = ours_c.get(key), ours_c.get(pct_key)
            nopdl = by.get("rmsnorm(no PDL)", {}).get(key)
            compiled = by.get("rmsnorm+compile", {}).get(key)
            peers = [(v[key], k, v[pct_key]) for k, v in by.items()
                     if not k.startswith("rmsnorm") and v.get(key) is not None]
            best = min(peers) if peers else (None, "-", None)
            ratio = ours / best[0] if ours and best[0] else float("nan")
            peer = f"{best[1]} {best[0]:.2f}" if best[0] is not None else "-"
            lines.append(f"{f'{rows}x{cols} {dt}':<20} {d:<8} {fmt(ours)} {fmt(ours_pct, 6, 1)} {fmt(nopdl)} "
                         f"{fmt(compiled, 12)} {peer:>26} {fmt(best[2], 6, 1)} {ratio:9.3f}  "
                         f"{verdict(ours, best[0], best[2])}")
    host = {(c["impl"], c["direction"]): c for c in cases if "host_overhead_us" in c}
    for d in DIRECTIONS:
        ours, ref = host.get(("rmsnorm", d)), host.get(("F.rms_norm", d))
        if ours is not None and ref is not None:
            ratio = ours.get("host_ratio_median", ours["host_overhead_us"] / ref["host_overhead_us"])
            ok = ratio <= HOST_RATIO_LIMIT
            lines.append(f"host overhead at 1x4096 {d}: ours {ours['host_overhead_us']:.2f} us, F.rms_norm "
                         f"{ref['host_overhead_us']:.2f} us, ratio {ratio:.2f} (median of interleaved rounds; "
                         f"{'within' if ok else 'OVER'} {HOST_RATIO_LIMIT}x)")
    return lines


def draw_png(path, cases, copy_gbps, title):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"no PNG: matplotlib not importable ({e})")
        return
    fig, axes = plt.subplots(1, len(DIRECTIONS), figsize=(19, 5), sharey=True)
    for ax, d in zip(axes, DIRECTIONS):
        for impl in IMPLS:
            pts = sorted((c["cols"], c["gbps"], c["dtype"]) for c in cases
                         if c["impl"] == impl and c["direction"] == d and c.get("gbps") and c["rows"] > 1)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
        ax.axhline(copy_gbps, color="k", linestyle="--", linewidth=1, label=f"copy {copy_gbps:.0f} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("D (columns; rows x D from the benchmark's shapes, 1-row decode left out)")
        ax.set_title(d)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("GB/s (minimal bytes / kernel time, L2 flushed)")
    axes[1].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=50, help="calls per measurement (default 50)")
    ap.add_argument("--quick", action="store_true", help="three shapes, 20 reps (smoke)")
    ap.add_argument("--shapes", default="",
                    help='only shapes whose "ROWSxCOLS dtype" contains one of these comma-separated strings')
    ap.add_argument("--impls", default=",".join(IMPLS), help=f"comma-separated subset of {','.join(IMPLS)}")
    ap.add_argument("--directions", default=",".join(DIRECTIONS), help=f"comma-separated subset of {','.join(DIRECTIONS)}")
    ap.add_argument("--weight-dtype", choices=["same", "f32"], default="same",
                    help="the weight's dtype: x's (default), or f32 (with 16-bit x only: the f32 shapes are left out)")
    ap.add_argument("--profile", action="store_true", help="one call per case between cudaProfilerStart/Stop, for ncu; no timing")
    ap.add_argument("--json", default="", help="write the results here (e.g. bench/results/..._torch_ops.json)")
    ap.add_argument("--png", default="", help="draw GB/s against D here")
    ap.add_argument("--commit", default="", help="commit recorded in the JSON (default $RMSNORM_COMMIT or git)")
    args = ap.parse_args()
    if args.quick and "--reps" not in sys.argv:
        args.reps = 20
    meta = {"tool": "torch_ops_bench", "date_utc": utc_now(), "commit": git_commit(args.commit),
            "weight_dtype": args.weight_dtype}

    try:
        import torch
    except ImportError as e:
        print(f"torch_ops_bench: skipped: torch not importable ({e})")
        write_json(args.json, {**meta, "skipped": "no torch", "cases": []})
        return 0
    if not torch.cuda.is_available():
        print("torch_ops_bench: skipped: no CUDA device")
        write_json(args.json, {**meta, "skipped": "no CUDA device", "cases": []})
        return 0

    b = Bench(torch, args)
    if not b.rmsnorm.cuda_built():
        print("torch_ops_bench: the installed rmsnorm has no CUDA backend (pip install . with nvcc and a CUDA torch)")
        return 1
    props = torch.cuda.get_device_properties(0)
    meta.update({"gpu": props.name, "sms": props.multi_processor_count, "driver": driver_version(),
                 "cuda": torch.version.cuda, "torch": torch.__version__,
                 "liger": package_version("liger-kernel") if b.liger else None,
                 "reps": args.reps, "eps": EPS, "l2_flush_bytes": FLUSH_BYTES,  # per buffer
                 "l2_flush": b.flush_method})
    copy_us, copy_gbps = b.measure_copy()
    meta["copy_1gib_us"], meta["copy_gbps"] = copy_us, copy_gbps
    print(f"{props.name}, driver {meta['driver']}, CUDA {torch.version.cuda}, torch {torch.__version__}, "
          f"commit {meta['commit']}; copy ceiling {copy_gbps:.0f} GB/s (1 GiB, read + write)")
    if b.liger is None:
        print(f"liger: not timed ({b.liger_error})")
    impls = [i for i in args.impls.split(",") if i]
    shapes = QUICK_SHAPES if args.quick else SHAPES
    wanted = args.shapes.split(",")
    shapes = [s for s in shapes if any(w in f"{s[0]}x{s[1]} {s[2]}" for w in wanted)]
    if args.weight_dtype == "f32":
        shapes = [s for s in shapes if s[2] != "f32"]
    print(f"\n{'shape':<13} {'dtype':<5} {'dir':<8} {'impl':<17} {'kernel us':>9} {'call us':>9} {'GB/s':>8} "
          f"{'%copy':>7}")
    directions = [d for d in args.directions.split(",") if d]
    unknown = [i for i in impls if i not in IMPLS] + [d for d in directions if d not in DIRECTIONS]
    if unknown:
        print(f"torch_ops_bench: unknown implementation or direction: {', '.join(unknown)}")
        return 2
    for rows, cols, dt in shapes:
        b.run_shape(rows, cols, dt, impls, directions, copy_gbps)
    if args.profile:
        return 0
    print()
    lines = summary_lines(b.cases)
    print("\n".join(lines))
    write_json(args.json, {**meta, "cases": b.cases, "summary": lines})
    if args.png:
        draw_png(args.png, b.cases, copy_gbps,
                 f"{props.name}, torch {torch.__version__}, commit {meta['commit']}, {meta['date_utc']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
