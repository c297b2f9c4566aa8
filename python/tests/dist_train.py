"""The distributed training run of test_distributed.py: a tiny random Llama trained in WORLD spawned processes
(gloo), its results saved per rank.

A module of its own, imported by its plain name through pytest's ``pythonpath`` (python/tests): a spawned worker
unpickles ``_worker`` by its module's name, and pytest's importlib mode names a test module after its path from the
rootdir (``python.tests.test_distributed``), which a worker started outside the repository root cannot import.
"""

from __future__ import annotations

import datetime
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import transformers

WORLD = 2
STEPS = 12
BATCH, SEQ, VOCAB = 2, 16, 128
# A spawned launch imports torch and transformers in each process (a few seconds on 2 cores), then trains in
# milliseconds per step; this bounds a hung collective or a stuck process.
JOIN_TIMEOUT_S = 150
COLLECTIVE_TIMEOUT_S = 60
# Ours vs torch.nn.RMSNorm, fp32: the norms agree to ~2 ulp per element (test_models.py), and 12 AdamW steps amplify
# that little on this model; a measured difference of ~1e-7 relative on the loss, bound at 1e-5.
LOSS_RTOL = 1e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _build(kind: str):
    """The tiny Llama of test_models.py, shrunk; norms as torch.nn.RMSNorm ('ref') or ours ('ours')."""
    import rmsnorm

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
    )
    cfg._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(cfg)
    # torch.nn.RMSNorm sharing each LlamaRMSNorm's weight (moved away from ones, so the weight's gradient matters).
    for name, mod in list(model.named_modules()):
        for child_name, child in list(mod.named_children()):
            if type(child).__name__ == "LlamaRMSNorm":
                new = torch.nn.RMSNorm(child.weight.shape, eps=child.variance_epsilon)
                with torch.no_grad():
                    child.weight.normal_(1.0, 0.2)
                new.weight = child.weight
                setattr(mod, child_name, new)
    assert sum(type(m) is torch.nn.RMSNorm for m in model.modules()) == 5
    if kind == "ours":
        assert len(rmsnorm.swap_rmsnorm(model)) == 5
        assert not any(type(m) is torch.nn.RMSNorm for m in model.modules())
    return model


def _batch(rank: int, step: int, seed: int):
    """Arithmetic progressions mod VOCAB (random start, stride 1 to 3): learnable, so the loss curve moves."""
    gen = torch.Generator().manual_seed(seed * 100003 + step * 101 + rank)
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=gen)
    stride = torch.randint(1, 4, (BATCH, 1), generator=gen)
    return (start + stride * torch.arange(SEQ)) % VOCAB


def _gather_dim0(p):
    """The full tensor of an FSDP2 parameter (a DTensor sharded on dim 0, torch.chunk-style: ceil(n / world) rows per
    rank, fewer on the last), by a plain all_gather of the zero-padded local shards. Not DTensor.full_tensor(): on the
    H200 image's torch 2.11 with gloo, its functional-collective wait segfaulted in _c_check_aliasing_constraint."""
    from torch.distributed.tensor import Shard

    assert tuple(p.placements) == (Shard(0),), p.placements
    world = dist.get_world_size()
    full = tuple(p.shape)
    local = p.to_local()
    chunk = (full[0] + world - 1) // world
    padded = torch.zeros((chunk,) + full[1:], dtype=local.dtype)
    padded[: local.shape[0]] = local
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return torch.cat(parts)[: full[0]]


def _full_params(model, wrap: str):
    """(name, full fp32 tensor) for every parameter, gathered from the shards under FSDP2."""
    out = []
    for name, p in model.named_parameters():
        t = _gather_dim0(p.detach()) if wrap == "fsdp2" else p.detach()
        out.append((name, t.contiguous().view(-1)))
    return out


def _check_ranks_equal(params, rank, where):
    """All-gather each rank's flattened parameters and compare them bitwise; name the first that differs."""
    flat = torch.cat([t for _, t in params])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    for other, g in enumerate(gathered):
        if torch.equal(g.view(torch.int32), flat.view(torch.int32)):
            continue
        off = 0
        for name, t in params:
            a, b = t.view(torch.int32), g[off:off + t.numel()].view(torch.int32)
            if not torch.equal(a, b):
                n = int((a != b).sum())
                raise AssertionError(
                    f"{where}: rank {rank} and rank {other} hold different parameter {name} ({n} of {t.numel()} "
                    f"elements, max diff {(t - g[off:off + t.numel()]).abs().max().item():.3g})"
                )
            off += t.numel()


def _train(kind: str, wrap: str, compile_: bool, rank: int, seed: int):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = _build(kind)
    if wrap == "ddp":
        model = DDP(model)
    else:
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
    if compile_:
        model = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    losses, digests = [], []
    for step in range(STEPS):
        ids = _batch(rank, step, seed)
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / dist.get_world_size())
        params = _full_params(model, wrap)
        _check_ranks_equal(params, rank, f"{kind}/{wrap}{'/compiled' if compile_ else ''} after step {step}")
        digests.append(torch.cat([t for _, t in params]).clone())
    final = {name: t.clone() for name, t in _full_params(model, wrap)}
    return {"losses": losses, "per_step_params": torch.stack(digests), "final": final}


def _worker(rank, world, port, out_dir, cases, seed):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    )
    try:
        results = {}
        for case in cases:
            kind, wrap, compile_ = case
            t0 = time.perf_counter()
            results[case] = _train(kind, wrap, compile_, rank, seed)
            results[case]["seconds"] = time.perf_counter() - t0
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _launch(tmp_path, cases, seed=0):
    """Runs the cases in WORLD fresh processes; returns each rank's results. Raises with the worker's traceback."""
    out_dir = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    out_dir.mkdir()
    for attempt in range(3):  # a port taken between _free_port and the bind: retry with another
        port = _free_port()
        ctx = mp.start_processes(_worker, args=(WORLD, port, str(out_dir), cases, seed), nprocs=WORLD, join=False,
                                 start_method="spawn")
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        try:
            while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"distributed workers still running after {JOIN_TIMEOUT_S} s")
        except mp.ProcessRaisedException as e:
            if "EADDRINUSE" in str(e) or "address already in use" in str(e).lower():
                continue
            raise
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
                    p.join(5)
        break
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(WORLD)]
