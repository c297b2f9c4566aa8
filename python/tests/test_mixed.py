"""An fp32 weight with float16 / bfloat16 input (AMP and FSDP master weights; RMSNORM_FLAG_WEIGHT_F32).

The identity checked: x widened to fp32 (exact) with the same fp32 weight is the fp32 problem, whose y and gx rounded
once to the input dtype are the mixed call's, and whose gw is its gw bit for bit. Values also against float64. Then
the output dtype (RMSNORM_FLAG_Y_DTYPE) and the fp32 residual stream (RMSNORM_FLAG_RESIDUAL_F32), on the CPU and on
CUDA."""

from __future__ import annotations

import pytest
import torch

import rmsnorm
from helpers import randn, requires_cuda, row_scaled

RMSNORM_DTYPE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}  # rmsnorm.h's RMSNORM_DTYPE_*


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("weight_offset", [False, True])
def test_fp32_weight_is_the_fp32_problem_rounded_once(dtype, weight_offset):
    gen = torch.Generator().manual_seed(71)
    for shape in [(5, 64), (2, 3, 1000)]:
        d = shape[-1]
        x = row_scaled(randn(*shape, dtype=dtype, gen=gen), gen).requires_grad_(True)
        w = (1.0 + 0.3 * randn(d, gen=gen)).requires_grad_(True)  # fp32, most values not representable in dtype
        gy = randn(*shape, dtype=dtype, gen=gen)
        y = rmsnorm.rms_norm(x, d, w, 1e-5, weight_offset=weight_offset)
        assert y.dtype == dtype
        gx, gw = torch.autograd.grad(y, (x, w), gy)
        assert gx.dtype == dtype and gw.dtype == torch.float32

        xf = x.detach().float().requires_grad_(True)
        wf = w.detach().clone().requires_grad_(True)
        yf = rmsnorm.rms_norm(xf, d, wf, 1e-5, weight_offset=weight_offset)
        gxf, gwf = torch.autograd.grad(yf, (xf, wf), gy.float())
        assert torch.equal(y, yf.to(dtype))
        assert torch.equal(gx, gxf.to(dtype))
        assert torch.equal(gw, gwf)

        # float64: the weight's fp32 values are used (a weight rounded to dtype first is off by its rounding).
        x64, w64 = x.detach().double(), w.detach().double() + (1.0 if weight_offset else 0.0)
        ref = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5) * w64
        unit = 2.0**-11 if dtype == torch.float16 else 2.0**-8
        assert ((y.double() - ref).abs() <= 2 * unit * ref.abs() + 1e-6).all()
        wt = w.detach().to(dtype)
        y_rounded = rmsnorm.rms_norm(x.detach(), d, wt, 1e-5, weight_offset=weight_offset)
        assert not torch.equal(y.detach(), y_rounded)


