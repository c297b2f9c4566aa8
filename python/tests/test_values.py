"""Values and gradients against float64 torch and against torch.nn.RMSNorm / F.rms_norm."""

from __future__ import annotations

import zlib

import pytest
import torch
import torch.nn.functional as F

import rmsnorm
from helpers import (
    DEVICES,
    DTYPES,
    check_close,
    gw_bound,
    gx_bound,
    randn,
    reference,
    row_scaled,
    y_bound,
)

# Shapes: leading dims x D. D picks the library's bands and tails: 1 and 8 (partial warps), 33 (odd), 128 (qk-norm
# head_dim), 384 (not a power of two), 512 (the band of MLX's bug), 1000 and 4097 (no vector-width multiple).
SHAPES = [(1, 1), (3, 8), (2, 5, 33), (2, 3, 4, 128), (7, 384), (1, 512), (3, 512), (4, 2, 1000), (2, 4097)]


def _variants():
    # Every dtype, weight on/off, offset and round_xhat; not the full product on every shape (CPU time in CI).
    out = []
    for i, shape in enumerate(SHAPES):
        for dtype in DTYPES:
            for has_w in (True, False):
                offset = has_w and (i + DTYPES.index(dtype)) % 2 == 1
                round_xhat = (i + int(has_w)) % 2 == 1
                out.append((shape, dtype, has_w, offset, round_xhat))
    return out


def _id(v):
    shape, dtype, has_w, offset, rx = v
    return "x".join(map(str, shape)) + f"-{str(dtype)[6:]}" + ("-w" if has_w else "") + ("-off" if offset else "") + (
        "-rx" if rx else ""
    )


def _run(x, w, eps, offset, round_xhat, gy):
    x = x.detach().requires_grad_(True)
    if w is not None:
        w = w.detach().requires_grad_(True)
    y = rmsnorm.rms_norm(x, (x.shape[-1],), w, eps, weight_offset=offset, round_xhat=round_xhat)
    y.backward(gy)
    return y.detach(), x.grad, (w.grad if w is not None else None)


