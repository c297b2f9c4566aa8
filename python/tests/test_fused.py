"""add_rms_norm: the residual add fused with the norm, against the unfused composition (bit for bit) and the ops'
registrations."""

from __future__ import annotations

import pytest
import torch

import rmsnorm
from helpers import DEVICES, DTYPES, randn, row_scaled


def _inputs(shape, dtype, device, seed):
    gen = torch.Generator().manual_seed(seed)
    x = row_scaled(randn(*shape, dtype=dtype, gen=gen), gen).to(device)
    r = randn(*shape, dtype=dtype, gen=gen, scale=4.0).to(device)
    w = randn(shape[-1], dtype=dtype, gen=gen).to(device)
    return x, r, w


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_values_are_the_unfused_forms(device, dtype):
    for shape in [(1, 8), (5, 64), (2, 3, 130), (7, 1000)]:
        x, r, w = _inputs(shape, dtype, device, seed=sum(shape))
        y, h = rmsnorm.add_rms_norm(x, r, shape[-1], w, 1e-5)
        h_want = (x.float() + r.float()).to(dtype)  # fp32 sum, one rounding
        assert torch.equal(h, h_want)
        assert torch.equal(y, rmsnorm.rms_norm(h_want, shape[-1], w, 1e-5))
        y2, h2 = rmsnorm.add_rms_norm(x, r, shape[-1], None, None, weight_offset=False)
        assert torch.equal(h2, h_want) and torch.equal(y2, rmsnorm.rms_norm(h_want, shape[-1]))
    # Two normalized dims.
    x, r, w = _inputs((4, 6, 10), dtype, device, seed=9)
    y, h = rmsnorm.add_rms_norm(x, r, (6, 10), w.new_ones(6, 10))
    assert y.shape == x.shape and torch.equal(y, rmsnorm.rms_norm((x.float() + r.float()).to(dtype), (6, 10),
                                                                  w.new_ones(6, 10)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_are_the_unfused_autograds(device, dtype):
    # loss = <y, gy> + <h, gh>: h has a second consumer, as the residual stream does. The unfused graph is
    # h = x + residual (torch's add: fp32 sum, one rounding), y = rms_norm(h); autograd accumulates h's two
    # gradients the way the fused backward adds them, so every gradient is the same bits.
    x, r, w = _inputs((6, 96), dtype, device, seed=3)
    gen = torch.Generator().manual_seed(4)
    gy = randn(6, 96, dtype=dtype, gen=gen).to(device)
    gh = randn(6, 96, dtype=dtype, gen=gen, scale=0.5).to(device)

    def grads(fused):
        xl, rl, wl = (t.detach().clone().requires_grad_(True) for t in (x, r, w))
        if fused:
            y, h = rmsnorm.add_rms_norm(xl, rl, 96, wl, 1e-5)
        else:
            h = xl + rl
            y = rmsnorm.rms_norm(h, 96, wl, 1e-5)
        torch.autograd.backward([y, h], [gy, gh])
        return xl.grad, rl.grad, wl.grad

    fx, fr, fw = grads(True)
    ux, ur, uw = grads(False)
    assert torch.equal(fx, ux) and torch.equal(fr, ur) and torch.equal(fw, uw)
    # With h unused downstream only the norm's gradient flows.
    xl, rl = x.detach().clone().requires_grad_(True), r.detach().clone().requires_grad_(True)
    y, _h = rmsnorm.add_rms_norm(xl, rl, 96, w, 1e-5)
    y.backward(gy)
    h0 = (x + r).detach().requires_grad_(True)
    rmsnorm.rms_norm(h0, 96, w, 1e-5).backward(gy)
    assert torch.equal(xl.grad, h0.grad) and torch.equal(rl.grad, h0.grad)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x, r, w = _inputs((3, 5, 64), torch.bfloat16, device, seed=5)
    torch.library.opcheck(torch.ops.rmsnorm.add_forward.default, (x, r, w, 1e-5, 0))
    xg, rg, wg = (t.clone().requires_grad_(True) for t in (x, r, w))
    torch.library.opcheck(torch.ops.rmsnorm.add_forward.default, (xg, rg, wg, 1e-6, rmsnorm.FLAG_ROUND_XHAT))
    _y, h, rstd = torch.ops.rmsnorm.add_forward(x, r, w, 1e-5, 0)
    gy, gh = torch.randn_like(h), torch.randn_like(h)
    torch.library.opcheck(torch.ops.rmsnorm.add_backward.default, (gy, gh, h, w, rstd, 0, torch.float32))
    torch.library.opcheck(torch.ops.rmsnorm.add_backward.default, (gy, gh, h, None, rstd, 0, None))


@pytest.mark.parametrize("device", DEVICES)
def test_errors(device):
    x, r, w = _inputs((4, 16), torch.float32, device, seed=6)
    cases = [
        (RuntimeError, "residual", lambda: rmsnorm.add_rms_norm(x, r[:2], 16, w)),
        (RuntimeError, "residual", lambda: rmsnorm.add_rms_norm(x, r.half(), 16, w)),
        (RuntimeError, "normalized_shape=[8]", lambda: rmsnorm.add_rms_norm(x, r, 8, w)),
        (TypeError, "weight has dtype", lambda: rmsnorm.add_rms_norm(x, r, 16, w.half())),
        (RuntimeError, "residual has shape", lambda: torch.ops.rmsnorm.add_forward(x, r[:2], w, 1e-5, 0)),
        (RuntimeError, "residual has dtype", lambda: torch.ops.rmsnorm.add_forward(x, r.half(), w, 1e-5, 0)),
        (RuntimeError, "g_h has shape",
         lambda: torch.ops.rmsnorm.add_backward(x, x[:2], x, w, x[:, 0].contiguous(), 0, None)),
    ]
    for exc, text, fn in cases:
        with pytest.raises(exc) as info:
            fn()
        assert text in str(info.value), f"{text!r} not in {str(info.value)!r}"


def test_compiled_matches_eager():
    x, r, w = _inputs((8, 64), torch.bfloat16, "cpu", seed=7)

    def step(x, r, w):
        y, h = rmsnorm.add_rms_norm(x, r, 64, w, 1e-5)
        return y * 2, h

    compiled = torch.compile(step, fullgraph=True)
    ye, he = step(x, r, w)
    yc, hc = compiled(x, r, w)
    assert torch.equal(ye, yc) and torch.equal(he, hc)