def test_module_with_fp32_parameters_and_16_bit_input():
    """nn.RMSNorm's default fp32 parameters with bf16 activations, as under autocast: the drop-in takes them."""
    gen = torch.Generator().manual_seed(72)
    norm = rmsnorm.RMSNorm(256, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(1.0 + 0.2 * randn(256, gen=gen))
    x = randn(4, 256, dtype=torch.bfloat16, gen=gen).requires_grad_(True)
    y = norm(x)
    y.float().square().sum().backward()
    assert y.dtype == torch.bfloat16 and x.grad.dtype == torch.bfloat16 and norm.weight.grad.dtype == torch.float32
    want = rmsnorm.rms_norm(x.detach().float(), 256, norm.weight.detach(), 1e-6).to(torch.bfloat16)
    assert torch.equal(y.detach(), want)


def test_add_and_quant_take_the_fp32_weight():
    gen = torch.Generator().manual_seed(73)
    x, r = randn(3, 128, dtype=torch.bfloat16, gen=gen), randn(3, 128, dtype=torch.bfloat16, gen=gen)
    w = 1.0 + 0.3 * randn(128, gen=gen)
    y, h = rmsnorm.add_rms_norm(x, r, 128, w, 1e-5)
    assert torch.equal(y, rmsnorm.rms_norm(h, 128, w, 1e-5))
    q, s = rmsnorm.rms_norm_quant(h, 128, w, 1e-5)
    yq = rmsnorm.rms_norm(h, 128, w, 1e-5).float()
    assert torch.equal(s, torch.clamp(yq.abs().amax(-1) / 448.0, min=1.0 / (448.0 * 512.0)))


def test_other_mixed_dtypes_are_errors():
    x = randn(2, 16, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="weight has dtype torch.float16 but input has torch.bfloat16"):
        rmsnorm.rms_norm(x, 16, randn(16, dtype=torch.float16))
    with pytest.raises(RuntimeError, match="weight has dtype float32 but x has float32|gw_dtype must be"):
        torch.ops.rmsnorm.backward(x, x, randn(16), x[:, 0].float(), 0, torch.bfloat16)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_fp32_weight(dtype):
    """On CUDA (in the rows band the plain call's kernels with the weight read as fp32, above it the looped
    kernels' fp32-weight forms): y exactly T(x * rstd * w) of the rstd returned, gradients against float64 within
    the dtype's rounding."""
    gen = torch.Generator().manual_seed(74)
    for d in (64, 4096, 20000):
        x = row_scaled(randn(33, d, dtype=dtype, gen=gen), gen).cuda()
        w = (1.0 + 0.3 * randn(d, gen=gen)).cuda()
        y, rstd = torch.ops.rmsnorm.forward(x, w, 1e-5, 0)
        assert torch.equal(y, ((x.float() * rstd.unsqueeze(-1)) * w).to(dtype))
        xl, wl = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        gy = randn(33, d, dtype=dtype, gen=gen).cuda()
        gx, gw = torch.autograd.grad(rmsnorm.rms_norm(xl, d, wl, 1e-5), (xl, wl), gy)
        x64, w64 = x.double().requires_grad_(True), w.double().requires_grad_(True)
        y64 = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5) * w64
        gx64, gw64 = torch.autograd.grad(y64, (x64, w64), gy.double())
        unit = 2.0**-11 if dtype == torch.float16 else 2.0**-8
        assert gw.dtype == torch.float32
        assert ((gx.double() - gx64).abs() <= 4 * unit * gx64.abs().max(dim=-1, keepdim=True).values).all()
        assert ((gw.double() - gw64).abs() <= 1e-3 * gw64.abs().max()).all()


@pytest.mark.parametrize("x_dtype,y_dtype", [(torch.float32, torch.bfloat16), (torch.float32, torch.float16),
                                             (torch.bfloat16, torch.float32), (torch.float16, torch.bfloat16)])
def test_out_dtype_is_the_fp32_values_rounded_once(x_dtype, y_dtype):
    # out_dtype (RMSNORM_FLAG_Y_DTYPE): y is the fp32 problem's y (x widened, exact) rounded once to out_dtype; the
    # gradient arrives in out_dtype, and gx / gw are the fp32 problem's rounded once to x's (and the weight's) dtype.
    gen = torch.Generator().manual_seed(73)
    for shape in [(6, 48), (2, 3, 1000)]:
        d = shape[-1]
        x = row_scaled(randn(*shape, dtype=x_dtype, gen=gen), gen).requires_grad_(True)
        w = (1.0 + 0.3 * randn(d, gen=gen)).to(x_dtype).requires_grad_(True)
        gy = randn(*shape, dtype=y_dtype, gen=gen)
        y = rmsnorm.rms_norm(x, d, w, 1e-5, out_dtype=y_dtype)
        assert y.dtype == y_dtype and y.shape == x.shape
        gx, gw = torch.autograd.grad(y, (x, w), gy)
        assert gx.dtype == x_dtype and gw.dtype == x_dtype

        xf = x.detach().float().requires_grad_(True)
        wf = w.detach().float().requires_grad_(True)
        yf = rmsnorm.rms_norm(xf, d, wf, 1e-5)
        gxf, gwf = torch.autograd.grad(yf, (xf, wf), gy.float())
        assert torch.equal(y, yf.detach().to(y_dtype)), "y is not the fp32 problem's rounded once"
        assert torch.equal(gx, gxf.to(x_dtype)), "gx"
        assert torch.equal(gw, gwf.to(x_dtype)), "gw"
        with torch.no_grad():
            assert torch.equal(rmsnorm.rms_norm(x, d, w, 1e-5, out_dtype=y_dtype), y), "the inference path"


