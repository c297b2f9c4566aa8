"""The operator registrations (torch.library.opcheck) and the error cases."""

from __future__ import annotations

import importlib.metadata
import pathlib
import re

import pytest
import torch

import rmsnorm
from helpers import DEVICES, randn


def _forward_samples(device):
    gen = torch.Generator().manual_seed(1)
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        x = randn(3, 5, 64, dtype=dtype, gen=gen, device=device)
        w = randn(64, dtype=dtype, gen=gen, device=device)
        out.append((x, w, 1e-5, 0))
        out.append((x.requires_grad_(True), w.requires_grad_(True), 1e-6, rmsnorm.FLAG_ROUND_XHAT))
        out.append((randn(4, 96, dtype=dtype, gen=gen, device=device).requires_grad_(True), None, 0.0, 0))
        out.append((randn(2, 3 * 32, gen=gen, device=device)[:, 32:64].requires_grad_(True),
                    randn(32, gen=gen, device=device).requires_grad_(True), 1e-5, rmsnorm.FLAG_WEIGHT_OFFSET))
    return out


def _backward_samples(device):
    gen = torch.Generator().manual_seed(2)
    out = []
    for dtype in (torch.float32, torch.float16):
        x = randn(6, 48, dtype=dtype, gen=gen, device=device)
        w = randn(48, dtype=dtype, gen=gen, device=device)
        _, rstd = torch.ops.rmsnorm.forward(x, w, 1e-5, 0)
        gy = randn(6, 48, dtype=dtype, gen=gen, device=device)
        out.append((gy, x, w, rstd, 0, dtype))
        out.append((gy, x, w, rstd, rmsnorm.FLAG_WEIGHT_OFFSET, torch.float32))
        out.append((gy, x, w, rstd, 0, None))
        out.append((gy, x, None, rstd, 0, None))
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_forward(device):
    for args in _forward_samples(device):
        torch.library.opcheck(torch.ops.rmsnorm.forward.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_forward_inference(device):
    for x, w, eps, flags in _forward_samples(device):
        args = (x.detach(), None if w is None else w.detach(), eps, flags)
        torch.library.opcheck(torch.ops.rmsnorm.forward_inference.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_forward_inference_is_the_forwards_y(device):
    # Same kernel, rstd not written: the same y (the allocator is handed a NaN-filled block first, which y may reuse).
    for x, w, eps, flags in _forward_samples(device):
        x, w = x.detach(), None if w is None else w.detach()
        y, _ = torch.ops.rmsnorm.forward(x, w, eps, flags)
        torch.full(x.shape, float("nan"), dtype=x.dtype, device=device)  # a NaN block for the next allocation
        y_inf = torch.ops.rmsnorm.forward_inference(x, w, eps, flags)
        assert y_inf.shape == x.shape and y_inf.dtype == x.dtype and y_inf.is_contiguous()
        assert torch.equal(y_inf, y)
    # What the eager no-grad path calls; with a gradient needed the forward saves rstd instead.
    x, w = randn(5, 64, device=device), randn(64, device=device)
    with torch.no_grad():
        assert torch.equal(rmsnorm.rms_norm(x, 64, w, 1e-5), torch.ops.rmsnorm.forward(x, w, 1e-5, 0)[0])
    assert torch.ops.rmsnorm.forward_inference(torch.empty(0, 8, device=device), None, 1e-5, 0).shape == (0, 8)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_backward(device):
    for args in _backward_samples(device):
        torch.library.opcheck(torch.ops.rmsnorm.backward.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_errors_name_the_argument(device):
    x = randn(4, 16, device=device)
    w = randn(16, device=device)
    cases = [
        (TypeError, "input has dtype torch.float64", lambda: rmsnorm.rms_norm(x.double(), 16)),
        (TypeError, "input has dtype torch.int32", lambda: rmsnorm.rms_norm(x.int(), 16)),
        (RuntimeError, "weight has shape [8]", lambda: rmsnorm.rms_norm(x, 16, w[:8])),
        (RuntimeError, "normalized_shape=[8]", lambda: rmsnorm.rms_norm(x, 8)),
        (RuntimeError, "normalized_shape=[2, 16]", lambda: rmsnorm.rms_norm(x, (2, 16))),
        (TypeError, "weight has dtype torch.float64 but input has torch.bfloat16",
         lambda: rmsnorm.rms_norm(x.bfloat16(), 16, w.double())),
        (TypeError, "weight has dtype torch.bfloat16 but input has torch.float16",
         lambda: rmsnorm.rms_norm(x.half(), 16, w.bfloat16())),
        (RuntimeError, "eps", lambda: rmsnorm.rms_norm(x, 16, w, -1.0)),
        (RuntimeError, "eps", lambda: rmsnorm.rms_norm(x, 16, w, float("nan"))),
        # The operators themselves check what the Python layer would (direct calls, compiled graphs).
        (RuntimeError, "x has dtype float64", lambda: torch.ops.rmsnorm.forward(x.double(), None, 1e-5, 0)),
        (RuntimeError, "weight has shape [8]", lambda: torch.ops.rmsnorm.forward(x, w[:8], 1e-5, 0)),
        (RuntimeError, "weight has dtype float16", lambda: torch.ops.rmsnorm.forward(x, w.half(), 1e-5, 0)),
        (RuntimeError, "flags", lambda: torch.ops.rmsnorm.forward(x, w, 1e-5, 64)),
        (RuntimeError, "flags", lambda: torch.ops.rmsnorm.forward(x, w, 1e-5, -1)),
        (RuntimeError, "RMSNORM_FLAG_WEIGHT_F32", lambda: torch.ops.rmsnorm.forward(x, w, 1e-5, 16)),
        (RuntimeError, "RMSNORM_FLAG_WEIGHT_F32",
         lambda: torch.ops.rmsnorm.backward(x, x, w, x[:, 0], 16, torch.float32)),
        (RuntimeError, "x has dtype float64",
         lambda: torch.ops.rmsnorm.forward_inference(x.double(), None, 1e-5, 0)),
        (RuntimeError, "weight has shape [8]", lambda: torch.ops.rmsnorm.forward_inference(x, w[:8], 1e-5, 0)),
        (RuntimeError, "flags", lambda: torch.ops.rmsnorm.forward_inference(x, w, 1e-5, 64)),
        (RuntimeError, "gy has shape", lambda: torch.ops.rmsnorm.backward(x[:2], x, w, x[:, 0], 0, None)),
        (RuntimeError, "rstd has shape", lambda: torch.ops.rmsnorm.backward(x, x, w, x[:2, 0], 0, None)),
        (RuntimeError, "rstd must be float32",
         lambda: torch.ops.rmsnorm.backward(x, x, w, x[:, 0].half(), 0, None)),
        (RuntimeError, "gw_dtype is given but there is no weight",
         lambda: torch.ops.rmsnorm.backward(x, x, None, x[:, 0], 0, torch.float32)),
        (RuntimeError, "gw_dtype must be", lambda: torch.ops.rmsnorm.backward(x, x, w, x[:, 0], 0, torch.float16)),
        (RuntimeError, "last dim of x has size 0",
         lambda: torch.ops.rmsnorm.forward(torch.empty(3, 0, device=device), None, 1e-5, 0)),
    ]
    for exc, text, fn in cases:
        with pytest.raises(exc) as info:
            fn()
        assert text in str(info.value), f"{text!r} not in {str(info.value)!r}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (needs a second device type)")
def test_mixed_devices_are_an_error():
    x = randn(4, 16)
    w = randn(16, device="cuda")
    with pytest.raises(RuntimeError, match="weight is on cuda:0 but input is on cpu"):
        rmsnorm.rms_norm(x, 16, w)
    with pytest.raises(RuntimeError, match="weight is on another device than x"):
        torch.ops.rmsnorm.forward(x, w, 1e-5, 0)
    with pytest.raises(RuntimeError, match="gy is on another device than x"):
        torch.ops.rmsnorm.backward(x.cuda(), x, None, x[:, 0], 0, None)


def test_mixed_devices_with_meta():
    # Without a GPU the device check still runs in Python: a meta weight with a CPU input.
    with pytest.raises(RuntimeError, match="weight is on meta but input is on cpu"):
        rmsnorm.rms_norm(randn(4, 16), 16, torch.empty(16, device="meta"))


def test_meta_tensors_follow_the_argument_rules():
    # rms_norm leaves the checks to the operator; on meta tensors that is the fake kernel, which must refuse the same.
    x = torch.empty(3, 4, device="meta")
    cases = [
        (RuntimeError, "weight has shape [2, 2]", lambda: rmsnorm.rms_norm(x, 4, torch.empty(2, 2, device="meta"))),
        (RuntimeError, "weight has shape [5]", lambda: rmsnorm.rms_norm(x, 4, torch.empty(5, device="meta"))),
        (TypeError, "weight has dtype torch.float64",
         lambda: rmsnorm.rms_norm(x, 4, torch.empty(4, device="meta", dtype=torch.float64))),
        (TypeError, "input has dtype torch.float64", lambda: rmsnorm.rms_norm(x.double(), 4)),
        (RuntimeError, "weight has shape [5]", lambda: torch.ops.rmsnorm.forward(x, torch.empty(5, device="meta"), 1e-5, 0)),
    ]
    for exc, text, fn in cases:
        with pytest.raises(exc) as info:
            fn()
        assert text in str(info.value), f"{text!r} not in {str(info.value)!r}"
    assert rmsnorm.rms_norm(x, 4, torch.empty(4, device="meta")).shape == (3, 4)


def test_eager_call_below_autograd():
    # A caller's below-autograd guard with inputs that require grad: y, and no graph.
    x = randn(3, 8).requires_grad_(True)
    w = randn(8).requires_grad_(True)
    want = rmsnorm.rms_norm(x.detach(), 8, w.detach())
    with torch._C._AutoDispatchBelowAutograd():
        y = rmsnorm.rms_norm(x, 8, w)
    assert torch.equal(y, want)


def test_versions_agree():
    """The package's version is the rmsnorm library's built into it (rmsnorm.h's, which CMake checks against
    project()), the installed distribution's and, in a source checkout, pyproject.toml's."""
    from rmsnorm import _build_info

    assert rmsnorm.__version__ == _build_info.LIBRARY_VERSION
    assert importlib.metadata.version("rmsnorm") == rmsnorm.__version__
    pyproject = pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml"
    if pyproject.exists():
        m = re.search(r'^version = "([^"]+)"$', pyproject.read_text(), re.M)
        assert m is not None and m.group(1) == rmsnorm.__version__
