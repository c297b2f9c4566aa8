"""Distributed training on the CPU (gloo, 2 processes): a tiny random Llama trained under DistributedDataParallel and
under FSDP2 (``fully_shard``), with our RMSNorm (``swap_rmsnorm``) and with ``torch.nn.RMSNorm``.

The reference is the HF model with each LlamaRMSNorm replaced by a ``torch.nn.RMSNorm`` of the same eps sharing the
same weight, not the unswapped model: issue 17 asks for ``torch.nn.RMSNorm``, and in fp32 LlamaRMSNorm's rounding of
x_hat to the input dtype is a no-op, so both references compute the same formula (test_models.py covers the
unswapped model). ``swap_rmsnorm`` then turns those ``torch.nn.RMSNorm`` into ours, so the two models differ in the
norm kernels only.

What had to be pinned for bitwise run-to-run and rank-to-rank equality (our forward and backward are deterministic
by construction; the rest is torch's and ours to fix):
- the model init seed, the same on every rank (FSDP2 does not broadcast parameters as DDP's constructor does);
- the data: each (rank, step) batch from its own ``torch.Generator`` seed, never the global RNG;
- one intra-op thread per process (``torch.set_num_threads(1)``): CPU GEMMs and reductions split their work by the
  thread count, which changes the summation order; two processes on 2 cores also keeps them from oversubscribing;
- ``torch.use_deterministic_algorithms(True)`` and no dropout (the config's attention_dropout is 0);
- gloo's all-reduce and reduce-scatter give every rank the same reduced bits (a fixed algorithm per size).
Two separate launches of the same processes are compared, so nothing may depend on the process or the port.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("transformers")

from dist_train import LOSS_RTOL, WORLD, _launch  # noqa: E402  (after the skip: it imports transformers)


def _fsdp2_skip_reason():
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError as e:
        return f"torch {torch.__version__} has no torch.distributed.fsdp.fully_shard ({e})"
    return None


def _assert_same_run(name, a, b):
    for i, (la, lb) in enumerate(zip(a["losses"], b["losses"])):
        assert la == lb, f"{name}: step {i} loss differs between two runs with the same seed: {la!r} vs {lb!r}"
    steps_differ = (a["per_step_params"] != b["per_step_params"]).any(dim=1).nonzero().flatten().tolist()
    for pname in a["final"]:
        x, y = a["final"][pname], b["final"][pname]
        assert torch.equal(x.view(torch.int32), y.view(torch.int32)), (
            f"{name}: parameter {pname} differs between two runs with the same seed (first differing step "
            f"{steps_differ[:1]}, max diff {(x - y).abs().max().item():.3g})"
        )
    assert not steps_differ, f"{name}: parameters differ between the two runs after steps {steps_differ}"


def _assert_losses_close(name, ours, ref):
    for i, (lo, lr) in enumerate(zip(ours["losses"], ref["losses"])):
        assert abs(lo - lr) <= LOSS_RTOL * abs(lr), (
            f"{name}: step {i} loss, ours {lo!r} vs torch.nn.RMSNorm {lr!r}: relative difference "
            f"{abs(lo - lr) / abs(lr):.3g} > {LOSS_RTOL}"
        )
    # Training moved: the comparison is not between two constant curves.
    assert ref["losses"][-1] < ref["losses"][0] - 0.05, ref["losses"]


WRAPS = ["ddp", "fsdp2"]


@pytest.fixture(scope="module")
def eager_runs(tmp_path_factory):
    """Two launches of every eager case (one seed), so run-to-run equality spans separate processes."""
    wraps = [w for w in WRAPS if w != "fsdp2" or _fsdp2_skip_reason() is None]
    cases = [(kind, wrap, False) for wrap in wraps for kind in ("ours", "ref")]
    tmp = tmp_path_factory.mktemp("dist")
    return _launch(tmp, cases), _launch(tmp, cases)


@pytest.mark.parametrize("wrap", WRAPS)
def test_train_matches_torch_rmsnorm(eager_runs, wrap):
    if wrap == "fsdp2" and _fsdp2_skip_reason():
        pytest.skip(_fsdp2_skip_reason())
    first, second = eager_runs
    for rank in range(WORLD):
        # Every rank logged the same all-reduced losses.
        assert first[rank][("ours", wrap, False)]["losses"] == first[0][("ours", wrap, False)]["losses"]
    _assert_losses_close(wrap, first[0][("ours", wrap, False)], first[0][("ref", wrap, False)])
    for kind in ("ours", "ref"):
        for rank in range(WORLD):
            _assert_same_run(f"{kind}/{wrap} rank {rank}", first[rank][(kind, wrap, False)],
                             second[rank][(kind, wrap, False)])


# Measured on 2 cores: a cold inductor compile of the two DDP models takes ~65-75 s per launch (each rank compiles
# its own forward and backward graphs with g++), and the second launch, from the inductor cache, ~17 s: 80-90 s on
# top of the eager tests' ~25 s. Run with RMSNORM_SLOW_TESTS=1 (.ci/run sets it).
@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("RMSNORM_SLOW_TESTS") != "1",
                    reason="torch.compile DDP on 2 CPU processes takes 80-90 s (cold inductor compile per rank); "
                           "set RMSNORM_SLOW_TESTS=1 to run it")
def test_train_compiled_ddp(tmp_path, monkeypatch):
    # A fresh inductor cache: the first launch compiles, the second reuses those kernels (the same code, so the
    # run-to-run comparison stays bitwise).
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    runs = tmp_path / "runs"
    runs.mkdir()
    cases = [("ours", "ddp", True), ("ref", "ddp", True)]
    first, second = _launch(runs, cases), _launch(runs, cases)
    _assert_losses_close("ddp/compiled", first[0][cases[0]], first[0][cases[1]])
    for case in cases:
        for rank in range(WORLD):
            assert first[rank][case]["losses"] == first[0][case]["losses"]
            _assert_same_run(f"{case[0]}/ddp/compiled rank {rank}", first[rank][case], second[rank][case])