def test_out_dtype_rules():
    x = randn(3, 16)
    assert rmsnorm.rms_norm(x, 16, out_dtype=torch.float32).dtype == torch.float32
    with pytest.raises(TypeError, match="out_dtype"):
        rmsnorm.rms_norm(x, 16, out_dtype=torch.float64)
    # The operators check gy against y's dtype (the flags').
    flags = 3 << 8  # RMSNORM_FLAG_Y_DTYPE(RMSNORM_DTYPE_BF16)
    y, rstd = torch.ops.rmsnorm.forward(x, None, 1e-5, flags)
    assert y.dtype == torch.bfloat16
    with pytest.raises(RuntimeError, match="gy has dtype float32 but y has bfloat16"):
        torch.ops.rmsnorm.backward(x, x, None, rstd, flags, None)
    # The fused operations refuse it.
    with pytest.raises(RuntimeError, match="RMSNORM_FLAG_Y_DTYPE"):
        torch.ops.rmsnorm.add_forward(x, x, None, 1e-5, flags)
    torch.library.opcheck(torch.ops.rmsnorm.forward.default, (x, None, 1e-5, flags))
    torch.library.opcheck(torch.ops.rmsnorm.backward.default, (y.float().to(torch.bfloat16), x, None, rstd, flags, None))


def weight_y_case(y_dtype, device, gen, shape=(2, 3, 1000)):
    d = shape[-1]
    x = row_scaled(randn(*shape, gen=gen), gen).to(device)
    w = (1.0 + 0.3 * randn(d, gen=gen)).to(y_dtype).to(device)
    gy = randn(*shape, dtype=y_dtype, gen=gen).to(device)
    return x, w, gy


def weight_y_and_fp32_weight(x, w, gy):
    """y and the gradients of rms_norm(x, w, out_dtype=w.dtype) with the 16-bit w, and with w.float()."""
    out = []
    for wt in (w, w.float()):
        xl, wl = x.clone().requires_grad_(True), wt.clone().requires_grad_(True)
        y = rmsnorm.rms_norm(xl, x.shape[-1], wl, 1e-5, out_dtype=w.dtype)
        out.append((y.detach(), *torch.autograd.grad(y, (xl, wl), gy)))
    return out


@pytest.mark.parametrize("y_dtype", [torch.bfloat16, torch.float16])
def test_weight_in_out_dtype_with_fp32_input(y_dtype):
    # RMSNORM_FLAG_WEIGHT_Y_DTYPE: a float32 input (an fp32 residual stream's h) with the model's 16-bit weight and
    # y in that dtype is the call with the weight widened to fp32, bit for bit (every 16-bit value is exact in fp32);
    # the weight's gradient has the weight's dtype, the fp32 one rounded once.
    gen = torch.Generator().manual_seed(75)
    for shape in [(6, 48), (2, 3, 1000)]:
        x, w, gy = weight_y_case(y_dtype, "cpu", gen, shape)
        (y, gx, gw), (yf, gxf, gwf) = weight_y_and_fp32_weight(x, w, gy)
        assert y.dtype == y_dtype and gw.dtype == y_dtype and gx.dtype == torch.float32
        assert torch.equal(y, yf) and torch.equal(gx, gxf), "y / gx differ from the fp32 weight's"
        assert torch.equal(gw, gwf.to(y_dtype)), "gw is not the fp32 weight's rounded once"
        with torch.no_grad():
            assert torch.equal(rmsnorm.rms_norm(x, shape[-1], w, 1e-5, out_dtype=y_dtype), y), "the inference path"
    flags = ((RMSNORM_DTYPE[y_dtype] + 1) << 8)  # the operators take the weight's dtype as the flag
    torch.library.opcheck(torch.ops.rmsnorm.forward.default, (x, w, 1e-5, flags))
    _, rstd = torch.ops.rmsnorm.forward(x, w, 1e-5, flags)
    torch.library.opcheck(torch.ops.rmsnorm.backward.default, (gy, x, w, rstd, flags, y_dtype))
    torch.library.opcheck(torch.ops.rmsnorm.backward.default, (gy, x, w, rstd, flags, torch.float32))


