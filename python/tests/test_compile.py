"""torch.compile without graph breaks; on the GPU, CUDA graphs and mode="reduce-overhead"."""

from __future__ import annotations

import pytest
import torch

import rmsnorm
from helpers import DEVICES, randn, requires_cuda


class Block(torch.nn.Module):
    """A pre-norm MLP block with a per-head q-norm-like second norm: the module twice, as a model uses it."""

    def __init__(self, d=64, heads=4, dtype=torch.float32, device="cpu"):
        super().__init__()
        self.norm = rmsnorm.RMSNorm(d, eps=1e-6, dtype=dtype, device=device)
        self.proj = torch.nn.Linear(d, 3 * d, dtype=dtype, device=device)
        self.head_norm = rmsnorm.RMSNorm(d // heads, eps=1e-6, round_xhat=True, dtype=dtype, device=device)
        self.out = torch.nn.Linear(d, d, dtype=dtype, device=device)
        self.heads = heads
        with torch.no_grad():
            self.norm.weight.normal_(1.0, 0.1)
            self.head_norm.weight.normal_(1.0, 0.1)

    def forward(self, x):
        h = self.proj(self.norm(x))
        q = h[..., : x.shape[-1]].unflatten(-1, (self.heads, -1))  # rows of stride 3 * d: no copy
        q = self.head_norm(q).flatten(-2)
        return x + self.out(torch.nn.functional.silu(q))


def _fwd_bwd(model, x):
    model.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(True)
    y = model(x)
    y.float().square().mean().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    # clone: under mode="reduce-overhead" the output lives in CUDA-graph memory that the next replay overwrites.
    return y.detach().clone(), x.grad.clone(), grads


def _assert_close_all(a, b, **tol):
    ya, gxa, ga = a
    yb, gxb, gb = b
    torch.testing.assert_close(ya, yb, **tol)
    torch.testing.assert_close(gxa, gxb, **tol)
    for p, q in zip(ga, gb):
        torch.testing.assert_close(p, q, **tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("normalized_shape", [64, (64,), [64], torch.Size([64])])
def test_compile_functional(device, normalized_shape):
    """rmsnorm.rms_norm itself inside torch.compile(fullgraph=True), normalized_shape in each accepted form (the
    module path does not take normalized_shape from the caller). A tuple once failed there: the int check raised a
    TypeError inside the traced code, which dynamo turns into an internal error."""
    torch.manual_seed(0)
    x = randn(4, 64, device=device)
    w = randn(64, device=device)
    want = rmsnorm.rms_norm(x, normalized_shape, w, 1e-5)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, w: rmsnorm.rms_norm(x, normalized_shape, w, 1e-5), backend="aot_eager",
                             fullgraph=True, dynamic=False)
    with torch.no_grad():
        got = compiled(x, w)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph(device, backend):
    torch.manual_seed(0)
    model = Block(device=device)
    x = randn(2, 8, 64, device=device)
    eager = _fwd_bwd(model, x)
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    got = _fwd_bwd(compiled, x)
    # fullgraph=True raises on a graph break; also check that nothing was skipped or broken.
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1
    _assert_close_all(got, eager, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_dynamic_shapes(device):
    torch.manual_seed(0)
    model = Block(device=device)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=True)
    for rows in (3, 5, 17):
        x = randn(rows, 64, device=device)
        _assert_close_all(_fwd_bwd(compiled, x), _fwd_bwd(model, x), rtol=1e-5, atol=1e-5)


def _capture(model, static_x):
    """Warm up on a side stream (as whole-network capture requires), then capture forward and backward."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            static_x.grad = None
            model(static_x).float().square().mean().backward()
    torch.cuda.current_stream().wait_stream(s)
    model.zero_grad(set_to_none=True)
    static_x.grad = None
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = model(static_x)
        static_y.float().square().mean().backward()
    # The gradients were None at capture, so the graph owns these tensors and every replay overwrites them.
    return g, static_y, static_x.grad, [p.grad for p in model.parameters()]


@requires_cuda
@pytest.mark.parametrize("which", ["norm", "block"])
def test_cuda_graph_capture_forward_and_backward(which):
    torch.manual_seed(0)
    d = 512
    if which == "norm":
        model = rmsnorm.RMSNorm(d, eps=1e-6, dtype=torch.bfloat16, device="cuda")
        with torch.no_grad():
            model.weight.normal_(1.0, 0.1)
    else:
        model = Block(d=d, heads=4, dtype=torch.bfloat16, device="cuda")
    static_x = randn(64, d, dtype=torch.bfloat16, device="cuda").requires_grad_(True)
    g, static_y, static_gx, static_grads = _capture(model, static_x)
    for step in range(3):
        x = randn(64, d, dtype=torch.bfloat16, device="cuda", gen=torch.Generator().manual_seed(step))
        with torch.no_grad():
            static_x.copy_(x)
        g.replay()
        torch.cuda.synchronize()
        replay = (static_y.detach().clone(), static_gx.clone(), [q.clone() for q in static_grads])
        eager = _fwd_bwd(model, x)
        if which == "norm":
            # Our kernels alone, on the same inputs: bitwise equal.
            assert torch.equal(replay[0], eager[0])
            assert torch.equal(replay[1], eager[1])
            assert all(torch.equal(a, b) for a, b in zip(replay[2], eager[2]))
        else:
            # cuBLAS may pick another algorithm under capture.
            _assert_close_all(replay, eager, rtol=2e-2, atol=2e-2)


@requires_cuda
def test_reduce_overhead_matches_eager():
    torch.manual_seed(0)
    model = Block(d=256, dtype=torch.float32, device="cuda")
    torch._dynamo.reset()
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    for step in range(4):  # the first calls record, later ones replay the CUDA graph
        x = randn(32, 256, device="cuda", gen=torch.Generator().manual_seed(step))
        _assert_close_all(_fwd_bwd(compiled, x), _fwd_bwd(model, x), rtol=1e-5, atol=1e-5)


@requires_cuda
def test_gradients_bitwise_over_repeats_cuda():
    gen = torch.Generator().manual_seed(3)
    for rows, d, dtype in ((1, 4096, torch.bfloat16), (4097, 512, torch.float16), (300, 8192, torch.float32)):
        x = randn(rows, d, dtype=dtype, gen=gen, device="cuda").requires_grad_(True)
        w = randn(d, dtype=dtype, gen=gen, device="cuda").requires_grad_(True)
        gy = randn(rows, d, dtype=dtype, gen=gen, device="cuda")
        first = None
        for _ in range(20):
            x.grad = w.grad = None
            rmsnorm.rms_norm(x, d, w).backward(gy)
            got = (x.grad.clone(), w.grad.clone())
            if first is None:
                first = got
            assert torch.equal(got[0], first[0]) and torch.equal(got[1], first[1])


@requires_cuda
def test_current_stream_and_device():
    """The op runs on the current stream of the tensor's device (cuda:1 when there is one)."""
    gen = torch.Generator().manual_seed(4)
    devices = ["cuda:0"] + (["cuda:1"] if torch.cuda.device_count() > 1 else [])
    for dev in devices:
        x = randn(1024, 1024, gen=gen, device=dev)
        w = randn(1024, gen=gen, device=dev)
        want = rmsnorm.rms_norm(x, 1024, w)
        s = torch.cuda.Stream(device=dev)
        with torch.cuda.stream(s):
            s.wait_stream(torch.cuda.default_stream(dev))
            got = rmsnorm.rms_norm(x, 1024, w)
            got_gx = torch.autograd.grad(rmsnorm.rms_norm(x.requires_grad_(True), 1024, w), x, torch.ones_like(x))[0]
        s.synchronize()
        assert got.device == torch.device(dev)
        assert torch.equal(got, want)
        want_gx = torch.autograd.grad(rmsnorm.rms_norm(x, 1024, w), x, torch.ones_like(x))[0]
        assert torch.equal(got_gx, want_gx)
        x.requires_grad_(False)
