"""add_rms_norm: the residual add fused with the norm, against the unfused composition (bit for bit) and the ops'
registrations."""

from __future__ import annotations

import pytest
import torch

import rmsnorm
from helpers import DEVICES, DTYPES, UNIT, randn, row_scaled


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
        (TypeError, "residual has dtype", lambda: rmsnorm.add_rms_norm(x, r.half(), 16, w)),
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
        (TypeError, "scale must be a one-element float32 tensor on the input's device (or None), got float; "
                    "e.g. torch.tensor([0.1], device=input.device)",
         lambda: rmsnorm.rms_norm_quant(x, 16, w, scale=0.1)),
        (TypeError, "scale_ub must be a one-element float32 tensor on the input's device (or None), got int",
         lambda: rmsnorm.rms_norm_quant(x, 16, w, scale_ub=1)),
        (TypeError, "scale_ub must be", lambda: rmsnorm.rms_norm_quant(x, 16, w, scale_ub=2.0, group_size=64)),
        (TypeError, "rmsnorm.add_rms_norm_quant: scale must be",
         lambda: rmsnorm.add_rms_norm_quant(x, x.clone(), 16, w, scale=0.5)),
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


# ---- block scales (group_size 64 or 128): against torch's own conversions of rms_norm's y, block by block -------

_BLOCK_SHAPES = [(3, 1), (5, 100), (4, 128), (2, 3, 130), (6, 1000)]