def test_weight_in_out_dtype_rules():
    x = randn(3, 16)
    w = randn(16, dtype=torch.bfloat16)
    # A 16-bit weight with a float32 input needs out_dtype of the weight's dtype.
    with pytest.raises(TypeError, match="weight has dtype torch.bfloat16 but input has torch.float32"):
        rmsnorm.rms_norm(x, 16, w)
    with pytest.raises(TypeError, match="weight has dtype torch.bfloat16 but input has torch.float32"):
        rmsnorm.rms_norm(x, 16, w, out_dtype=torch.float16)
    with pytest.raises(RuntimeError, match="weight has dtype bfloat16 but x has float32"):
        torch.ops.rmsnorm.forward(x, w, 1e-5, 0)
    # The flag follows from the weight's dtype; the operators refuse it given.
    with pytest.raises(RuntimeError, match="RMSNORM_FLAG_WEIGHT_Y_DTYPE"):
        torch.ops.rmsnorm.forward(x, w, 1e-5, (3 << 8) | 2048)
    # The fused operations take no other y dtype, so no such weight either.
    with pytest.raises(RuntimeError, match="weight has dtype bfloat16 but x has float32"):
        torch.ops.rmsnorm.add_forward(x, x, w, 1e-5, 0)
    with pytest.raises((TypeError, RuntimeError), match="weight has dtype"):
        rmsnorm.rms_norm(x.to("meta"), 16, w.to("meta"))
    assert rmsnorm.rms_norm(x.to("meta"), 16, w.to("meta"), out_dtype=torch.bfloat16).dtype == torch.bfloat16


@requires_cuda
@pytest.mark.parametrize("y_dtype", [torch.bfloat16, torch.float16])
def test_cuda_weight_in_out_dtype_with_fp32_input(y_dtype):
    # On CUDA too the call with the 16-bit weight is the one with the weight widened, bit for bit, at D <= 4096 (the
    # held forward and the backward without element paths, at a few rows), above it and at many rows.
    gen = torch.Generator().manual_seed(76)
    for shape in [(5, 4096), (600, 1000), (3, 20000), (2, 70000)]:
        x, w, gy = weight_y_case(y_dtype, "cuda", gen, shape)
        (y, gx, gw), (yf, gxf, gwf) = weight_y_and_fp32_weight(x, w, gy)
        assert y.dtype == y_dtype and gw.dtype == y_dtype
        assert torch.equal(y, yf) and torch.equal(gx, gxf), f"{shape}: y / gx differ from the fp32 weight's"
        assert torch.equal(gw, gwf.to(y_dtype)), f"{shape}: gw is not the fp32 weight's rounded once"
        # And the C ABI's float64-checked path: y exactly Y(x * rstd * w) of the rstd it returns.
        flags = (RMSNORM_DTYPE[y_dtype] + 1) << 8
        y2, rstd = torch.ops.rmsnorm.forward(x, w, 1e-5, flags)
        assert torch.equal(y2, (x * rstd.unsqueeze(-1) * w.float()).to(y_dtype))


@requires_cuda
@pytest.mark.parametrize("x_dtype,y_dtype", [(torch.float32, torch.bfloat16), (torch.float32, torch.float16),
                                             (torch.bfloat16, torch.float32), (torch.float16, torch.bfloat16)])
