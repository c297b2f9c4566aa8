"""What users pass beyond the common call, checked against what torch itself does or what the docs say: a meta
tensor among real ones, forward-mode AD, an empty last dim, numpy and float sizes, an eps beyond float32, the
weight's shape with several normalized dims, the residual's dtype, torch.fx, dispatch modes, make_fx and export, and
a Llama-style norm with an fp32 weight under 16-bit activations."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from helpers import DEVICES, randn

import rmsnorm


@pytest.mark.parametrize("device", DEVICES)
def test_a_meta_argument_is_refused(device):
    """A meta tensor among real ones sends a call to the op's fake kernel: it must raise, not return tensors nobody
    wrote."""
    x = randn(6, 256, device=device)
    w = randn(256, device=device)
    meta_w = torch.empty(256, device="meta")
    one = torch.ones(1, device=device)
    meta_one = torch.ones(1, device="meta")
    cases = [
        lambda: rmsnorm.rms_norm(x, 256, meta_w),
        lambda: rmsnorm.rms_norm_quant(x, 256, meta_w),
        lambda: rmsnorm.rms_norm_quant(x, 256, w, scale=meta_one),
        lambda: rmsnorm.rms_norm_quant(x, 256, w, scale_ub=meta_one),
        lambda: rmsnorm.rms_norm_quant(x, 256, w, group_size=128, scale_ub=meta_one),
        lambda: rmsnorm.add_rms_norm(x, torch.empty(6, 256, device="meta"), 256, w),
        lambda: rmsnorm.add_rms_norm_quant(x, torch.empty(6, 256, device="meta"), 256, w),
        lambda: torch.ops.rmsnorm.forward_quant(x, meta_w, 1e-5, 0, torch.int8, None, None),
        lambda: torch.ops.rmsnorm.forward_quant(x, w, 1e-5, 0, torch.int8, meta_one, None),
        lambda: torch.ops.rmsnorm.forward_block_quant(x, w, 1e-5, 0, torch.int8, 128, False, meta_one, 1),
        lambda: torch.ops.rmsnorm.add_forward(x, torch.empty(6, 256, device="meta"), w, 1e-5, 0),
        lambda: torch.ops.rmsnorm.add_forward_quant(x, torch.empty(6, 256, device="meta"), w, 1e-5, 0, torch.int8,
                                                    one, None),
        lambda: torch.ops.rmsnorm.backward(x, x, w, torch.ones(6, device="meta"), 0, None),
        lambda: torch.ops.rmsnorm.add_backward(x, x, x, w, torch.ones(6, device="meta"), 0, None),
        lambda: torch.ops.rmsnorm.add_backward_x(x, x.float(), x.float(), w, torch.ones(6, device="meta"), 0, None),
    ]
    for i, fn in enumerate(cases):
        with pytest.raises(RuntimeError, match="meta"):
            out = fn()
            pytest.fail(f"case {i} returned {out!r}")


def test_forward_ad_matches_torch():
    """Forward-mode AD (forward_ad.dual_level): the tangent is F.rms_norm's, not dropped."""
    gen = torch.Generator().manual_seed(3)
    x, t, w = randn(4, 16, gen=gen), randn(4, 16, gen=gen), randn(16, gen=gen)
    with fwAD.dual_level():
        xd = fwAD.make_dual(x, t)
        ours = fwAD.unpack_dual(rmsnorm.rms_norm(xd, 16, w)).tangent
        theirs = fwAD.unpack_dual(F.rms_norm(xd, (16,), w)).tangent
        assert ours is not None
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
        y, h = rmsnorm.add_rms_norm(xd, x, 16, w)
        r = x + x
        want = fwAD.unpack_dual(F.rms_norm(fwAD.make_dual(r, t), (16,), w)).tangent
        torch.testing.assert_close(fwAD.unpack_dual(y).tangent, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(fwAD.unpack_dual(h).tangent, t)
        # The module, and several normalized dims.
        m = rmsnorm.RMSNorm((2, 8))
        with torch.no_grad():
            m.weight.copy_(w.view(2, 8))
        ours = fwAD.unpack_dual(m(fwAD.make_dual(x.view(4, 2, 8), t.view(4, 2, 8)))).tangent
        theirs = fwAD.unpack_dual(F.rms_norm(fwAD.make_dual(x.view(4, 2, 8), t.view(4, 2, 8)), (2, 8),
                                             w.view(2, 8))).tangent
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_empty_last_dim_is_f_rms_norms():
    """D = 0: F.rms_norm returns an empty tensor (and empty gradients); so do rms_norm, RMSNorm and add_rms_norm."""
    x = torch.randn(4, 0, requires_grad=True)
    w = torch.randn(0, requires_grad=True)
    y = rmsnorm.rms_norm(x, 0, w)
    want = F.rms_norm(x, (0,), w)
    assert y.shape == want.shape and y.dtype == want.dtype
    y.sum().backward()
    assert x.grad.shape == (4, 0) and w.grad.shape == (0,)
    assert rmsnorm.RMSNorm(0)(torch.randn(3, 0)).shape == (3, 0)
    assert rmsnorm.rms_norm(torch.randn(2, 3, 0), [3, 0]).shape == (2, 3, 0)
    y, h = rmsnorm.add_rms_norm(torch.randn(4, 0), torch.randn(4, 0), 0)
    assert y.shape == (4, 0) and h.shape == (4, 0)
    # Zero rows as well as zero columns.
    assert rmsnorm.rms_norm(torch.randn(0, 0), 0).shape == (0, 0)


def test_normalized_shape_takes_integers_only():
    x, w = randn(3, 16), randn(16)
    assert torch.equal(rmsnorm.rms_norm(x, np.int64(16), w), rmsnorm.rms_norm(x, 16, w))
    assert torch.equal(rmsnorm.rms_norm(x, [np.int32(16)], w), rmsnorm.rms_norm(x, 16, w))
    for bad in [(16.0,), 16.0, "16", True, (True,)]:
        with pytest.raises(TypeError, match="normalized_shape"):
            rmsnorm.rms_norm(x, bad, w)
        with pytest.raises(TypeError):
            F.rms_norm(x, bad, w)  # torch refuses them too


def test_eps_beyond_float32_is_named():
    """The kernels take eps as a float32: 1e39 is inf there, and the message says so in the caller's terms."""
    x, w = randn(3, 16), randn(16)
    for call in [lambda: rmsnorm.rms_norm(x, 16, w, 1e39), lambda: rmsnorm.rms_norm(x, [16], w, 1e39),
                 lambda: rmsnorm.add_rms_norm(x, x, 16, w, 1e39)]:
        with pytest.raises(RuntimeError, match=r"eps .*float32.*1e\+39"):
            call()


def test_eps_rules_hold_without_rows_and_for_every_function():
    """An eps the kernels refuse is refused with no rows too (where no kernel runs), by every function, and the
    message names float32's limit; a string eps is a TypeError, as F.rms_norm has it."""
    x, w = randn(3, 16), randn(16)
    empty = randn(0, 16)
    calls = [
        lambda a, e: rmsnorm.rms_norm(a, 16, w, e),
        lambda a, e: rmsnorm.add_rms_norm(a, a, 16, w, e),
        lambda a, e: rmsnorm.rms_norm_quant(a, 16, w, e),
        lambda a, e: rmsnorm.add_rms_norm_quant(a, a, 16, w, e),
        lambda a, e: torch.ops.rmsnorm.forward(a, w, e, 0),
        lambda a, e: torch.ops.rmsnorm.forward_inference(a, w, e, 0),
        lambda a, e: torch.ops.rmsnorm.add_forward(a, a, w, e, 0),
    ]
    for i, call in enumerate(calls):
        for a in (x, empty):
            for eps in (-1.0, float("nan"), float("inf"), 1e39):
                with pytest.raises(RuntimeError, match="eps"):
                    call(a, eps)
                    pytest.fail(f"call {i} took eps={eps} with {a.shape[0]} rows")
        if i < 4:
            with pytest.raises(TypeError, match="eps must be a float"):
                call(x, "1e-5")
    for call in calls[:4]:
        with pytest.raises(RuntimeError, match=r"float32.*1e\+39"):
            call(x, 1e39)
    with pytest.raises(TypeError):
        F.rms_norm(x, (16,), w, "1e-5")  # torch refuses it too


def test_weight_argument_errors_name_the_rule_of_the_function():
    """A weight that is not a tensor is a TypeError (as in F.rms_norm); a bf16 weight with fp32 input names the
    rule of the function called (out_dtype only where the function has it); an unsupported quantized dtype is
    named."""
    x = randn(3, 16)
    for call in [lambda w: rmsnorm.rms_norm(x, 16, w), lambda w: rmsnorm.rms_norm(x, (16,), w),
                 lambda w: rmsnorm.add_rms_norm(x, x, 16, w), lambda w: rmsnorm.rms_norm_quant(x, 16, w)]:
        with pytest.raises(TypeError, match="weight must be a tensor"):
            call([1.0] * 16)
    w16 = randn(16).bfloat16()
    with pytest.raises(TypeError, match="out_dtype's float16 or bfloat16"):
        rmsnorm.rms_norm(x, (16,), w16)
    for call in [lambda: rmsnorm.add_rms_norm(x, x, 16, w16), lambda: rmsnorm.rms_norm_quant(x, 16, w16),
                 lambda: rmsnorm.add_rms_norm_quant(x, x, 16, w16)]:
        with pytest.raises(TypeError, match="weight has dtype torch.bfloat16") as info:
            call()
        assert "out_dtype" not in str(info.value)
    for dtype, name in [(torch.float8_e5m2, "float8_e5m2"), (torch.uint8, "uint8"), (torch.float16, "float16")]:
        with pytest.raises(RuntimeError, match=f"out_dtype must be float8_e4m3fn or int8, got {name}"):
            rmsnorm.rms_norm_quant(x, 16, dtype=dtype)


def test_quant_weight_must_have_the_normalized_shape():
    x = randn(3, 4, 16)
    for w in [randn(16, 4), randn(64)]:
        with pytest.raises(RuntimeError, match=r"weight has shape .*expected normalized_shape=\[4, 16\]"):
            rmsnorm.rms_norm_quant(x, (4, 16), w)
        with pytest.raises(RuntimeError, match=r"weight has shape"):
            rmsnorm.add_rms_norm_quant(x, x, (4, 16), w)
    q, s = rmsnorm.rms_norm_quant(x, (4, 16), randn(4, 16))
    assert q.shape == x.shape and s.shape == (3,)


def test_residual_dtype_errors_are_type_errors():
    x = randn(3, 16)
    with pytest.raises(TypeError, match="residual has dtype"):
        rmsnorm.add_rms_norm(x, x.double(), 16)
    with pytest.raises(TypeError, match="the quantized forms do not"):
        rmsnorm.add_rms_norm_quant(x.bfloat16(), x, 16)
    with pytest.raises(RuntimeError, match="residual has shape"):
        rmsnorm.add_rms_norm(x, x[:2], 16)


def test_fx_symbolic_trace():
    """torch.fx traces RMSNorm (and swap_rmsnorm's modules) as it traces nn.RMSNorm: rms_norm is one call."""
    x = randn(5, 16)
    for m in [rmsnorm.RMSNorm(16), rmsnorm.RMSNorm((2, 8), weight_offset=True)]:
        gm = torch.fx.symbolic_trace(m)
        xi = x.view(5, 2, 8) if m.normalized_shape == (2, 8) else x
        assert torch.equal(gm(xi), m(xi))
        assert any(n.op == "call_function" and n.target is rmsnorm.rms_norm for n in gm.graph.nodes)
    # swap_rmsnorm's modules inside a model, with the weight in x's dtype and in fp32 (the Llama style's y is then
    # in the promoted dtype: a branch on dtypes that symbolic tracing cannot follow unless the call is one node).
    for norm, x_dtype, w_dtype in [(LlamaRMSNorm(16), torch.float32, torch.float32),
                                   (LlamaRMSNorm(16), torch.bfloat16, torch.bfloat16),
                                   (LlamaRMSNorm(16), torch.bfloat16, torch.float32),
                                   (torch.nn.RMSNorm(16), torch.float32, torch.float32)]:
        model = torch.nn.Sequential(torch.nn.Linear(16, 16, dtype=x_dtype), norm)
        norm.weight = torch.nn.Parameter(randn(16, dtype=w_dtype))
        assert rmsnorm.swap_rmsnorm(model) == ["1"]
        gm = torch.fx.symbolic_trace(model)
        xi = randn(5, 16, dtype=x_dtype)
        assert torch.equal(gm(xi), model(xi))


class _AddNorm(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(d))

    def forward(self, x, residual):
        return rmsnorm.add_rms_norm(x, residual, x.shape[-1], self.weight)


@pytest.mark.parametrize("device", DEVICES)
def test_dispatch_modes_fake_tensors_make_fx_and_export_see_the_op(device):
    """The eager paths call the ops' C++ entries, not their OpOverloads (rms_norm's host cost): torch's dispatch
    modes, fake tensors, make_fx and torch.export must still see one rmsnorm op, and a mode must not change y."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    d = 64
    x = randn(3, d, device=device)
    w = randn(d, device=device)
    with torch.no_grad():
        expected = rmsnorm.rms_norm(x, (d,), w)
        with Log() as log:
            y = rmsnorm.rms_norm(x, (d,), w)
    assert log.ops == ["rmsnorm.forward_inference.default"]
    assert torch.equal(y, expected)
    wl = w.clone().requires_grad_()
    with Log() as log:
        y = rmsnorm.rms_norm(x, (d,), wl)
    assert log.ops == ["rmsnorm.forward.default"]
    assert torch.equal(y.detach(), expected)

    with FakeTensorMode() as mode:
        yf = rmsnorm.rms_norm(mode.from_tensor(x), (d,), mode.from_tensor(w))
    assert yf.shape == x.shape and yf.dtype == x.dtype

    g = make_fx(lambda x, w: rmsnorm.rms_norm(x, (d,), w))(x, w)
    targets = [n.target for n in g.graph.nodes if n.op == "call_function"]
    assert targets == [torch.ops.rmsnorm.forward_inference.default]

    norm = rmsnorm.RMSNorm(d, device=device)
    ep = torch.export.export(norm, (x,))
    ops = [n.target for n in ep.graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)]
    assert ops == [torch.ops.rmsnorm.forward.default]
    assert torch.equal(ep.module()(x), norm(x))


@pytest.mark.parametrize("device", DEVICES)
def test_jit_trace(device):
    """torch.jit.trace records one rmsnorm op whatever the grad mode (its check reruns the function under no_grad),
    and the traced module computes eager's values and gradients bit for bit, on a batch other than the traced one."""
    d = 64
    norm = rmsnorm.RMSNorm(d, device=device)
    with torch.no_grad():
        norm.weight.copy_(randn(d, device=device))
    add = _AddNorm(d).to(device)
    traced_norm = torch.jit.trace(norm, (randn(3, d, device=device),))
    traced_add = torch.jit.trace(add, (randn(3, d, device=device), randn(3, d, device=device)))
    for traced in (traced_norm, traced_add):
        kinds = [n.kind() for n in traced.graph.nodes() if n.kind().startswith("rmsnorm::")]
        assert len(kinds) == 1, kinds
    x = randn(7, d, device=device).requires_grad_()
    r = randn(7, d, device=device).requires_grad_()
    gy = randn(7, d, device=device)
    for module, traced, args in ((norm, traced_norm, (x,)), (add, traced_add, (x, r))):
        grads = []
        for m in (module, traced):
            out = m(*args)
            y = out[0] if isinstance(out, tuple) else out
            torch.autograd.backward(y, gy)
            grads.append([y.detach().clone()] + [t.grad.clone() for t in (*args, module.weight)])
            for t in (*args, module.weight):
                t.grad = None
        for want, got in zip(*grads):
            assert torch.equal(got, want)
        with torch.no_grad():
            a, b = module(*args), traced(*args)
            assert torch.equal(a[0] if isinstance(a, tuple) else a, b[0] if isinstance(b, tuple) else b)


@pytest.mark.parametrize("device", DEVICES)
def test_jit_script(device):
    """torch.jit.script compiles RMSNorm, alone and inside a model (nn.RMSNorm scripts, so a swapped-in one must):
    the scripted module runs the eager module's operator, so its y and gradients are eager's bit for bit, for every
    constructor option, several normalized dims, no weight, eps None, and 16-bit input; it survives torch.jit.save
    and load; an input whose last dims are not normalized_shape raises (torch.jit.Error, as scripted code reports a
    raise); an empty last dim gives eager's (F.rms_norm's) empty result."""
    gen = torch.Generator().manual_seed(7)  # randn draws on the CPU, then moves
    cases = [
        dict(shape=64),
        dict(shape=64, eps=1e-5, weight_offset=True),
        dict(shape=96, round_xhat=True, dtype=torch.bfloat16),
        dict(shape=32, elementwise_affine=False, dtype=torch.float16),
        dict(shape=(4, 16), eps=1e-6),
    ]
    for case in cases:
        case = dict(case)
        shape, dtype = case.pop("shape"), case.pop("dtype", torch.float32)
        norm = rmsnorm.RMSNorm(shape, device=device, dtype=dtype, **case)
        if norm.weight is not None:
            with torch.no_grad():
                norm.weight.copy_(randn(*norm.weight.shape, dtype=dtype, device=device, gen=gen))
        scripted = torch.jit.script(norm)
        # The library's operator, not a formula in torch ops (the empty-row formula is the graph's other branch).
        graph = str(scripted.inlined_graph)
        assert ("rmsnorm::forward_autograd" if rmsnorm.cpp_autograd else "rmsnorm::forward(") in graph, case
        buf = io.BytesIO()
        torch.jit.save(scripted, buf)
        buf.seek(0)
        loaded = torch.jit.load(buf, map_location=device)
        lead = (5, 3)
        x = randn(*lead, *((shape,) if isinstance(shape, int) else shape), dtype=dtype, device=device,
                  gen=gen).requires_grad_()
        gy = randn(*x.shape, dtype=dtype, device=device, gen=gen)
        results = []
        for m in (norm, scripted, loaded):
            y = m(x)
            params = [p for p in m.parameters()]
            grads = torch.autograd.grad(y, [x] + params, gy)
            results.append([y.detach()] + [g for g in grads])
        for got in results[1:]:
            assert len(got) == len(results[0]), case
            for a, b in zip(results[0], got):
                assert a.dtype == b.dtype and torch.equal(a, b), case
        with torch.no_grad():
            assert torch.equal(scripted(x), norm(x)), case
        with pytest.raises(torch.jit.Error, match="normalized_shape"):  # how TorchScript reports a raise
            scripted(randn(5, 7, device=device, dtype=dtype))
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), rmsnorm.RMSNorm(64, eps=1e-6)).to(device)
    xm = randn(6, 64, device=device, gen=gen)
    with torch.no_grad():
        assert torch.equal(torch.jit.script(model)(xm), model(xm))
    empty = rmsnorm.RMSNorm(0, device=device)
    x0 = randn(4, 0, device=device)
    y0 = torch.jit.script(empty)(x0)
    assert y0.shape == (4, 0) and torch.equal(y0, empty(x0))
    # No rows: eager's empty y and gradients (zeros for the weight), as the scripted module's.
    norows = rmsnorm.RMSNorm(8, device=device, weight_offset=True)
    xr = randn(0, 8, device=device).requires_grad_()
    got = [(lambda y: (y, *torch.autograd.grad(y, [xr, norows.weight], torch.ones_like(y))))(m(xr))
           for m in (norows, torch.jit.script(norows))]
    for a, b in zip(*got):
        assert a.shape == b.shape and torch.equal(a, b)
    # What eager refuses, the scripted module refuses: no normalized dims, and (on the empty-input path, which
    # does not reach the operator) a negative eps or an integer input.
    for bad, arg in ((rmsnorm.RMSNorm(()), randn(3, 4, device=device)),
                     (rmsnorm.RMSNorm(0, eps=-1.0, device=device), x0),
                     (rmsnorm.RMSNorm(0, elementwise_affine=False), torch.zeros(4, 0, dtype=torch.int64, device=device))):
        with pytest.raises((RuntimeError, TypeError)):  # eager names a wrong dtype with TypeError
            bad(arg)
        with pytest.raises(torch.jit.Error):
            torch.jit.script(bad)(arg)


