"""Train a tiny random Llama with rmsnorm's RMSNorm under DistributedDataParallel (or FSDP2 with --fsdp2).

    python3 examples/ddp_train.py --nproc 2            # CPU processes and gloo, or one GPU each and NCCL
    python3 examples/ddp_train.py --nproc 2 --fsdp2    # torch.distributed.fsdp.fully_shard per decoder layer

Uses CUDA and NCCL when there are at least --nproc GPUs (and rmsnorm was built with CUDA), otherwise the CPU and
gloo. Each process prints nothing but rank 0's all-reduced loss; at the end every rank's parameters are compared
bitwise against rank 0's.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket

# NVLink SHARP (multicast) stays off: the machines this project runs on require it (the device notes).
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def _model(device):
    import transformers

    import rmsnorm

    torch.manual_seed(0)  # the same init on every rank (FSDP2 does not broadcast it; DDP's constructor does)
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(cfg)
    swapped = rmsnorm.swap_rmsnorm(model)  # before wrapping: the swap keeps each weight Parameter
    return model.to(device), len(swapped)


def _worker(rank, args, port, use_cuda):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    if use_cuda:
        torch.cuda.set_device(rank)
        device, backend = torch.device("cuda", rank), "nccl"
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.nproc))
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend, rank=rank, world_size=args.nproc, device_id=device if use_cuda else None,
                            timeout=datetime.timedelta(seconds=120))
    try:
        model, n_norms = _model(device)
        if args.fsdp2:
            from torch.distributed.fsdp import fully_shard

            for layer in model.model.layers:
                fully_shard(layer)
            model = fully_shard(model)
        else:
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank] if use_cuda else None)
        if rank == 0:
            print(f"{args.nproc} x {device.type} ({backend}), {'FSDP2' if args.fsdp2 else 'DDP'}, "
                  f"{n_norms} norms swapped for rmsnorm.RMSNorm")
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for step in range(args.steps):
            # Each rank its own batch: arithmetic progressions mod the vocabulary, so the loss can fall.
            gen = torch.Generator().manual_seed(step * 101 + rank)
            start = torch.randint(0, 128, (args.batch, 1), generator=gen)
            stride = torch.randint(1, 4, (args.batch, 1), generator=gen)
            ids = ((start + stride * torch.arange(args.seq)) % 128).to(device)
            opt.zero_grad(set_to_none=True)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()  # DDP all-reduces the gradients; FSDP2 reduce-scatters them to the shards
            opt.step()
            loss = loss.detach()
            dist.all_reduce(loss)
            if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
                print(f"step {step:3d}  loss {loss.item() / args.nproc:.4f}")
        flat = torch.cat([(p.full_tensor() if args.fsdp2 else p).detach().reshape(-1) for p in model.parameters()])
        ref = flat.clone()
        dist.broadcast(ref, 0)
        same = torch.equal(flat, ref)
        print(f"rank {rank}: parameters {'bitwise equal to' if same else 'DIFFER from'} rank 0's", flush=True)
        if not same:
            raise SystemExit(1)
    finally:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=2, help="sequences per rank per step")
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--fsdp2", action="store_true", help="torch.distributed.fsdp.fully_shard instead of DDP")
    ap.add_argument("--cpu", action="store_true", help="CPU and gloo even when GPUs exist")
    args = ap.parse_args()

    import rmsnorm

    use_cuda = not args.cpu and torch.cuda.device_count() >= args.nproc and rmsnorm.cuda_built()
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_worker, args=(args, port, use_cuda), nprocs=args.nproc, start_method="spawn")


if __name__ == "__main__":
    main()