def test_cuda_out_dtype(x_dtype, y_dtype):
    # CUDA runs the looped kernel's mixed form, whose sum of squares is in another order than the CPU backend's: y is
    # exactly Y(x * rstd * w) of the rstd it returns; rstd, gx and gw agree with the CPU backend's within the dtypes'
    # roundings.
    gen = torch.Generator().manual_seed(81)
    flags = (RMSNORM_DTYPE[y_dtype] + 1) << 8  # RMSNORM_FLAG_Y_DTYPE
    for shape in [(6, 48), (2, 3, 1000), (2, 70000)]:
        d = shape[-1]
        x = row_scaled(randn(*shape, dtype=x_dtype, gen=gen), gen)
        w = (1.0 + 0.3 * randn(d, gen=gen)).to(x_dtype)
        gy = randn(*shape, dtype=y_dtype, gen=gen)
        y, rstd = torch.ops.rmsnorm.forward(x.cuda(), w.cuda(), 1e-5, flags)
        assert y.dtype == y_dtype
        want = (x.cuda().float() * rstd.unsqueeze(-1) * w.cuda().float()).to(y_dtype)
        assert torch.equal(y, want), "y is not Y(x * rstd * w) of the rstd returned"
        _, rstd_cpu = torch.ops.rmsnorm.forward(x, w, 1e-5, flags)
        torch.testing.assert_close(rstd.cpu(), rstd_cpu, rtol=2e-5, atol=0)
        grads = []
        for dev in ("cpu", "cuda"):
            xl, wl = (t.to(dev).requires_grad_(True) for t in (x, w))
            yl = rmsnorm.rms_norm(xl, d, wl, 1e-5, out_dtype=y_dtype)
            grads.append([g.cpu() for g in torch.autograd.grad(yl, (xl, wl), gy.to(dev))])
        tol = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-3}[x_dtype]
        for got, ref, name in zip(grads[1], grads[0], ("gx", "gw")):
            assert got.dtype == x_dtype
            assert_close_per_row(got, ref, tol, name)


def residual_inputs(shape, dtype, gen):
    """x (16-bit), an fp32 residual (rows of very different scales), w, gy (16-bit) and g_h (fp32), on the CPU."""
    x0 = row_scaled(randn(*shape, dtype=dtype, gen=gen), gen)
    r0 = row_scaled(randn(*shape, gen=gen), gen)
    w0 = (1.0 + 0.3 * randn(shape[-1], gen=gen)).to(dtype)
    return x0, r0, w0, randn(*shape, dtype=dtype, gen=gen), randn(*shape, gen=gen)


