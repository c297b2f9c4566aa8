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


# ---- quantized output: against torch's own conversions of rms_norm's y ------------------------------------------

def _torch_quant(y, dtype, scale=None, scale_ub=None):
    """The rules of docs/fusions.md with torch ops: fp8 through torch's float8_e4m3fn cast (nearest, ties to even)
    after the clamp, int8 through round (half to even) and clamp; per-row scales from max|y|. On the CPU: there a
    division by a Python number divides; on CUDA torch multiplies by its reciprocal, which is not the rule (it
    changed the last bit of some scales on the H200). Returns CPU tensors."""
    yf = y.float().cpu()
    scale = scale.cpu() if scale is not None else None
    scale_ub = scale_ub.cpu() if scale_ub is not None else None
    fp8 = dtype == torch.float8_e4m3fn
    qmax = 448.0 if fp8 else 127.0
    if scale is not None:
        v = yf * (1.0 / scale.float())
        s = None
    else:
        amax = yf.abs().amax(dim=-1)
        if scale_ub is not None:
            amax = torch.minimum(amax, scale_ub.float())
        s = torch.maximum(amax / qmax, torch.tensor(1.0 / (448.0 * 512.0) if fp8 else 2.0**-23))
        v = yf / s.unsqueeze(-1) if fp8 else yf * (1.0 / s).unsqueeze(-1)
    if fp8:
        q = v.clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    else:
        q = torch.round(v).clamp(-128, 127).to(torch.int8)
    return q, s


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qdtype", [torch.float8_e4m3fn, torch.int8])
def test_quant_is_the_rule_on_rms_norms_output(device, dtype, qdtype):
    # On CUDA these shapes take the fused rows kernel (q's rows aligned to a chunk's bytes), whose y is rms_norm's.
    for shape in [(1, 8), (7, 64), (3, 5, 1000)]:
        x, _r, w = _inputs(shape, dtype, device, seed=11 + shape[-1])
        for round_xhat in (False, True):
            y = rmsnorm.rms_norm(x, shape[-1], w, 1e-5, round_xhat=round_xhat)
            scale = torch.tensor([0.05], device=device)
            q, s = rmsnorm.rms_norm_quant(x, shape[-1], w, 1e-5, dtype=qdtype, scale=scale, round_xhat=round_xhat)
            want, _ = _torch_quant(y, qdtype, scale=scale)
            assert q.dtype == qdtype and q.shape == x.shape and s.numel() == 0 and q.device == x.device
            assert torch.equal(q.cpu().view(torch.uint8), want.view(torch.uint8))
            q, s = rmsnorm.rms_norm_quant(x, shape[-1], w, 1e-5, dtype=qdtype, round_xhat=round_xhat)
            want, s_want = _torch_quant(y, qdtype)
            assert s.shape == x.shape[:-1] and s.device == x.device and torch.equal(s.cpu(), s_want)
            assert torch.equal(q.cpu().view(torch.uint8), want.view(torch.uint8))
    if qdtype == torch.float8_e4m3fn:
        ub = torch.tensor([0.25], device=device)
        q, s = rmsnorm.rms_norm_quant(x, 1000, w, 1e-5, dtype=qdtype, scale_ub=ub)
        want, s_want = _torch_quant(rmsnorm.rms_norm(x, 1000, w, 1e-5), qdtype, scale_ub=ub)
        assert torch.equal(s.cpu(), s_want) and torch.equal(q.cpu().view(torch.uint8), want.view(torch.uint8))


def test_quant_errors():
    x, _r, w = _inputs((4, 16), torch.float32, "cpu", seed=12)
    cases = [
        (RuntimeError, "out_dtype must be", lambda: rmsnorm.rms_norm_quant(x, 16, w, dtype=torch.float16)),
        (RuntimeError, "scale must be a one-element float32",
         lambda: rmsnorm.rms_norm_quant(x, 16, w, scale=torch.ones(2))),
        (RuntimeError, "scale_ub", lambda: rmsnorm.rms_norm_quant(x, 16, w, dtype=torch.int8,
                                                                 scale_ub=torch.ones(1))),
        (RuntimeError, "normalized_shape=[8]", lambda: rmsnorm.rms_norm_quant(x, 8, w)),
    ]
    for exc, text, fn in cases:
        with pytest.raises(exc) as info:
            fn()
        assert text in str(info.value), f"{text!r} not in {str(info.value)!r}"
    torch.library.opcheck(torch.ops.rmsnorm.forward_quant.default,
                          (x, w, 1e-5, 0, torch.float8_e4m3fn, None, None))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_quant_is_the_quant_of_h(device, dtype):
    """add_rms_norm_quant: h bit for bit add_rms_norm's, q and the scales bit for bit rms_norm_quant of that h."""
    for shape in [(1, 8), (7, 64), (3, 5, 1000)]:
        x, r, w = _inputs(shape, dtype, device, seed=21 + shape[-1])
        _, h_want = rmsnorm.add_rms_norm(x, r, shape[-1], w, 1e-5)
        for qdtype in (torch.float8_e4m3fn, torch.int8):
            for scale in (None, torch.tensor([0.05], device=device)):
                q, s, h = rmsnorm.add_rms_norm_quant(x, r, shape[-1], w, 1e-5, dtype=qdtype, scale=scale)
                q_want, s_want = rmsnorm.rms_norm_quant(h_want, shape[-1], w, 1e-5, dtype=qdtype, scale=scale)
                assert torch.equal(h, h_want)
                assert torch.equal(q.view(torch.uint8), q_want.view(torch.uint8)) and torch.equal(s, s_want)
    x, r, w = _inputs((4, 16), dtype, device, seed=5)
    torch.library.opcheck(torch.ops.rmsnorm.add_forward_quant.default,
                          (x, r, w, 1e-5, 0, torch.float8_e4m3fn, None, None))
    with pytest.raises(RuntimeError, match="residual has shape"):
        rmsnorm.add_rms_norm_quant(x, r[:2], 16, w)