def _torch_block_quant(y, dtype, group_size, scale_ub=None):
    """Block scales by the rules of docs/fusions.md with torch ops on the CPU: each block of group_size columns of a
    row (the last holds the rest) gets the per-row rule alone, s = clamp(min(max|y_block|, ub) / qmax, min_scale)
    with max|y| ignoring NaN; fp8 v = y / s clamped to [-448, 448] (NaN gives 448) and cast (nearest, ties to even),
    int8 round-half-even(y * (1 / s)) clamped to [-128, 127] (NaN gives 0). Returns (q, s) on the CPU, s of shape
    (leading..., nb)."""
    yf = y.float().cpu()
    fp8 = dtype == torch.float8_e4m3fn
    qmax = 448.0 if fp8 else 127.0
    min_scale = 1.0 / (448.0 * 512.0) if fp8 else torch.finfo(torch.float32).eps
    D = yf.shape[-1]
    nb = -(-D // group_size)
    a = torch.nan_to_num(yf.abs(), nan=0.0)  # fmaxf ignores NaN; |y| >= 0, so zero padding changes no max
    a = torch.nn.functional.pad(a, (0, nb * group_size - D)).unflatten(-1, (nb, group_size))
    amax = a.amax(dim=-1)
    if scale_ub is not None:
        amax = torch.minimum(amax, scale_ub.float().cpu())
    s = torch.clamp(amax / qmax, min=min_scale)
    se = s.repeat_interleave(group_size, dim=-1)[..., :D]
    if fp8:
        v = yf / se
        v = torch.where(torch.isnan(v), torch.full_like(v, 448.0), v)
        q = v.clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    else:
        v = torch.round(yf * (1.0 / se))
        v = torch.where(torch.isnan(v), torch.zeros_like(v), v)
        q = v.clamp(-128, 127).to(torch.int8)
    return q, s


def _exact_on(device):
    """Where q and the scales must be the rule on rms_norm's y bit for bit: the CPU backend. On CUDA only where the
    quantized kernel is the fused rows one (rmsnorm.h: rows whose threads cover whole blocks), a choice of the
    launch plan; elsewhere the one-CTA-per-row kernel's rstd may differ from rms_norm's in the last bits, so y (and
    the per-row op's y) may differ by an ulp, and the CUDA variants check within that."""
    return device == "cpu"


def _check_scales_layout(s, lead, nb, column_major):
    assert s.dtype == torch.float32 and tuple(s.shape) == tuple(lead) + (nb,)
    if column_major:
        # The contiguous (nb, rows...) tensor with its first dim moved last: for 2-D, the .t() of (nb, rows).
        assert s.movedim(-1, 0).is_contiguous()
        rows = 1
        for n in lead:
            rows *= n
        if len(lead) == 1 and rows > 1 and nb > 1:
            assert s.stride() == (1, rows)
        if len(lead) > 0 and rows > 1:
            assert s.stride(-1) == rows
    else:
        assert s.is_contiguous()


def _check_same_quant(q, s, q_want, s_want, qdtype, dtype, exact, what=""):
    """q and s the same bits as q_want and s_want; where not exact (CUDA's one-CTA-per-row kernel: y within an ulp
    of the other's), every scale within two ulps of the dtype (a block's max|y| moved by an ulp) and every code
    within one step."""
    assert q.dtype == q_want.dtype and q.shape == q_want.shape and s.shape == s_want.shape, what
    qc, sc, qw, sw = q.cpu(), s.cpu(), q_want.cpu(), s_want.cpu()
    if exact:
        assert torch.equal(sc, sw), what
        assert torch.equal(qc.view(torch.uint8), qw.view(torch.uint8)), what
        return
    torch.testing.assert_close(sc, sw, rtol=4 * UNIT[dtype] + 2**-22, atol=0.0, msg=what)
    a, b = qc.float(), qw.float()
    step = 0.125 * torch.maximum(a.abs(), b.abs()) + 2.0**-9 if qdtype == torch.float8_e4m3fn else 1.0
    assert bool(((a - b).abs() <= step).all()), what


def _check_block_quant(q, s, y, qdtype, group_size, dtype, exact, scale_ub=None, what=""):
    q_want, s_want = _torch_block_quant(y, qdtype, group_size, scale_ub=scale_ub)
    _check_same_quant(q, s, q_want, s_want, qdtype, dtype, exact, what)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qdtype", [torch.float8_e4m3fn, torch.int8])
@pytest.mark.parametrize("group_size", [64, 128])
def test_block_quant_is_the_rule_on_rms_norms_output(device, dtype, qdtype, group_size):
    for shape in _BLOCK_SHAPES:
        D = shape[-1]
        nb = -(-D // group_size)
        x, _r, w = _inputs(shape, dtype, device, seed=31 + D + group_size)
        for round_xhat in (False, True):
            y = rmsnorm.rms_norm(x, D, w, 1e-5, round_xhat=round_xhat)
            got = []
            for column_major in (False, True):
                what = f"shape {shape}, round_xhat {round_xhat}, column_major {column_major}"
                q, s = rmsnorm.rms_norm_quant(x, D, w, 1e-5, dtype=qdtype, round_xhat=round_xhat,
                                              group_size=group_size, column_major_scales=column_major)
                assert q.device == x.device and s.device == x.device
                _check_scales_layout(s, shape[:-1], nb, column_major)
                _check_block_quant(q, s, y, qdtype, group_size, dtype, _exact_on(device), what=what)
                got.append((q, s))
            # The layout changes where the scales go, nothing else (on every backend: the same launch).
            (q0, s0), (q1, s1) = got
            assert torch.equal(s0, s1) and torch.equal(q0.view(torch.uint8), q1.view(torch.uint8))
    # Without a weight, with Gemma's (1 + w), an fp32 weight, and two normalized dims (D = 6 * 32: three blocks of
    # 64, two of 128).
    x, _r, w = _inputs((4, 1000), dtype, device, seed=32)
    for weight, offset in ((None, False), (w, True), (w.float(), False)):
        q, s = rmsnorm.rms_norm_quant(x, 1000, weight, 1e-6, dtype=qdtype, weight_offset=offset,
                                      group_size=group_size)
        y = rmsnorm.rms_norm(x, 1000, weight, 1e-6, weight_offset=offset)
        _check_block_quant(q, s, y, qdtype, group_size, dtype, _exact_on(device))
    x, _r, _w = _inputs((5, 6, 32), dtype, device, seed=33)
    w2 = randn(6, 32, dtype=dtype, gen=torch.Generator().manual_seed(34)).to(device)
    q, s = rmsnorm.rms_norm_quant(x, (6, 32), w2, 1e-5, dtype=qdtype, group_size=group_size,
                                  column_major_scales=True)
    y = rmsnorm.rms_norm(x, (6, 32), w2, 1e-5)
    assert q.shape == x.shape
    _check_scales_layout(s, (5,), -(-192 // group_size), True)
    _check_block_quant(q.flatten(-2), s, y.flatten(-2), qdtype, group_size, dtype, _exact_on(device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("group_size", [64, 128])
def test_block_quant_scale_ub(device, group_size):
    """fp8's scale_ub bounds each block's max|y| (some blocks above it, some below)."""
    for dtype in DTYPES:
        for shape in [(5, 100), (2, 3, 130), (6, 1000)]:
            D = shape[-1]
            x, _r, w = _inputs(shape, dtype, device, seed=41 + D)
            y = rmsnorm.rms_norm(x, D, w, 1e-5)
            s_free = _torch_block_quant(y, torch.float8_e4m3fn, group_size)[1]
            ub_value = float((s_free * 448.0).median())  # binds on about half the blocks
            ub = torch.tensor([ub_value], device=device)
            for column_major in (False, True):
                q, s = rmsnorm.rms_norm_quant(x, D, w, 1e-5, scale_ub=ub, group_size=group_size,
                                              column_major_scales=column_major)
                _check_scales_layout(s, shape[:-1], -(-D // group_size), column_major)
                _check_block_quant(q, s, y, torch.float8_e4m3fn, group_size, dtype,
                                   _exact_on(device), scale_ub=ub, what=f"{dtype} {shape}")
            # The bound binds somewhere and not everywhere.
            assert bool((s_free > ub_value / 448.0).any()) and bool((s_free < ub_value / 448.0).any())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group_size", [64, 128])
def test_block_quant_within_one_group_is_the_per_row_quant(device, dtype, group_size):
    """With D <= group_size a row is one block: q and the scales are the per-row op's (its scales with a last dim
    of 1)."""
    for D in (1, 8, 100, group_size):
        if D > group_size:
            continue
        x, r, w = _inputs((7, D), dtype, device, seed=51 + D)
        for qdtype in (torch.float8_e4m3fn, torch.int8):
            ubs = (None, torch.tensor([0.5], device=device)) if qdtype == torch.float8_e4m3fn else (None,)
            for ub in ubs:
                q_row, s_row = rmsnorm.rms_norm_quant(x, D, w, 1e-5, dtype=qdtype, scale_ub=ub)
                for column_major in (False, True):
                    q, s = rmsnorm.rms_norm_quant(x, D, w, 1e-5, dtype=qdtype, scale_ub=ub, group_size=group_size,
                                                  column_major_scales=column_major)
                    assert s.shape == (7, 1)
                    _check_same_quant(q, s[:, 0], q_row, s_row, qdtype, dtype, _exact_on(device))
            q_row, s_row, h_row = rmsnorm.add_rms_norm_quant(x, r, D, w, 1e-5, dtype=qdtype)
            q, s, h = rmsnorm.add_rms_norm_quant(x, r, D, w, 1e-5, dtype=qdtype, group_size=group_size)
            assert torch.equal(h, h_row)
            _check_same_quant(q, s[:, 0], q_row, s_row, qdtype, dtype, _exact_on(device))


@pytest.mark.parametrize("device", DEVICES)
def test_block_quant_nan_and_inf_rows(device):
    """A NaN in x makes its row's y NaN: every block's max|y| ignores it (s = min_scale), fp8 codes 448, int8 0. An
    Inf gives rstd 0: NaN at the Inf, zeros elsewhere. The other rows are untouched."""
    x, _r, w = _inputs((4, 200), torch.bfloat16, device, seed=61)
    x[1, 150] = float("nan")
    x[2, 10] = float("inf")
    y = rmsnorm.rms_norm(x, 200, w, 1e-5)
    for qdtype in (torch.float8_e4m3fn, torch.int8):
        for group_size in (64, 128):
            q, s = rmsnorm.rms_norm_quant(x, 200, w, 1e-5, dtype=qdtype, group_size=group_size)
            _check_block_quant(q, s, y, qdtype, group_size, torch.bfloat16, _exact_on(device))
            min_scale = 1.0 / (448.0 * 512.0) if qdtype == torch.float8_e4m3fn else torch.finfo(torch.float32).eps
            assert bool((s[1].cpu() == torch.tensor(min_scale, dtype=torch.float32)).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_block_quant_is_the_block_quant_of_h(device, dtype):
    """add_rms_norm_quant with block scales: h bit for bit add_rms_norm's, q and the scales (in either layout) bit for
    bit rms_norm_quant's of that h."""
    for shape in [(1, 8), (5, 100), (4, 128), (2, 3, 130), (3, 1000)]:
        D = shape[-1]
        x, r, w = _inputs(shape, dtype, device, seed=71 + D)
        _, h_want = rmsnorm.add_rms_norm(x, r, D, w, 1e-5)
        for qdtype in (torch.float8_e4m3fn, torch.int8):
            for group_size in (64, 128):
                for column_major in (False, True):
                    ub = torch.tensor([2.0], device=device) if qdtype == torch.float8_e4m3fn else None
                    kw = dict(dtype=qdtype, group_size=group_size, column_major_scales=column_major, scale_ub=ub)
                    q, s, h = rmsnorm.add_rms_norm_quant(x, r, D, w, 1e-5, **kw)
                    q_want, s_want = rmsnorm.rms_norm_quant(h_want, D, w, 1e-5, **kw)
                    assert torch.equal(h, h_want)
                    assert s.shape == s_want.shape and s.stride() == s_want.stride() and torch.equal(s, s_want)
                    assert torch.equal(q.view(torch.uint8), q_want.view(torch.uint8))
    # Two normalized dims.
    x, r, _w = _inputs((3, 4, 50), dtype, device, seed=72)
    q, s, h = rmsnorm.add_rms_norm_quant(x, r, (4, 50), None, group_size=64)
    q_want, s_want = rmsnorm.rms_norm_quant(h, (4, 50), None, group_size=64)
    assert q.shape == x.shape and h.shape == x.shape and s.shape == (3, 4)
    assert torch.equal(q.view(torch.uint8), q_want.view(torch.uint8)) and torch.equal(s, s_want)


@pytest.mark.parametrize("device", DEVICES)
def test_block_quant_ops(device):
    """The ops' fake kernels (layouts included) against the real ones, and no rows."""
    x, r, w = _inputs((3, 5, 130), torch.bfloat16, device, seed=81)
    ub = torch.tensor([1.0], device=device)
    for group_size in (64, 128):
        for column_major in (False, True):
            torch.library.opcheck(torch.ops.rmsnorm.forward_block_quant.default,
                                  (x, w, 1e-5, 0, torch.float8_e4m3fn, group_size, column_major, ub))
            torch.library.opcheck(torch.ops.rmsnorm.add_forward_block_quant.default,
                                  (x, r, w, 1e-5, rmsnorm.FLAG_ROUND_XHAT, torch.int8, group_size, column_major,
                                   None))
            for lead in ((0,), (2, 0), ()):
                xe = torch.ones(*lead, 130, dtype=torch.float32, device=device)
                q, s = torch.ops.rmsnorm.forward_block_quant(xe, None, 1e-5, 0, torch.int8, group_size, column_major,
                                                             None)
                fake = torch.ops.rmsnorm.forward_block_quant(xe.to("meta"), None, 1e-5, 0, torch.int8, group_size,
                                                             column_major, None)[1]
                assert q.shape == xe.shape and s.shape == (*lead, -(-130 // group_size))
                assert s.stride() == fake.stride()
                q2, s2, h2 = torch.ops.rmsnorm.add_forward_block_quant(xe, xe, None, 1e-5, 0, torch.int8, group_size,
                                                                       column_major, None)
                assert s2.shape == s.shape and s2.stride() == s.stride() and h2.shape == xe.shape


def test_block_quant_compiles():
    x, r, w = _inputs((8, 200), torch.bfloat16, "cpu", seed=91)

    def step(x, r, w):
        q, s, h = rmsnorm.add_rms_norm_quant(x, r, 200, w, 1e-5, group_size=128, column_major_scales=True)
        q2, s2 = rmsnorm.rms_norm_quant(h, 200, w, 1e-5, dtype=torch.int8, group_size=64)
        return q, s * 2, h, q2, s2

    compiled = torch.compile(step, fullgraph=True)
    for e, c in zip(step(x, r, w), compiled(x, r, w)):
        assert e.shape == c.shape and e.dtype == c.dtype
        assert torch.equal(e.view(torch.uint8) if e.element_size() == 1 else e,
                           c.view(torch.uint8) if c.element_size() == 1 else c)


@pytest.mark.parametrize("device", DEVICES)
def test_block_quant_scales_alignment(device):
    # Column-major scales with the block stride padded to a multiple of 4 (16 bytes): the same values as without
    # padding, the leading dims dense, every padded column in the storage.
    for shape, group_size in (((5, 300), 128), ((2, 3, 130), 64), ((1, 100), 64), ((9, 256), 128)):
        x, r, w = _inputs(shape, torch.bfloat16, device, seed=94)
        D = shape[-1]
        rows = 1
        for n in shape[:-1]:
            rows *= n
        nb, padded = -(-D // group_size), -(-rows // 4) * 4
        want_q, want_s = rmsnorm.rms_norm_quant(x, D, w, 1e-5, group_size=group_size, column_major_scales=True)
        q, s = rmsnorm.rms_norm_quant(x, D, w, 1e-5, group_size=group_size, column_major_scales=True,
                                      scales_alignment=4)
        assert tuple(s.shape) == tuple(shape[:-1]) + (nb,)
        assert s.stride(-1) == padded, (shape, s.stride())
        assert s.untyped_storage().nbytes() >= nb * padded * 4
        assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(s, want_s)
        _, s2, h = rmsnorm.add_rms_norm_quant(x, r, D, w, 1e-5, group_size=group_size, column_major_scales=True,
                                              scales_alignment=4)
        _, want_s2 = rmsnorm.rms_norm_quant(h, D, w, 1e-5, group_size=group_size, column_major_scales=True)
        assert s2.stride(-1) == padded and torch.equal(s2, want_s2)
    x, r, w = _inputs((4, 130), torch.float32, device, seed=95)
    for call in (lambda: rmsnorm.rms_norm_quant(x, 130, w, group_size=64, scales_alignment=4),
                 lambda: rmsnorm.rms_norm_quant(x, 130, w, group_size=64, column_major_scales=True, scales_alignment=0),
                 lambda: rmsnorm.rms_norm_quant(x, 130, w, group_size=64, column_major_scales=True,
                                                scales_alignment=True),
                 lambda: rmsnorm.add_rms_norm_quant(x, r, 130, w, group_size=64, column_major_scales=True,
                                                    scales_alignment=2048)):
        with pytest.raises(ValueError, match="scales_alignment"):
            call()
    with pytest.raises(RuntimeError, match="scales_alignment"):
        torch.ops.rmsnorm.forward_block_quant(x, w, 1e-5, 0, torch.int8, 64, False, None, 4)
    for column_major, align in ((True, 4), (True, 3), (False, 1)):
        torch.library.opcheck(torch.ops.rmsnorm.forward_block_quant,
                              (x, w, 1e-5, 0, torch.float8_e4m3fn, 64, column_major, None, align))
        torch.library.opcheck(torch.ops.rmsnorm.add_forward_block_quant,
                              (x, r, w, 1e-5, 0, torch.int8, 128, column_major, None, align))


def test_quant_outputs_carry_no_autograd_history_when_compiled():
    # A parameter weight (requires grad): eager and compiled, every quantized form returns outputs that do not
    # require grad, so that nothing can seem to backpropagate through them.
    x, r, w = _inputs((8, 256), torch.bfloat16, "cpu", seed=93)
    w = torch.nn.Parameter(w)
    x.requires_grad_(True)

    def step(x, r, w):
        q1, s1 = rmsnorm.rms_norm_quant(x, 256, w, 1e-5)
        q2, s2 = rmsnorm.rms_norm_quant(x, 256, w, 1e-5, dtype=torch.int8, scale=torch.full((1,), 0.05))
        q3, s3 = rmsnorm.rms_norm_quant(x, 256, w, 1e-5, group_size=128)
        q4, s4, h4 = rmsnorm.add_rms_norm_quant(x, r, 256, w, 1e-5)
        q5, s5, h5 = rmsnorm.add_rms_norm_quant(x, r, 256, w, 1e-5, group_size=64, column_major_scales=True)
        return q1, s1, q2, q3, s3, q4, s4, h4, q5, s5, h5

    compiled = torch.compile(step, fullgraph=True)
    for name, f in (("eager", step), ("compiled", compiled)):
        outs = f(x, r, w)
        assert [o.requires_grad for o in outs] == [False] * len(outs), name
    for e, c in zip(step(x, r, w), compiled(x, r, w)):
        assert torch.equal(e.view(torch.uint8) if e.element_size() == 1 else e,
                           c.view(torch.uint8) if c.element_size() == 1 else c)


def test_block_quant_errors():
    x, r, w = _inputs((4, 130), torch.float32, "cpu", seed=92)
    op, add_op = torch.ops.rmsnorm.forward_block_quant, torch.ops.rmsnorm.add_forward_block_quant
    cases = [
        (ValueError, "group_size must be None", lambda: rmsnorm.rms_norm_quant(x, 130, w, group_size=32)),
        (ValueError, "group_size must be None", lambda: rmsnorm.rms_norm_quant(x, 130, w, group_size=0)),
        (ValueError, "group_size must be None", lambda: rmsnorm.rms_norm_quant(x, 130, w, group_size=True)),
        (ValueError, "group_size must be None", lambda: rmsnorm.rms_norm_quant(x, 130, w, group_size=128.0)),
        (ValueError, "group_size must be None", lambda: rmsnorm.add_rms_norm_quant(x, r, 130, w, group_size=256)),
        (ValueError, "a static scale cannot be given",
         lambda: rmsnorm.rms_norm_quant(x, 130, w, group_size=128, scale=torch.ones(1))),
        (ValueError, "a static scale cannot be given",
         lambda: rmsnorm.add_rms_norm_quant(x, r, 130, w, group_size=64, scale=torch.ones(1))),
        (ValueError, "column_major_scales=True needs block scales",
         lambda: rmsnorm.rms_norm_quant(x, 130, w, column_major_scales=True)),
        (ValueError, "column_major_scales=True needs block scales",
         lambda: rmsnorm.add_rms_norm_quant(x, r, 130, w, column_major_scales=True)),
        # The library's status, through check_status.
        (RuntimeError, "RMSNORM_STATUS_INVALID_OPTION: quant.scale_ub",
         lambda: rmsnorm.rms_norm_quant(x, 130, w, dtype=torch.int8, group_size=64, scale_ub=torch.ones(1))),
        (RuntimeError, "scale_ub must be a one-element float32",
         lambda: rmsnorm.rms_norm_quant(x, 130, w, group_size=64, scale_ub=torch.ones(2))),
        (RuntimeError, "out_dtype must be",
         lambda: rmsnorm.rms_norm_quant(x, 130, w, dtype=torch.float16, group_size=64)),
        (RuntimeError, "normalized_shape=[8]", lambda: rmsnorm.rms_norm_quant(x, 8, w, group_size=64)),
        (RuntimeError, "weight has shape", lambda: rmsnorm.rms_norm_quant(x, 130, w[:8], group_size=64)),
        (RuntimeError, "residual has shape", lambda: rmsnorm.add_rms_norm_quant(x, r[:2], 130, w, group_size=64)),
        (RuntimeError, "group_size must be 64 or 128, got 32",
         lambda: op(x, w, 1e-5, 0, torch.float8_e4m3fn, 32, False, None)),
        (RuntimeError, "group_size must be 64 or 128, got -128",
         lambda: add_op(x, r, w, 1e-5, 0, torch.float8_e4m3fn, -128, True, None)),
        (RuntimeError, "group_size must be 64 or 128, got 0",
         lambda: op(x, None, 1e-5, 0, torch.float8_e4m3fn, 0, False, None)),
        (RuntimeError, "group_size must be 64 or 128, got 0",
         lambda: add_op(x, r, None, 1e-5, 0, torch.int8, 0, False, None)),
        (RuntimeError, "group_size must be 64 or 128, got 0",
         lambda: op(x.to("meta"), None, 1e-5, 0, torch.float8_e4m3fn, 0, False, None)),
        (RuntimeError, "group_size must be 64 or 128, got 256",
         lambda: add_op(x.to("meta"), r.to("meta"), None, 1e-5, 0, torch.int8, 256, False, None)),
    ]
    for exc, text, fn in cases:
        with pytest.raises(exc) as info:
            fn()
        assert text in str(info.value), f"{text!r} not in {str(info.value)!r}"