def fused_and_eager(x0, r0, w0, gy, gh, rx):
    """(y, h, grad x, grad residual, grad w) of add_rms_norm with an fp32 residual (fused) and of its eager
    composition (h = x.float() + r, then rms_norm of h with out_dtype): gradients of y, and of h too when gh is given."""
    d, dtype = x0.shape[-1], x0.dtype
    outs = []
    for fused in (True, False):
        x, r, w = (t.detach().clone().requires_grad_(True) for t in (x0, r0, w0))
        if fused:
            y, h = rmsnorm.add_rms_norm(x, r, d, w, 1e-5, round_xhat=rx)
        else:
            h = x.float() + r
            y = rmsnorm.rms_norm(h, d, w.float(), 1e-5, round_xhat=rx, out_dtype=dtype)
        assert y.dtype == dtype and h.dtype == torch.float32
        grads = torch.autograd.grad((y, h) if gh is not None else (y,), (x, r, w),
                                    (gy, gh) if gh is not None else (gy,))
        outs.append((y.detach(), h.detach(), *grads))
    return outs


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp32_residual_stream_is_the_eager_composition(dtype):
    # add_rms_norm with a float32 residual and 16-bit input (RMSNORM_FLAG_RESIDUAL_F32): h = input.float() +
    # residual in float32, y = rms_norm of that h in the input's dtype; every gradient bit for bit the eager
    # composition's (x's gradient is residual's rounded to x's dtype).
    gen = torch.Generator().manual_seed(79)
    for shape, with_gh, rx in [((5, 64), True, False), ((2, 3, 1000), True, False), ((7, 96), False, False),
                               ((4, 256), True, True)]:
        x0, r0, w0, gy, gh = residual_inputs(shape, dtype, gen)
        outs = fused_and_eager(x0, r0, w0, gy, gh if with_gh else None, rx)
        for i, (a, b) in enumerate(zip(*outs)):
            assert a.dtype == b.dtype and torch.equal(a, b), f"{shape}: output {i} differs from the eager composition"
    x = randn(3, 32, dtype=dtype)
    r = randn(3, 32)
    w = randn(32, dtype=dtype)
    torch.library.opcheck(torch.ops.rmsnorm.add_forward.default, (x, r, w, 1e-5, 0))
    _, h, rstd = torch.ops.rmsnorm.add_forward(x, r, w, 1e-5, 0)
    torch.library.opcheck(torch.ops.rmsnorm.add_backward.default, (x, torch.randn(3, 32), h, w, rstd, 0, dtype))
    # add_backward_x: add_backward's gx and gw, and x's gradient, gx rounded to x's dtype, from the same call.
    gh = torch.randn(3, 32)
    torch.library.opcheck(torch.ops.rmsnorm.add_backward_x.default, (x, gh, h, w, rstd, 0, dtype))
    gx, gw = torch.ops.rmsnorm.add_backward(x, gh, h, w, rstd, 0, dtype)
    gx2, gx_x, gw2 = torch.ops.rmsnorm.add_backward_x(x, gh, h, w, rstd, 0, dtype)
    assert torch.equal(gx2, gx) and torch.equal(gw2, gw)
    assert gx_x.dtype == dtype and torch.equal(gx_x, gx.to(dtype))
    with pytest.raises(RuntimeError, match="fp32 residual stream"):
        torch.ops.rmsnorm.add_backward_x(x, x, x, w, rstd, 0, dtype)
    with pytest.raises(RuntimeError, match="RMSNORM_FLAG_RESIDUAL_F32"):
        torch.ops.rmsnorm.add_forward(x, r, w, 1e-5, 1024)
    with pytest.raises(TypeError, match="float32 with a float16 or bfloat16"):
        rmsnorm.add_rms_norm(x.float(), r.double(), 32, None)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_fp32_residual_stream_is_the_eager_composition(dtype):
    # On CUDA the fused op (one kernel: the add fused into the looped kernel on the fp32 h) and the eager composition
    # (torch's add, then rms_norm of the fp32 h with out_dtype: the looped kernel, the same chunks in the same order)
    # give the same bits: y, h and every gradient; and h, y against the CPU backend's within y's rounding.
    gen = torch.Generator().manual_seed(83)
    for shape, with_gh in [((5, 64), True), ((2, 3, 1000), True), ((7, 96), False), ((2, 70000), True)]:
        d = shape[-1]
        x0, r0, w0, gy, gh = residual_inputs(shape, dtype, gen)
        outs = fused_and_eager(*(t.cuda() for t in (x0, r0, w0, gy)), gh.cuda() if with_gh else None, False)
        for i, (a, b) in enumerate(zip(*outs)):
            assert a.dtype == b.dtype and torch.equal(a, b), f"{shape}: output {i} differs from the eager composition"
        # Against the CPU backend: h exactly, y and the gradients within the dtypes' roundings.
        x, r, w = (t.detach().clone().requires_grad_(True) for t in (x0, r0, w0))
        y_cpu, h_cpu = rmsnorm.add_rms_norm(x, r, d, w, 1e-5)
        grads_cpu = torch.autograd.grad((y_cpu, h_cpu) if with_gh else (y_cpu,), (x, r, w),
                                        (gy, gh) if with_gh else (gy,))
        assert torch.equal(outs[0][1].cpu(), h_cpu.detach()), "h is not float(x) + residual"
        tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
        for got, ref, name in zip((outs[0][0], *outs[0][2:]), (y_cpu.detach(), *grads_cpu), ("y", "gx", "gr", "gw")):
            assert got.dtype == ref.dtype, name
            assert_close_per_row(got.cpu(), ref, tol, name)


def assert_close_per_row(got, ref, tol, name):
    # |got - ref| <= tol * (|ref| + max |ref| of its row): rows of very different scales are each held to their own.
    g, r = got.double(), ref.double()
    bound = tol * (r.abs() + r.abs().amax(-1, keepdim=True))
    bad = (g - r).abs() > bound
    if bad.any():
        i = ((g - r).abs() / bound.clamp_min(1e-300)).argmax()
        idx = torch.unravel_index(i, g.shape)
        raise AssertionError(f"{name}: {int(bad.sum())} elements off; worst at {tuple(int(j) for j in idx)}: "
                             f"{g[idx].item()} vs {r[idx].item()} (bound {bound[idx].item()})")