def _check_against_reference(x, w, eps, offset, round_xhat, gy, what=""):
    D = x.shape[-1]
    y, gx, gw = _run(x, w, eps, offset, round_xhat, gy)
    assert y.dtype == x.dtype and y.shape == x.shape and y.is_contiguous()
    ref = reference(x, w, eps, offset, round_xhat, gy)
    check_close(f"y{what}", y, ref["y"], y_bound(ref, x.dtype, D, round_xhat))
    check_close(f"gx{what}", gx, ref["gx"], gx_bound(ref, x.dtype, D))
    if w is not None:
        assert gw.dtype == w.dtype and gw.shape == w.shape
        check_close(f"gw{what}", gw, ref["gw"], gw_bound(ref, x.dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", _variants(), ids=_id)
def test_against_float64(device, variant):
    shape, dtype, has_w, offset, round_xhat = variant
    gen = torch.Generator().manual_seed(zlib.crc32(_id(variant).encode()))
    x = row_scaled(randn(*shape, dtype=dtype, gen=gen), gen).to(device)
    w = randn(shape[-1], dtype=dtype, gen=gen, device=device) if has_w else None
    gy = randn(*shape, dtype=dtype, gen=gen, device=device)
    _check_against_reference(x, w, 1e-5, offset, round_xhat, gy)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_strided_rows_without_copy(device, dtype):
    """q, k and v slices of a packed qkv projection: rows of one stride (3 * D), read in place."""
    gen = torch.Generator().manual_seed(7)
    D = 128
    qkv = randn(2, 5, 3 * D, dtype=dtype, gen=gen, device=device)
    w = randn(D, dtype=dtype, gen=gen, device=device)
    for part in range(3):
        x = qkv[..., part * D : (part + 1) * D]
        assert not x.is_contiguous()
        gy = randn(2, 5, D, dtype=dtype, gen=gen, device=device)
        _check_against_reference(x, w, 1e-6, False, part == 1, gy, what=f" (slice {part})")
    # Per-head view of the slice (Qwen3's q_norm: [..., heads, head_dim] of a projection).
    x = qkv[..., :D].view(2, 5, 4, D // 4)
    _check_against_reference(x, w[: D // 4], 1e-6, False, True, randn(*x.shape, dtype=dtype, gen=gen, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_layouts_that_are_copied(device):
    """Transposed views (Gemma3's q/k norm input), a non-contiguous last dim and an expanded gradient."""
    gen = torch.Generator().manual_seed(8)
    D = 64
    base = randn(2, 6, 4, D, gen=gen, device=device)  # [batch, seq, heads, D]
    x = base.transpose(1, 2)  # [batch, heads, seq, D]: no single row stride
    w = randn(D, gen=gen, device=device)
    _check_against_reference(x, w, 1e-6, True, False, randn(*x.shape, gen=gen, device=device), " (transposed)")
    x = randn(3, 2 * D, gen=gen, device=device)[:, ::2]  # last dim of stride 2
    _check_against_reference(x, w, 1e-6, False, False, randn(3, D, gen=gen, device=device), " (last dim strided)")
    x = randn(3, 4, D, gen=gen, device=device)
    gy = torch.ones(1, 1, D, device=device).expand(3, 4, D)  # stride 0 rows
    _check_against_reference(x, w, 1e-6, False, False, gy, " (expanded gy)")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_against_torch_rmsnorm(device, dtype):
    """Drop-in: the same outputs and gradients as torch.nn.RMSNorm within the dtype's rounding, including several
    normalized dims and eps=None (the fp32 epsilon for every dtype, as F.rms_norm computes it)."""
    gen = torch.Generator().manual_seed(9)
    for shape, normalized in (((4, 3, 96), 96), ((2, 3, 8, 16), (8, 16)), ((5, 256), [256])):
        ours = rmsnorm.RMSNorm(normalized, device=device, dtype=dtype)
        theirs = torch.nn.RMSNorm(normalized, device=device, dtype=dtype)
        with torch.no_grad():
            w = randn(*theirs.weight.shape, dtype=dtype, gen=gen, device=device)
            ours.weight.copy_(w)
            theirs.weight.copy_(w)
        x = randn(*shape, dtype=dtype, gen=gen, device=device)
        gy = randn(*shape, dtype=dtype, gen=gen, device=device)
        xa = x.clone().requires_grad_(True)
        xb = x.clone().requires_grad_(True)
        ya, yb = ours(xa), theirs(xb)
        ya.backward(gy)
        yb.backward(gy)
        # Two implementations, each within about one rounding of the exact value: 2 ulp apart at most, plus the
        # fp32 accumulation of the gradients (relative to the largest element).
        u = {torch.float32: 2e-6, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}[dtype]
        for name, a, b in (("y", ya, yb), ("gx", xa.grad, xb.grad), ("gw", ours.weight.grad, theirs.weight.grad)):
            bound = u * b.double().abs() + 4 * u * b.double().abs().max()
            check_close(f"{name} {shape}", a.detach(), b.detach(), bound)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_default_eps_is_f_rms_norms(device, dtype):
    """eps=None gives what F.rms_norm(eps=None) gives, on rows whose mean square is near the eps candidates
    (2^-7 at bf16 would move y by tens of percent there, the fp32 epsilon does not): within one rounding of y, and
    the same bits as an explicit eps of torch.finfo(torch.float32).eps."""
    gen = torch.Generator().manual_seed(21)
    x = (randn(6, 64, dtype=torch.float32, gen=gen, device=device) * 1e-2).to(dtype)
    ours = rmsnorm.rms_norm(x, (64,))
    assert torch.equal(ours, rmsnorm.rms_norm(x, (64,), eps=torch.finfo(torch.float32).eps))
    theirs = F.rms_norm(x, (64,))
    u = {torch.float32: 2e-6, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}[dtype]
    check_close("y (eps=None)", ours, theirs, 2 * u * theirs.double().abs() + torch.finfo(dtype).tiny)
    m = torch.nn.RMSNorm(64, device=device, dtype=dtype)
    ours_m = rmsnorm.RMSNorm(64, device=device, dtype=dtype)
    with torch.no_grad():
        check_close("RMSNorm (eps=None)", ours_m(x), m(x), 2 * u * m(x).double().abs() + torch.finfo(dtype).tiny)


@pytest.mark.parametrize("device", DEVICES)
def test_functional_matches_f_rms_norm_signature(device):
    x = randn(3, 4, 16, device=device)
    w = randn(4, 16, device=device)
    for kwargs in ({}, {"weight": w}, {"eps": 1e-3}, {"weight": w, "eps": 0.0}):
        a = rmsnorm.rms_norm(x, (4, 16), **kwargs)
        b = F.rms_norm(x, (4, 16), **kwargs)
        torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(rmsnorm.rms_norm(x, 16), F.rms_norm(x, (16,)), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_semantics(device):
    # An all-zero row gives zeros (eps > 0), never NaN; fp16 near its maximum does not overflow the squares.
    x = torch.zeros(2, 64, dtype=torch.float16, device=device)
    x[1] = 60000.0
    y = rmsnorm.rms_norm(x, 64, eps=1e-6)
    assert torch.equal(y[0], torch.zeros_like(y[0]))
    assert torch.allclose(y[1].float(), torch.ones(64, device=device))
    # No rows: empty outputs, and gw is the empty sum.
    x = torch.empty(0, 32, device=device, requires_grad=True)
    w = torch.ones(32, device=device, requires_grad=True)
    y = rmsnorm.rms_norm(x, 32, w)
    y.sum().backward()
    assert y.shape == (0, 32) and x.grad.shape == (0, 32)
    assert torch.equal(w.grad, torch.zeros(32, device=device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [64, 4096, 4099, 40000])
def test_zero_weights_keep_their_sign(device, dtype, D):
    # w' = w exactly, so a -0 weight gives y = -0 where x > 0; with weight_offset, w = -1 gives w' = +0.
    gen = torch.Generator().manual_seed(D)
    x = randn(3, D, dtype=dtype, device=device, gen=gen)
    w = randn(D, dtype=dtype, device=device, gen=gen)
    k = torch.arange(D, device=device) % 4
    cols = k < 2
    for offset in (False, True):
        zero_w = torch.where(k == 0, -0.0, 0.0).to(dtype)  # w' = -0 at k == 0, +0 at k == 1
        wt = torch.where(cols, torch.full_like(w, -1.0) if offset else zero_w, w)
        y = rmsnorm.rms_norm(x, D, wt, 1e-5, weight_offset=offset)
        w_neg = (k == 0) & (not offset)
        want_neg = torch.signbit(x) ^ w_neg
        got = y[:, cols]
        assert torch.equal(got, torch.zeros_like(got)), f"offset={offset}: a zero w' gave a non-zero y"
        bad = torch.signbit(got) != want_neg[:, cols]
        assert not bad.any(), f"offset={offset}: {int(bad.sum())} zeros with the wrong sign, first at {bad.nonzero()[0].tolist()}"


@pytest.mark.parametrize("device", DEVICES)
def test_state_dict_round_trip(device):
    theirs = torch.nn.RMSNorm((4, 8), eps=1e-5, device=device)
    with torch.no_grad():
        theirs.weight.normal_()
    ours = rmsnorm.RMSNorm((4, 8), eps=1e-5, device=device)
    ours.load_state_dict(theirs.state_dict())
    assert torch.equal(ours.weight, theirs.weight)
    back = torch.nn.RMSNorm((4, 8), eps=1e-5, device=device)
    back.load_state_dict(ours.state_dict())
    assert torch.equal(back.weight, theirs.weight)
    assert isinstance(ours, torch.nn.RMSNorm)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight"]
    assert rmsnorm.RMSNorm(8, elementwise_affine=False).weight is None
    assert torch.equal(rmsnorm.RMSNorm(8, weight_offset=True).weight, torch.zeros(8))
    assert "round_xhat=True" in repr(rmsnorm.RMSNorm(8, round_xhat=True))


@pytest.mark.parametrize("device", DEVICES)
def test_backward_is_deterministic(device):
    gen = torch.Generator().manual_seed(11)
    x = randn(513, 768, dtype=torch.bfloat16, gen=gen, device=device).requires_grad_(True)
    w = randn(768, dtype=torch.bfloat16, gen=gen, device=device).requires_grad_(True)
    gy = randn(513, 768, dtype=torch.bfloat16, gen=gen, device=device)
    first = None
    for _ in range(20):
        x.grad = w.grad = None
        rmsnorm.rms_norm(x, 768, w).backward(gy)
        got = (x.grad.clone(), w.grad.clone())
        if first is None:
            first = got
        else:
            assert torch.equal(got[0], first[0]) and torch.equal(got[1], first[1])


@pytest.mark.parametrize("device", DEVICES)
def test_frozen_weight_and_input_without_grad(device):
    x = randn(4, 32, device=device).requires_grad_(True)
    w = randn(32, device=device)  # frozen: no gw computed
    rmsnorm.rms_norm(x, 32, w).sum().backward()
    assert x.grad is not None
    x = randn(4, 32, device=device)
    w = randn(32, device=device).requires_grad_(True)
    rmsnorm.rms_norm(x, 32, w).sum().backward()
    ref = reference(x, w, torch.finfo(torch.float32).eps, gy=torch.ones_like(x))
    check_close("gw", w.grad, ref["gw"], gw_bound(ref, torch.float32))


@pytest.mark.parametrize("device", DEVICES)
def test_eager_path_equals_the_registered_op(device):
    """rms_norm's eager autograd.Function and the op's registered autograd (what torch.compile and direct op calls
    use) give bitwise the same values and gradients."""
    gen = torch.Generator().manual_seed(12)
    x = randn(6, 5, 96, dtype=torch.bfloat16, gen=gen, device=device)
    w = randn(96, dtype=torch.bfloat16, gen=gen, device=device)
    gy = randn(6, 5, 96, dtype=torch.bfloat16, gen=gen, device=device)
    flags = rmsnorm.FLAG_WEIGHT_OFFSET | rmsnorm.FLAG_ROUND_XHAT
    xa, wa = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    ya = rmsnorm.rms_norm(xa, 96, wa, 1e-5, weight_offset=True, round_xhat=True)
    ya.backward(gy)
    xb, wb = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    yb, rstd = torch.ops.rmsnorm.forward(xb, wb, 1e-5, flags)
    assert not rstd.requires_grad
    yb.backward(gy)
    assert torch.equal(ya, yb) and torch.equal(xa.grad, xb.grad) and torch.equal(wa.grad, wb.grad)
    with torch.no_grad():
        assert torch.equal(rmsnorm.rms_norm(xa, 96, wa, 1e-5, weight_offset=True, round_xhat=True), ya)
    assert rmsnorm.rms_norm(x, 96, w).grad_fn is None
