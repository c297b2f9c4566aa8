"""The eager autograd node in C++ (rmsnorm::forward_autograd, _autograd.so) against the Python Function it replaces:
the same y and the same gradient bits, for every combination of what requires grad."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

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
