"""The eager autograd node in C++ (rmsnorm::forward_autograd, _autograd.so) against the Python Function it replaces:
the same y and the same gradient bits, for every combination of what requires grad."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.autograd.forward_ad as fwAD

import rmsnorm
from helpers import DEVICES, randn

from rmsnorm import _build_info


def test_cpp_autograd_is_loaded_where_built_for_this_torch():
    # The build records the torch it compiled against; under that same torch the C++ node must be the eager path.
    assert _build_info.CPP_AUTOGRAD, "the package was built without _autograd.so (RMSNORM_TORCH_CPP_AUTOGRAD=OFF)"
    asked_for_python = os.environ.get("RMSNORM_PY_AUTOGRAD") == "1"
    assert (_build_info.TORCH_VERSION == torch.__version__ and not asked_for_python) == rmsnorm.cpp_autograd


def test_python_function_when_asked():
    out = subprocess.run(
        [sys.executable, "-c", "import rmsnorm; print(rmsnorm.cpp_autograd)"],
        env={"RMSNORM_PY_AUTOGRAD": "1", "PATH": ""}, capture_output=True, text=True, cwd="/", check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(not rmsnorm.cpp_autograd, reason="_autograd.so is not loaded under this torch")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpp_node_matches_the_python_function(device, dtype):
    gen = torch.Generator().manual_seed(5)
    cpp = torch.ops.rmsnorm.forward_autograd.default
    py = rmsnorm._EagerRMSNorm.apply
    for shape, has_w, flags in [((3, 7, 96), True, 0), ((5, 1000), True, rmsnorm.FLAG_WEIGHT_OFFSET),
                                ((2, 33), False, 0), ((4, 128), True, rmsnorm.FLAG_ROUND_XHAT)]:
        x0 = randn(*shape, dtype=dtype, gen=gen, device=device)
        w0 = randn(shape[-1], dtype=dtype, gen=gen, device=device) if has_w else None
        gy = randn(*shape, dtype=dtype, gen=gen, device=device)
        for x_grad, w_grad in [(True, True), (True, False), (False, True)]:
            if w0 is None and not x_grad:
                continue
            got, want = [], []
            for f, out in ((cpp, got), (py, want)):
                x = x0.detach().requires_grad_(x_grad)
                w = None if w0 is None else w0.detach().requires_grad_(w_grad and has_w)
                y = f(x, w, 1e-5, flags)
                inputs = [t for t in (x, w) if t is not None and t.requires_grad]
                out.append(y.detach())
                out.extend(torch.autograd.grad(y, inputs, gy))
                assert y.grad_fn is not None
            assert len(got) == len(want)
            for i, (a, b) in enumerate(zip(got, want)):
                assert torch.equal(a, b), f"{shape} flags {flags} x_grad {x_grad} w_grad {w_grad}: output {i} differs"


@pytest.mark.skipif(not rmsnorm.cpp_autograd, reason="_autograd.so is not loaded under this torch")
def test_eager_rms_norm_goes_through_the_cpp_node():
    x = randn(4, 64).requires_grad_(True)
    w = randn(64).requires_grad_(True)
    y = rmsnorm.rms_norm(x, 64, w)
    assert "RMSNormFunction" in y.grad_fn.name(), y.grad_fn.name()  # the C++ node's name, not _EagerRMSNormBackward


@pytest.mark.skipif(not rmsnorm.cpp_autograd, reason="_autograd.so is not loaded under this torch")
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_forward_autograd(device):
    # The operator has only its Autograd kernel; below it the dispatcher reaches rmsnorm::forward (and its fake).
    gen = torch.Generator().manual_seed(6)
    x = randn(3, 64, gen=gen, device=device)
    w = randn(64, gen=gen, device=device)
    samples = [(x.requires_grad_(True), w.requires_grad_(True), 1e-5, 0), (x, None, 1e-5, 0),
               (x.detach(), w, 1e-5, rmsnorm.FLAG_WEIGHT_OFFSET), (x.detach(), w.detach(), 1e-5, rmsnorm.FLAG_ROUND_XHAT)]
    for args in samples:
        torch.library.opcheck(torch.ops.rmsnorm.forward_autograd.default, args)


def _formula64(x, weight, eps, weight_offset):
    """The exact formula in float64 torch ops: the reference for higher-order gradients."""
    xd = x.double()
    y = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * (weight.double() + 1.0 if weight_offset else weight.double())
    return y


def _penalty_grads(fn, inputs, probe):
    """A gradient penalty: d/d(inputs) of sum(g^2), g = d(y . probe)/d(inputs) taken with create_graph=True."""
    y = fn(*inputs)
    g = torch.autograd.grad((y.double() * probe).sum(), inputs, create_graph=True)
    return torch.autograd.grad(sum(t.double().pow(2).sum() for t in g), inputs)


def _assert_rel(got, want, tol, what):
    err = ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
    assert err <= tol, f"{what}: max relative error {err:.3g} > {tol}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", ["public", "python_function", "registered"])
def test_double_backward_matches_the_formula(device, path):
    # The kernels' backward is not differentiable; under create_graph=True each autograd path (the C++ node or
    # the Python Function behind rms_norm, and the operator's registered autograd that torch.compile and direct
    # op calls use) computes the backward with differentiable torch ops instead. Without it, a gradient penalty
    # through rms_norm silently lost the norm's second-order terms (None where allow_unused, else an error).
    gen = torch.Generator().manual_seed(11)
    ops = {
        "public": lambda x, w, f: rmsnorm.rms_norm(x, x.shape[-1], w, 1e-5,
                                                   weight_offset=bool(f & rmsnorm.FLAG_WEIGHT_OFFSET)),
        "python_function": lambda x, w, f: rmsnorm._EagerRMSNorm.apply(x, w, 1e-5, f),
        "registered": lambda x, w, f: torch.ops.rmsnorm.forward.default(x, w, 1e-5, f)[0],
    }
    op = ops[path]
    for shape, has_w, flags in [((4, 64), True, 0), ((2, 3, 40), True, rmsnorm.FLAG_WEIGHT_OFFSET), ((5, 33), False, 0)]:
        x = randn(*shape, device=device, gen=gen).requires_grad_()
        w = randn(shape[-1], device=device, gen=gen).requires_grad_() if has_w else None
        inputs = [x] + ([w] if has_w else [])
        probe = randn(*shape, device=device, gen=gen).double()
        got = _penalty_grads(lambda *a: op(a[0], a[1] if has_w else None, flags), inputs, probe)
        xd = x.detach().double().requires_grad_()
        wd = w.detach().double().requires_grad_() if has_w else None
        want = _penalty_grads(lambda *a: _formula64(a[0], a[1] if has_w else None, 1e-5,
                                                    bool(flags & rmsnorm.FLAG_WEIGHT_OFFSET)),
                              [xd] + ([wd] if has_w else []), probe)
        for g, e, name in zip(got, want, ["x", "w"]):
            _assert_rel(g, e, 1e-4, f"{path} {shape} flags={flags}: d(penalty)/d{name}")


@pytest.mark.parametrize("device", DEVICES)
def test_add_double_backward_matches_the_formula(device):
    gen = torch.Generator().manual_seed(12)
    x, r = (randn(3, 48, device=device, gen=gen).requires_grad_() for _ in range(2))
    w = randn(48, device=device, gen=gen).requires_grad_()
    probe = randn(3, 48, device=device, gen=gen).double()

    def ours(a, b, c):
        y, h = rmsnorm.add_rms_norm(a, b, 48, c, 1e-5)
        return y + h.pow(2)  # h's other consumer: the backward's g_h

    def formula(a, b, c):
        h = a + b
        return _formula64(h, c, 1e-5, False) + h.pow(2)

    got = _penalty_grads(ours, [x, r, w], probe)
    want = _penalty_grads(formula, [t.detach().double().requires_grad_() for t in (x, r, w)], probe)
    for g, e, name in zip(got, want, ["x", "residual", "w"]):
        _assert_rel(g, e, 1e-4, f"add_rms_norm: d(penalty)/d{name}")


@pytest.mark.parametrize("device", DEVICES)
def test_func_transforms(device):
    # torch.func (grad, vmap, jacrev, hessian) cannot run the kernels' operators; rms_norm and add_rms_norm take
    # the same formula in torch ops there. Before, torch.func.grad of rms_norm raised from inside torch.
    from torch.func import grad, hessian, jacrev, vmap

    gen = torch.Generator().manual_seed(13)
    x = randn(3, 16, device=device, gen=gen)
    w = randn(16, device=device, gen=gen)

    def f(a):
        return rmsnorm.rms_norm(a, 16, w, 1e-5).pow(3).sum()

    def f64(a):
        return _formula64(a, w, 1e-5, False).pow(3).sum()

    _assert_rel(grad(f)(x), grad(f64)(x.double()), 1e-5, "grad")
    _assert_rel(jacrev(grad(f))(x), jacrev(grad(f64))(x.double()), 1e-4, "jacrev(grad)")
    _assert_rel(hessian(f)(x[0]), hessian(f64)(x[0].double()), 1e-4, "hessian")
    _assert_rel(vmap(lambda a: rmsnorm.rms_norm(a, 16, w, 1e-5))(x), _formula64(x, w, 1e-5, False), 1e-6, "vmap")

    def fa(a, b):
        y, h = rmsnorm.add_rms_norm(a, b, 16, w, 1e-5)
        return y.pow(2).sum() + h.pow(2).sum()

    def fa64(a, b):
        h = a + b
        return _formula64(h, w, 1e-5, False).pow(2).sum() + h.pow(2).sum()

    r = randn(3, 16, device=device, gen=gen)
    _assert_rel(grad(fa)(x, r), grad(fa64)(x.double(), r.double()), 1e-5, "add_rms_norm grad")
    with pytest.raises(RuntimeError, match="weight has shape"):
        grad(lambda a: rmsnorm.rms_norm(a, 16, torch.ones(3, device=device)).sum())(x)


def _assert_rows_rel(got, want, tol, what):
    """Each row within tol of its own largest |want| (the rows here differ in scale by 2^200)."""
    g, w = got.double().reshape(-1, got.shape[-1]), want.double().reshape(-1, want.shape[-1])
    err = ((g - w).abs().amax(-1) / w.abs().amax(-1).clamp_min(1e-300)).max().item()
    assert err <= tol, f"{what}: max row-relative error {err:.3g} > {tol}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", ["python_function", "registered", "public"])
def test_formula_paths_rescale_extreme_rows(device, path):
    # The kernels sum a row's squares again scaled by 2^-80 or 2^80 where the fp32 sum overflows or underflows
    # (rows near 1e20, or near 1e-30 with eps = 0); the torch-ops formula paths (torch.func, forward AD,
    # create_graph=True) scale every row by a power of two and cover the same range. Before, they gave y = 0 (huge
    # rows) or inf (tiny rows) there, and gradients of 0 or NaN, where the kernels' were right; a row near 2^60
    # (whose squares fit) lost its tangent to r^3's underflow.
    gen = torch.Generator().manual_seed(21)
    d = 48
    scale = torch.tensor([2.0**100, 2.0**-100, 1.0, 2.0**60], device=device).unsqueeze(-1)
    x = randn(4, d, device=device, gen=gen) * scale
    w = randn(d, device=device, gen=gen)
    gy = randn(4, d, device=device, gen=gen)
    t = randn(4, d, device=device, gen=gen) * scale
    want = _formula64(x, w, 0.0, False)
    assert torch.isfinite(want).all()
    # The CUDA kernels rescale only in the looped band (README, "The maths"), the CPU backend at every D.
    kernels_rescale = device == "cpu"
    if kernels_rescale:
        _assert_rows_rel(rmsnorm.rms_norm(x, d, w, 0.0), want, 1e-6, "the kernel's y")
    _assert_rows_rel(torch.func.vmap(lambda a: rmsnorm.rms_norm(a, d, w, 0.0))(x), want, 1e-6, "vmap y")
    with fwAD.dual_level():
        out = fwAD.unpack_dual(rmsnorm.rms_norm(fwAD.make_dual(x, t), d, w, 0.0))
    _, want_t = torch.func.jvp(lambda a: _formula64(a, w, 0.0, False), (x.double(),), (t.double(),))
    _assert_rows_rel(out.primal, want, 1e-6, "forward AD y")
    _assert_rows_rel(out.tangent, want_t, 1e-5, "forward AD tangent")
    # create_graph=True on each autograd path: the gradient against the kernels' (no graph) and float64.
    ops = {
        "public": lambda a, b: rmsnorm.rms_norm(a, d, b, 0.0),
        "python_function": lambda a, b: rmsnorm._EagerRMSNorm.apply(a, b, 0.0, 0),
        "registered": lambda a, b: torch.ops.rmsnorm.forward.default(a, b, 0.0, 0)[0],
    }
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    want_gx, want_gw = torch.autograd.grad(_formula64(xd, wd, 0.0, False), (xd, wd), gy.double())
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    gx, gw = torch.autograd.grad(ops[path](xg, wg), (xg, wg), gy, create_graph=True)
    assert gx.requires_grad
    _assert_rows_rel(gx, want_gx, 1e-5, f"{path} gx with create_graph")
    _assert_rel(gw, want_gw, 1e-5, f"{path} gw with create_graph")
    if kernels_rescale:
        kx, _ = torch.autograd.grad(ops[path](xg, wg), (xg, wg), gy)
        _assert_rows_rel(kx, want_gx, 1e-5, f"{path} gx, the kernels'")
    # add_rms_norm under torch.func: h's rows are x's, normalized by the same rule.
    ya = torch.func.vmap(lambda a, b: rmsnorm.add_rms_norm(a, b, d, w, 0.0)[0])(x, x)
    _assert_rows_rel(ya, want, 1e-6, "vmap add_rms_norm y")