class LlamaRMSNorm(torch.nn.Module):
    """transformers' LlamaRMSNorm forward (the class name is what swap_rmsnorm matches)."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class Gemma3RMSNorm(torch.nn.Module):
    """transformers' Gemma3RMSNorm forward (the class name is what swap_rmsnorm matches)."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        output = x.float()
        output = output * torch.rsqrt(output.pow(2).mean(-1, keepdim=True) + self.eps)
        output = output * (1.0 + self.weight.float())
        return output.type_as(x)


_MIXES = [(torch.bfloat16, torch.float32), (torch.float16, torch.float32), (torch.bfloat16, torch.bfloat16),
          (torch.float32, torch.float32), (torch.float32, torch.bfloat16), (torch.float32, torch.float16),
          (torch.bfloat16, torch.float16), (torch.float16, torch.bfloat16)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("style", [LlamaRMSNorm, Gemma3RMSNorm, torch.nn.RMSNorm], ids=["llama", "gemma", "torch"])
@pytest.mark.parametrize("x_dtype, w_dtype", _MIXES)
def test_swapped_norm_keeps_the_models_dtypes(device, style, x_dtype, w_dtype):
    """Every mix of the weight's and the activations' dtypes, as the model computes it: Llama's weight *
    x_hat.to(input_dtype) has the promoted dtype (float32 for any mix), Gemma's x_hat * (1.0 + weight.float()) and
    torch.nn.RMSNorm's x_hat * weight (in fp32) the activations' dtype. The swapped module gives the same dtype and,
    x_hat rounded to the input dtype first in the Llama style, the same values; the weight's gradient has the
    weight's dtype and the model's values."""
    gen = torch.Generator().manual_seed(11)
    model = torch.nn.Sequential(style(64)).to(device=device, dtype=w_dtype)
    with torch.no_grad():
        model[0].weight.copy_(randn(64, gen=gen))
    x = randn(7, 64, gen=gen, dtype=x_dtype, device=device)
    gy = randn(7, 64, gen=gen, device=device)
    want = model(x)
    (want_gw,) = torch.autograd.grad(want, model[0].weight, gy.to(want.dtype))
    assert rmsnorm.swap_rmsnorm(model) == ["0"]
    got = model(x)
    (got_gw,) = torch.autograd.grad(got, model[0].weight, gy.to(got.dtype))
    assert got.dtype == want.dtype and got_gw.dtype == w_dtype
    # The one rsqrt may differ by an ulp between torch's op and the library's (a correctly rounded divide and
    # square root): at most one unit of the rounding of x_hat (Llama) or y (Gemma).
    tol = 2e-6 if got.dtype == torch.float32 and (style is not LlamaRMSNorm or x_dtype == torch.float32) else 2.0**-7
    torch.testing.assert_close(got, want, rtol=tol, atol=1e-6)
    # gw: the model's graph multiplies gy by its rounded x_hat (Llama style with 16-bit x), the library's backward
    # by the exact one (README: round_xhat changes the forward only), so each term may differ by x_hat's rounding
    # and the weight's own: a bound per column of 2^-7 of the sum of |gy x_hat|.
    xd = x.double()
    xh = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6)
    bound = 2.0**-7 * (gy.double() * xh).abs().sum(0) + 1e-6
    err = (got_gw.double() - want_gw.double()).abs()
    assert (err <= bound).all(), f"gw: worst {(err / bound).max().item():.3g} of the bound"


