"""The peer benchmark's timing arithmetic (bench/torch_ops_bench.py), on hand-made CUPTI activity lists: what a
call's kernel, stream and lead times are, and which verdict each gives. No GPU and no torch needed."""

import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "bench")
sys.path.insert(0, os.path.abspath(BENCH))
tob = pytest.importorskip("torch_ops_bench")


def test_spans_of_a_plain_launch_a_dependent_and_two_kernels():
    # (start_ns, end_ns, name); each call sits between two spin_kernel markers.
    acts = [
        (0, 1000, "spin_kernel"),
        (2050, 5050, "plain_kernel"),       # starts 1.05 us after the marker's end, runs 3 us
        (5100, 5110, "spin_kernel"),
        (6000, 8000, "spin_kernel"),
        (7900, 11000, "dependent_kernel"),  # dated 0.1 us before the marker's end
        (11050, 11060, "spin_kernel"),
        (12000, 13000, "spin_kernel"),
        (13500, 14000, "first"),
        (14600, 15300, "second"),           # a gap of 0.6 us inside the call
        (15400, 15410, "spin_kernel"),
    ]
    spans = tob.call_spans(acts)
    assert len(spans) == 3
    expected = [(3.0, 4.05, 1.05), (3.0, 3.0, -0.1), (1.8, 2.3, 0.5)]
    for got, want in zip(spans, expected):
        assert got == pytest.approx(want, abs=1e-9), (got, want)


def test_activities_arrive_in_any_order():
    acts = [(14600, 15300, "second"), (12000, 13000, "spin_kernel"), (15400, 15410, "spin_kernel"),
            (13500, 14000, "first")]
    assert tob.call_spans(acts) == [pytest.approx((1.8, 2.3, 0.5))]


def case(impl, kernel, stream, pct=50.0):
    return {"impl": impl, "direction": "forward", "rows": 1, "cols": 4096, "dtype": "bf16", "kernel_us": kernel,
            "stream_us": stream, "pct_copy": pct, "stream_pct_copy": pct}


def test_a_verdict_in_each_time():
    # Ours behind in kernel time (2.0 against 1.6), ahead in stream time (2.1 against 2.7); the slowest peer is
    # never the one compared.
    lines = tob.summary_lines([case("rmsnorm", 2.0, 2.1), case("liger", 1.6, 2.7), case("F.rms_norm", 8.0, 9.0),
                               case("rmsnorm(no PDL)", 1.7, 2.8)])
    kernel_at, stream_at = lines.index("kernel time:"), lines.index("stream time:")
    kernel_rows = [l for l in lines[kernel_at:stream_at] if l.startswith("1x4096")]
    stream_rows = [l for l in lines[stream_at:] if l.startswith("1x4096")]
    assert len(kernel_rows) == 1 and len(stream_rows) == 1
    assert "liger 1.60" in kernel_rows[0] and kernel_rows[0].endswith("BEHIND 1.25x")
    assert "liger 2.70" in stream_rows[0] and stream_rows[0].endswith("ahead")


def test_tie_needs_a_peer_at_the_ceiling():
    assert tob.verdict(101.0, 100.0, 97.5) == "tie at ceiling"
    assert tob.verdict(101.0, 100.0, 96.0) == "BEHIND 1.01x"
    assert tob.verdict(99.0, 100.0, 50.0) == "ahead"
    assert tob.verdict(None, 100.0, 50.0) == "-"