@pytest.mark.parametrize("style", [LlamaRMSNorm, Gemma3RMSNorm, torch.nn.RMSNorm], ids=["llama", "gemma", "torch"])
def test_swapped_norm_computes_what_the_kernels_do_not_take_as_the_model(style):
    """Inputs outside the kernels' dtypes and layouts (a float64 model, as for gradcheck; a float64 weight with
    float32 activations; jagged activations) give the replaced module's own result, bit for bit, and its gradients;
    rms_norm itself refuses a nested input with a TypeError that says so."""
    gen = torch.Generator().manual_seed(12)
    for x_dtype, w_dtype in [(torch.float64, torch.float64), (torch.float32, torch.float64),
                             (torch.float64, torch.bfloat16)]:
        model = torch.nn.Sequential(style(16)).to(dtype=w_dtype)
        with torch.no_grad():
            model[0].weight.copy_(randn(16, gen=gen))
        x = randn(5, 16, gen=gen, dtype=x_dtype).requires_grad_()
        want = model(x)
        want_gx, want_gw = torch.autograd.grad(want.sum(), (x, model[0].weight))
        assert rmsnorm.swap_rmsnorm(model) == ["0"]
        got = model(x)
        got_gx, got_gw = torch.autograd.grad(got.sum(), (x, model[0].weight))
        assert got.dtype == want.dtype and torch.equal(got, want), (x_dtype, w_dtype)
        assert torch.equal(got_gx, want_gx) and torch.equal(got_gw, want_gw), (x_dtype, w_dtype)
    model = torch.nn.Sequential(style(16))
    nt = torch.nested.nested_tensor([randn(2, 16, gen=gen), randn(3, 16, gen=gen)], layout=torch.jagged)
    want = model(nt)
    assert rmsnorm.swap_rmsnorm(model) == ["0"]
    got = model(nt)
    assert got.is_nested and all(torch.equal(a, b) for a, b in zip(got.unbind(), want.unbind()))
    with pytest.raises(TypeError, match="nested"):
        rmsnorm.rms_norm(nt, 16)
    with pytest.raises(TypeError, match="nested"):
        rmsnorm.RMSNorm(16)(nt)


def test_package_marks_itself_typed():
    """The installed package carries PEP 561's py.typed, so type checkers read its annotations."""
    import pathlib

    assert (pathlib.Path(rmsnorm.__file__).parent / "py.typed").is_file()
