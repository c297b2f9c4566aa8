"""RMSNorm for PyTorch on the rmsnorm library: ``rms_norm`` (as ``torch.nn.functional.rms_norm``), ``RMSNorm`` (a
drop-in ``torch.nn.RMSNorm``) and ``swap_rmsnorm`` (for Hugging Face transformers models).

The operators ``torch.ops.rmsnorm.forward`` and ``torch.ops.rmsnorm.backward`` are registered in C++ (the compiled
``_ops.so``, on PyTorch's stable ABI) with functional schemas; this module adds their fake (meta) kernels and the
autograd formula, so they trace under ``torch.compile(fullgraph=True)`` and capture in CUDA graphs.

Tensors may have any leading dims. When they form rows of one stride (a contiguous tensor, or a column slice such as
the q part of a packed qkv projection) the kernels read them in place; any other layout (a transposed view, a last
dim that is not contiguous) is copied once into a contiguous tensor first. Outputs are contiguous.
"""

from __future__ import annotations

import contextlib
import operator
import os
import warnings
from collections.abc import Sequence
from typing import Optional  # TorchScript reads annotations; it takes no "X | None"

import torch
import torch.autograd.forward_ad as _fwad

__all__ = ["rms_norm", "add_rms_norm", "rms_norm_quant", "add_rms_norm_quant", "RMSNorm", "swap_rmsnorm", "FLAG_WEIGHT_OFFSET", "FLAG_ROUND_XHAT", "cuda_built", "cpp_autograd"]
__version__ = "0.1.0"

# The library's RMSNORM_FLAG_* bits (include/rmsnorm/rmsnorm.h).
FLAG_WEIGHT_OFFSET = 1
FLAG_ROUND_XHAT = 2

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# RMSNORM_FLAG_Y_DTYPE(dt) (rmsnorm.h): bits 8-9 hold the library's dtype code + 1.
_Y_DTYPE_FLAG = {torch.float32: 1 << 8, torch.float16: 2 << 8, torch.bfloat16: 3 << 8}
_Y_DTYPE_MASK = 3 << 8


def _y_dtype(x, flags):
    """y's (and gy's) dtype under the op's flags: x's, or the one RMSNORM_FLAG_Y_DTYPE names."""
    bits = flags & _Y_DTYPE_MASK
    return x.dtype if bits == 0 else _DTYPES[(bits >> 8) - 1]
_HALF_DTYPES = (torch.float16, torch.bfloat16)


def _load_extension() -> None:
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ops.so")
    if not os.path.exists(path):
        raise ImportError(
            f"rmsnorm: the compiled extension {path} is missing; install the package with `pip install .` from the "
            "repository root rather than importing python/rmsnorm from the source tree"
        )
    torch.ops.load_library(path)


_load_extension()


def _load_cpp_autograd() -> bool:
    """Loads _autograd.so (the eager autograd node in C++, python/csrc/autograd.cpp) when it was built against this
    very torch version; RMSNORM_PY_AUTOGRAD=1 keeps the Python Function instead. Either path gives the same bits."""
    if os.environ.get("RMSNORM_PY_AUTOGRAD") == "1":
        return False
    try:
        from . import _build_info
    except ImportError:
        return False
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_autograd.so")
    if not _build_info.CPP_AUTOGRAD or _build_info.TORCH_VERSION != torch.__version__ or not os.path.exists(path):
        return False
    try:
        torch.ops.load_library(path)
    except (OSError, RuntimeError) as e:
        warnings.warn(f"rmsnorm: {path} did not load ({e}); eager autograd goes through the Python Function")
        return False
    return True


cpp_autograd = _load_cpp_autograd()
"""Whether eager rms_norm's autograd is the C++ node (True) or the Python Function (False)."""


def cuda_built() -> bool:
    """Whether this build has the CUDA backend (the extension's CUDA kernel raises an error otherwise)."""
    if not torch.cuda.is_available():
        return False
    try:
        torch.ops.rmsnorm.forward(torch.ones(1, 1, device="cuda"), None, 1e-6, 0)
    except RuntimeError as e:
        if "no CUDA backend" in str(e):
            return False
        raise
    return True


def _check_devices(op, x, **tensors):
    """For the fake kernels: every tensor argument on x's device, as the real kernels require. A meta tensor among
    real ones sends the call to the fake kernel, which would otherwise return real tensors never written."""
    for name, t in tensors.items():
        if t is not None and t.device != x.device:
            raise RuntimeError(f"{op}: {name} is on {t.device}, the other operands on {x.device}")


def _weight_dtype_ok(weight_dtype, x_dtype, y_dtype):
    """The weight's dtype rule of the kernels: x's, float32 with a 16-bit x, or y's 16-bit dtype with a float32 x."""
    return (weight_dtype == x_dtype or (weight_dtype == torch.float32 and x_dtype in _HALF_DTYPES)
            or (x_dtype == torch.float32 and weight_dtype == y_dtype and y_dtype in _HALF_DTYPES))


def _check_fake_args(op, x, weight, y_dtype=None):
    # The real kernels' argument rules (python/csrc/ops.cpp), for meta and fake tensors: rms_norm relies on the
    # operator to refuse bad arguments, and a meta tensor (or one among real ones) reaches these kernels.
    if x.dtype not in _DTYPES:
        raise RuntimeError(f"{op}: x has dtype {x.dtype}; supported: float32, float16, bfloat16")
    if x.dim() < 1 or x.shape[-1] < 1:
        raise RuntimeError(f"{op}: x must have at least one dimension, and its last dim a size of at least 1")
    if weight is not None:
        if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
            raise RuntimeError(f"{op}: weight has shape {list(weight.shape)}, expected [{x.shape[-1]}]")
        if not _weight_dtype_ok(weight.dtype, x.dtype, y_dtype):
            raise RuntimeError(f"{op}: weight has dtype {weight.dtype} but x has {x.dtype}")
        if weight.device != x.device:
            raise RuntimeError(f"{op}: weight is on another device than x")


@torch.library.register_fake("rmsnorm::forward")
def _forward_fake(x, weight, eps, flags):
    _check_fake_args("rmsnorm.forward", x, weight, _y_dtype(x, flags))
    return x.new_empty(x.shape, dtype=_y_dtype(x, flags)), x.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.register_fake("rmsnorm::forward_inference")
def _forward_inference_fake(x, weight, eps, flags):
    _check_fake_args("rmsnorm.forward_inference", x, weight, _y_dtype(x, flags))
    return x.new_empty(x.shape, dtype=_y_dtype(x, flags))


@torch.library.register_fake("rmsnorm::backward")
def _backward_fake(gy, x, weight, rstd, flags, gw_dtype):
    _check_devices("rmsnorm.backward", x, gy=gy, weight=weight, rstd=rstd)
    if gy.dtype != _y_dtype(x, flags):
        raise RuntimeError(f"rmsnorm.backward: gy has dtype {gy.dtype} but y has {_y_dtype(x, flags)}")
    gw = None if gw_dtype is None else x.new_empty(x.shape[-1:], dtype=gw_dtype)
    return x.new_empty(x.shape), gw


_backward_op = torch.ops.rmsnorm.backward.default


def _formula_rstd(xf, eps):
    """r = 1 / sqrt(mean(x^2) + eps) of float32 x in torch ops (the formula paths below), over the whole fp32 range
    where the kernels rescale (src/common/scaled_rms.hpp): each row is scaled by s, the power of two that brings its
    largest |x| into [0.5, 1) (detached: s is piecewise constant in x), so that neither its squares nor r's
    derivatives (r^3, ...) overflow or underflow in fp32, and r = s / sqrt(mean((x s)^2) + eps s^2) is evaluated
    per row in float64 (eps s^2 reaches 2^252 eps there)."""
    if xf.shape[-1] == 0:  # F.rms_norm's empty result: nothing to scale (amax needs an element)
        return torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    m = xf.detach().abs().amax(-1, keepdim=True)
    s = torch.ldexp(torch.ones_like(m), -torch.frexp(m).exponent.clamp(-126, 126))
    ms = (xf * s).pow(2).mean(-1, keepdim=True).double()
    sd = s.double()
    return (sd * torch.rsqrt(ms + eps * sd * sd)).float()


def _formula_w_prime(weight, flags):
    """w' in float32: w, or 1 + w with RMSNORM_FLAG_WEIGHT_OFFSET."""
    wf = weight.float()
    return wf + 1.0 if flags & FLAG_WEIGHT_OFFSET else wf


def _backward_formula(gy, x, weight, eps, flags, need_gw):
    """gx and gw of y = x r w' (r = 1 / sqrt(mean(x^2) + eps), w' = w or 1 + w) in float32 torch ops, for a
    backward that records a graph (create_graph=True: double backward, gradient penalties, Hessian-vector
    products). The kernels' backward is not differentiable; this is, in x, w and gy, at the cost of torch's
    separate passes. Its values match the kernels' to float32 rounding, not bit for bit. gw (the leading dims of
    x summed over) is None unless need_gw, which needs a weight."""
    xf = x.float()
    r = _formula_rstd(xf, eps)
    xh = xf * r
    g = gy.float()
    gw = None
    if need_gw:
        gw = (g * xh).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
    if weight is not None:
        g = g * _formula_w_prime(weight, flags)
    gx = r * (g - xh * (g * xh).mean(-1, keepdim=True))
    return gx.to(x.dtype), gw


def _setup_context(ctx, inputs, output):
    x, weight, eps, flags = inputs
    _y, rstd = output
    ctx.mark_non_differentiable(rstd)
    ctx.save_for_backward(x, weight, rstd)
    ctx.flags = flags
    ctx.eps = eps


def _backward(ctx, gy, _grstd):
    x, weight, rstd = ctx.saved_tensors
    needs = ctx.needs_input_grad
    need_gw = weight is not None and needs[1]
    if _grad_enabled():  # create_graph=True: the backward itself is differentiated
        gx, gw = _backward_formula(gy, x, weight, ctx.eps, ctx.flags, need_gw)
        return (gx if needs[0] else None), gw, None, None
    # round_xhat only changes the forward's rounding; the gradient is that of the exact formula, as the HF Llama
    # norm's autograd gives in fp32.
    gx, gw = _backward_op(gy, x, weight, rstd, ctx.flags, weight.dtype if need_gw else None)
    return (gx if needs[0] else None), gw, None, None


torch.library.register_autograd("rmsnorm::forward", _backward, setup_context=_setup_context)

_forward_op = torch.ops.rmsnorm.forward.default


def _eager_call(op):
    """op's C++ entry, for the eager paths only: an OpOverload's __call__ is one Python frame around it (0.5 us of
    the 3 us an op call costs on the CPU machine). torch.compile traces the OpOverloads, which the paths it reaches
    keep; the tracer and torch's dispatch modes act inside the C++ call, so they see these calls alike."""
    return getattr(op, "_op", op)


# y without rstd (no rstd allocated or written): the eager path when nothing needs a gradient.
_forward_inference_op = _eager_call(torch.ops.rmsnorm.forward_inference.default)
_below_autograd = torch._C._AutoDispatchBelowAutograd


class _EagerRMSNorm(torch.autograd.Function):
    """The same formula as the registration above, for eager calls. An op's registered autograd runs as a Python
    kernel behind the dispatcher (the dispatcher calls into Python, which builds an autograd.Function, which
    redispatches below autograd), at tens of microseconds per call on the host; this Function calls the C++ kernels
    below autograd directly. torch.compile and direct op calls keep the registered path. Where _autograd.so is
    loaded (cpp_autograd), rmsnorm::forward_autograd, the same formula as a C++ node, takes this one's place."""

    @staticmethod
    def forward(ctx, x, weight, eps, flags):
        with _below_autograd():
            y, rstd = _forward_op(x, weight, eps, flags)
        ctx.save_for_backward(x, weight, rstd)
        ctx.flags = flags
        ctx.eps = eps
        return y

    @staticmethod
    def backward(ctx, gy):
        # _backward inlined: this runs once per training step and layer, and every Python call counts here.
        x, weight, rstd = ctx.saved_tensors
        needs = ctx.needs_input_grad
        if _grad_enabled():  # create_graph=True, as in _backward
            gx, gw = _backward_formula(gy, x, weight, ctx.eps, ctx.flags, weight is not None and needs[1])
            return (gx if needs[0] else None), gw, None, None
        gx, gw = _backward_op(gy, x, weight, rstd, ctx.flags, weight.dtype if weight is not None and needs[1] else None)
        return (gx if needs[0] else None), gw, None, None


_forward_autograd_op = _eager_call(torch.ops.rmsnorm.forward_autograd.default) if cpp_autograd else None
_is_compiling = torch.compiler.is_compiling
_tracing = torch._C._get_tracing_state  # torch.jit.trace is recording (None when not)
_functorch_active = torch._C._are_functorch_transforms_active
_grad_enabled = torch.is_grad_enabled


def _forward(x, weight, eps, flags):
    if x.shape[-1] == 0:  # F.rms_norm's empty result (the library takes D >= 1)
        return _forward_formula(x, weight, eps, flags, _y_dtype(x, flags), check=False)
    if _is_compiling():
        return _forward_op(x, weight, eps, flags)[0]
    return _forward_eager(x, weight, eps, flags)


def _forward_formula(x, weight, eps, flags, y_dtype, check=True):
    """y = T(x r w') (or T(T(x r) w') with round_xhat) in float32 torch ops, under torch.func transforms (grad,
    vmap, jacrev, hessian, ...): the kernels' operators cannot run there (torch's registered autograd is not a
    functorch autograd.Function). The same arithmetic in the same order as the kernels; r comes from torch's sum
    (_formula_rstd: rescaled per row), so y matches the kernels' to the last bit or so, not bit for bit. check: the
    operator's argument rules (the add form has checked its own, which differ for an fp32 h)."""
    if check:
        _check_fake_args("rmsnorm.rms_norm", x, weight, y_dtype)
    _check_eps("rmsnorm.rms_norm", eps, RuntimeError)
    xf = x.float()
    xh = xf * _formula_rstd(xf, eps)
    if flags & FLAG_ROUND_XHAT:
        xh = xh.to(x.dtype).float()
    if weight is not None:
        xh = xh * _formula_w_prime(weight, flags)
    return xh.to(y_dtype)


def _forward_eager(x, weight, eps, flags):
    """_forward outside torch.compile (rms_norm's fast path has checked that already)."""
    # Inside forward_ad.dual_level() (_current_level >= 0) the torch-ops formula runs too: the kernels' autograd
    # (the C++ node or the Function) has no forward-mode formula, and would drop the tangent.
    if _functorch_active() or _fwad._current_level >= 0:
        return _forward_formula(x, weight, eps, flags, _y_dtype(x, flags))
    # Under torch.jit.trace every call goes through _traced_forward's one line: the trace records the caller's
    # source line (_eager_call), and its check reruns the function under no_grad.
    if _tracing():
        return _traced_forward(x, weight, eps, flags)
    if _grad_enabled() and (x.requires_grad or (weight is not None and weight.requires_grad)):
        if cpp_autograd:
            return _forward_autograd_op(x, weight, eps, flags)
        return _EagerRMSNorm.apply(x, weight, eps, flags)
    # Nothing records a graph here (grad mode is off, or no input requires grad), so the op is called without
    # _below_autograd (0.9 us of Python on the CPU machine): autograd's fallback for an op with no autograd kernel
    # passes it through.
    return _forward_inference_op(x, weight, eps, flags)


def _traced_forward(x, weight, eps, flags):
    """The one op that torch.jit.trace records whatever the grad mode (its check reruns the function under
    no_grad, and a trace must not depend on it): a differentiable one, so the traced module trains too."""
    if cpp_autograd:
        return _forward_autograd_op(x, weight, eps, flags)
    return _forward_op(x, weight, eps, flags)[0]


_FLOAT32_MAX = torch.finfo(torch.float32).max


def _check_eps(op, eps, error):
    """The kernels' eps rule (a float32 in the library), for the paths that do not reach them or to name the cause."""
    if not 0.0 <= eps <= _FLOAT32_MAX:
        raise error(f"{op}: eps must be >= 0 and finite as a float32, i.e. at most {_FLOAT32_MAX:.7g} (got {eps!r})")


# F.rms_norm's eps=None for every dtype (numeric_limits<opmath_t>::epsilon, opmath_t = float for 16-bit).
_DEFAULT_EPS = torch.finfo(torch.float32).eps


def _eps_value(op, eps):
    """eps as a Python float: None is _DEFAULT_EPS; a string is refused as F.rms_norm refuses it (float() would
    parse it)."""
    if eps is None:
        return _DEFAULT_EPS
    if isinstance(eps, (str, bytes)):
        raise TypeError(f"{op}: eps must be a float, not {type(eps).__name__}")
    return float(eps)


def rms_norm(
    input: torch.Tensor,
    normalized_shape: int | Sequence[int] | torch.Size,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    *,
    weight_offset: bool = False,
    round_xhat: bool = False,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``torch.nn.functional.rms_norm`` on the rmsnorm library.

    ``y = x * rsqrt(mean(x^2) + eps) * w'`` over the last ``len(normalized_shape)`` dims, in fp32, rounded once to
    ``input.dtype``. ``w' = weight``, or ``1 + weight`` (the 1 added in fp32) with ``weight_offset`` (Gemma), or 1
    without a weight. ``round_xhat`` rounds ``x * rsqrt(...)`` to the input dtype before the weight, as Hugging Face's
    Llama norm does. ``eps=None`` is the fp32 machine epsilon (``torch.finfo(torch.float32).eps``) for every input
    dtype: what ``F.rms_norm`` computes, since it accumulates in fp32 (its documentation says
    ``torch.finfo(input.dtype).eps``, 2^-7 at bf16, which its code does not use).

    ``out_dtype`` (float32, float16 or bfloat16; default ``input.dtype``) is y's dtype: the fp32 result rounded once
    to it (bf16 y from an fp32 residual stream, say); the gradient reaching y then has that dtype, and input's
    gradient has input's. On CUDA another ``out_dtype`` runs the looped kernel at every size (slower than the plain
    forward; its rstd may differ from the plain call's in the last bits: another summation order).

    Supports float32, float16 and bfloat16; the weight must have the input's dtype and device, be float32 with a
    float16 or bfloat16 input, or, with a float32 input and a float16 or bfloat16 ``out_dtype``, have that dtype (an
    fp32 residual stream normalized with the model's 16-bit weight; its gradient then has that dtype too).
    """
    # The common call (normalized_shape an int or a 1-tuple, the last dim's size: the module's) goes to the operator with no Python checks:
    # the operator checks x's dtype, the weight's shape, dtype and device, and eps, and raises before it writes
    # anything; each check here cost 0.1-0.5 us of Python (a tensor's .device builds a Python object), against a
    # host cost per call of about 10 us for F.rms_norm. When the operator raises, _check_rms_norm_args names the
    # argument in rms_norm's terms (or the operator's error stands).
    flags = (FLAG_WEIGHT_OFFSET if weight_offset else 0) | (FLAG_ROUND_XHAT if round_xhat else 0)
    if out_dtype is not None and out_dtype != input.dtype:
        if out_dtype not in _Y_DTYPE_FLAG:
            raise TypeError(f"rmsnorm.rms_norm: out_dtype is {out_dtype}; supported: float32, float16, bfloat16")
        flags |= _Y_DTYPE_FLAG[out_dtype]
    eps = eps if type(eps) is float else _eps_value("rmsnorm.rms_norm", eps)
    n = normalized_shape[0] if type(normalized_shape) is tuple and len(normalized_shape) == 1 else normalized_shape
    # Under torch.compile the checks below run first, so that bad arguments fail at trace time.
    if type(n) is int and not _is_compiling() and input.dim() > 0 and input.shape[-1] == n:
        try:
            return _forward_eager(input, weight, eps, flags)
        except (RuntimeError, TypeError, AttributeError):  # AttributeError: a weight that is not a tensor
            _check_rms_norm_args(input, (n,), weight, out_dtype)
            _check_eps("rmsnorm.rms_norm", eps, RuntimeError)
            if n == 0:
                return _forward(input, weight, eps, flags)
            raise
    normalized_shape = _check_rms_norm_args(input, normalized_shape, weight, out_dtype)
    _check_eps("rmsnorm.rms_norm", eps, RuntimeError)
    k = len(normalized_shape)
    if k > 1:
        x = input.flatten(-k)
        w = weight.flatten() if weight is not None else None
        return _forward(x, w, eps, flags).view(input.shape)
    return _forward(input, weight, eps, flags)


# torch.fx.symbolic_trace records rms_norm as one call (its argument checks branch on tensor properties, which a
# trace cannot follow), as it does F.rms_norm; RMSNorm.forward calls it.
torch.fx.wrap("rms_norm")


def _normalized_dims(op, input, normalized_shape):
    """normalized_shape as a tuple, after checking input's dtype and that those are its last dims; op names the
    function in the errors."""
    # F.rms_norm's rule: an integer (a numpy one too) or a sequence of them; 16.0 is refused. Tuples and lists are
    # taken as sequences before operator.index is tried on the whole: under torch.compile a TypeError raised inside
    # the traced code is not one this function can catch (dynamo reports it as an internal error).
    dims = normalized_shape
    if not isinstance(normalized_shape, (tuple, list)):
        try:
            dims = (operator.index(normalized_shape),)
        except TypeError:
            pass
    try:
        if isinstance(normalized_shape, bool) or any(isinstance(n, bool) for n in dims):  # F.rms_norm refuses True
            raise TypeError
        normalized_shape = tuple(operator.index(n) for n in dims)
    except TypeError:
        raise TypeError(
            f"{op}: normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}") from None
    k = len(normalized_shape)
    if input.is_nested or input.layout != torch.strided:
        raise TypeError(f"{op}: input is a {'nested' if input.is_nested else str(input.layout)} tensor; the kernels "
                        "take strided tensors (torch.nn.functional.rms_norm takes nested ones)")
    if input.dtype not in _DTYPES:
        raise TypeError(f"{op}: input has dtype {input.dtype}; supported: float32, float16, bfloat16")
    shape = input.shape
    if k == 0 or len(shape) < k or shape[-k:] != normalized_shape:
        raise RuntimeError(
            f"{op}: normalized_shape={list(normalized_shape)} must be the last dims of input, whose shape is "
            f"{list(shape)}"
        )
    return normalized_shape


def _check_weight(op, input, normalized_shape, weight, out_dtype=None, takes_out_dtype=False):
    """The weight's rules for every function here: a tensor of normalized_shape's shape, input's dtype (or float32
    with a 16-bit input, or, where the function takes_out_dtype, out_dtype's 16-bit dtype with a float32 input) and
    device."""
    if weight is None:
        return
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"{op}: weight must be a tensor or None, got {type(weight).__name__}")
    dtype = input.dtype
    if weight.shape != normalized_shape:
        raise RuntimeError(
            f"{op}: weight has shape {list(weight.shape)}, expected normalized_shape={list(normalized_shape)}"
        )
    if not _weight_dtype_ok(weight.dtype, dtype, out_dtype):
        rule = ("the weight must have the input's dtype, be float32 with a float16 or bfloat16 input, or have "
                "out_dtype's float16 or bfloat16 dtype with a float32 input" if takes_out_dtype else
                "the weight must have the input's dtype, or be float32 with a float16 or bfloat16 input")
        raise TypeError(f"{op}: weight has dtype {weight.dtype} but input has {dtype}; {rule}")
    if weight.device != input.device:
        raise RuntimeError(f"{op}: weight is on {weight.device} but input is on {input.device}")


def _check_rms_norm_args(input, normalized_shape, weight, out_dtype=None):
    """rms_norm's argument rules, raising with the argument's name in rms_norm's terms; normalized_shape as a
    tuple."""
    normalized_shape = _normalized_dims("rmsnorm.rms_norm", input, normalized_shape)
    _check_weight("rmsnorm.rms_norm", input, normalized_shape, weight, out_dtype, takes_out_dtype=True)
    return normalized_shape


@torch.library.register_fake("rmsnorm::add_forward")
def _add_forward_fake(x, residual, weight, eps, flags):
    _check_devices("rmsnorm.add_forward", x, residual=residual, weight=weight)
    # h has the residual's dtype (float32 with 16-bit x: the fp32 residual stream).
    return (x.new_empty(x.shape), x.new_empty(x.shape, dtype=residual.dtype),
            x.new_empty(x.shape[:-1], dtype=torch.float32))


@torch.library.register_fake("rmsnorm::add_backward")
def _add_backward_fake(gy, g_h, h, weight, rstd, flags, gw_dtype):
    _check_devices("rmsnorm.add_backward", h, gy=gy, g_h=g_h, weight=weight, rstd=rstd)
    gw = None if gw_dtype is None else h.new_empty(h.shape[-1:], dtype=gw_dtype)
    return h.new_empty(h.shape), gw


@torch.library.register_fake("rmsnorm::add_backward_x")
def _add_backward_x_fake(gy, g_h, h, weight, rstd, flags, gw_dtype):
    _check_devices("rmsnorm.add_backward_x", h, gy=gy, g_h=g_h, weight=weight, rstd=rstd)
    gw = None if gw_dtype is None else h.new_empty(h.shape[-1:], dtype=gw_dtype)
    return h.new_empty(h.shape), h.new_empty(h.shape, dtype=gy.dtype), gw


def _add_setup_context(ctx, inputs, output):
    x, _residual, weight, eps, flags = inputs
    _y, h, rstd = output
    ctx.mark_non_differentiable(rstd)
    ctx.save_for_backward(h, weight, rstd)
    ctx.flags = flags
    ctx.eps = eps
    ctx.x_dtype = x.dtype


def _add_backward(ctx, gy, g_h, _grstd):
    h, weight, rstd = ctx.saved_tensors
    need_gw = weight is not None and ctx.needs_input_grad[2]
    gw_dtype = weight.dtype if need_gw else None
    wide = h.dtype != ctx.x_dtype  # the fp32 residual stream: h float32, y and gy in x's dtype
    if gy is None:
        gy = torch.zeros(h.shape, dtype=ctx.x_dtype, device=h.device)
    if _grad_enabled():  # create_graph=True: differentiable, as in _backward (h in the residual's dtype)
        gx, gw = _backward_formula(gy, h, weight, ctx.eps, ctx.flags, need_gw)
        gx = gx if g_h is None else gx + g_h
    elif g_h is None and not wide:  # h has no other consumer: the plain backward
        gx, gw = _backward_op(gy, h, weight, rstd, ctx.flags, gw_dtype)
    else:
        if g_h is None:
            g_h = torch.full_like(h, -0.0)  # the add form carries the mixed dtypes; + (-0.0) changes no bit
        if wide and ctx.needs_input_grad[0]:
            # x's gradient, gx rounded to x's dtype, written by the same pass.
            gx, gx_x, gw = torch.ops.rmsnorm.add_backward_x.default(gy, g_h, h, weight, rstd, ctx.flags, gw_dtype)
            return gx_x, (gx if ctx.needs_input_grad[1] else None), gw, None, None
        gx, gw = torch.ops.rmsnorm.add_backward.default(gy, g_h, h, weight, rstd, ctx.flags, gw_dtype)
    # h = x + residual: both get gx (x's rounded to its dtype, as autograd of x.float() + residual gives).
    gx_x = (gx.to(ctx.x_dtype) if wide else gx) if ctx.needs_input_grad[0] else None
    return gx_x, (gx if ctx.needs_input_grad[1] else None), gw, None, None


torch.library.register_autograd("rmsnorm::add_forward", _add_backward, setup_context=_add_setup_context)

_add_forward_op = torch.ops.rmsnorm.add_forward.default


class _EagerAddRMSNorm(torch.autograd.Function):
    """add_forward's registered formula for eager calls, for the reason _EagerRMSNorm gives. Gradients are not
    materialized: a None g_h (h has no other consumer) takes the plain backward, as in the registered path."""

    @staticmethod
    def forward(ctx, x, residual, weight, eps, flags):
        with _below_autograd():
            y, h, rstd = _add_forward_op(x, residual, weight, eps, flags)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(h, weight, rstd)
        ctx.flags = flags
        ctx.eps = eps
        ctx.x_dtype = x.dtype
        return y, h

    @staticmethod
    def backward(ctx, gy, g_h):
        return _add_backward(ctx, gy, g_h, None)


def _check_residual(op, input, residual, wide_allowed):
    """residual: input's shape and device, and input's dtype (or float32 where wide_allowed: the fp32 residual
    stream)."""
    if residual.shape != input.shape:
        raise RuntimeError(f"{op}: residual has shape {list(residual.shape)} but input has {list(input.shape)}")
    if residual.device != input.device:
        raise RuntimeError(f"{op}: residual is on {residual.device} but input is on {input.device}")
    if residual.dtype != input.dtype and not wide_allowed:
        raise TypeError(
            f"{op}: residual has dtype {residual.dtype} but input has {input.dtype}"
            + ("; add_rms_norm takes a float32 residual with a 16-bit input, the quantized forms do not"
               if residual.dtype == torch.float32 and input.dtype in _HALF_DTYPES
               else "; it must have the input's dtype, or be float32 with a float16 or bfloat16 input")
        )


def add_rms_norm(
    input: torch.Tensor,
    residual: torch.Tensor,
    normalized_shape: int | Sequence[int] | torch.Size,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    *,
    weight_offset: bool = False,
    round_xhat: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pre-norm residual step in one pass: ``h = input + residual`` (added in fp32, rounded once to the dtype)
    and ``y = rms_norm(h, normalized_shape, weight, eps)``; returns ``(y, h)``, both new tensors. ``y`` is bit for
    bit ``rms_norm`` of ``h``. Differentiable in ``input``, ``residual`` and ``weight``: the backward adds ``h``'s
    gradient from its other consumer (the next residual step) to the norm's in the same pass. The other arguments
    are as in ``rms_norm``; ``residual`` must have ``input``'s shape, dtype and device, or be float32 with a float16
    or bfloat16 input: an fp32 residual stream, where ``h = input.float() + residual`` is float32, ``y`` has the
    input's dtype, ``residual``'s gradient is float32 and ``input``'s is it rounded to the input's dtype (on CUDA:
    the residual add, then the looped kernel on h, at every size)."""
    normalized_shape = _normalized_dims("rmsnorm.add_rms_norm", input, normalized_shape)
    k = len(normalized_shape)
    dtype = input.dtype
    shape = input.shape
    wide = residual.dtype == torch.float32 and dtype in _HALF_DTYPES  # an fp32 residual stream
    _check_residual("rmsnorm.add_rms_norm", input, residual, wide)
    _check_weight("rmsnorm.add_rms_norm", input, normalized_shape, weight)
    flags = (FLAG_WEIGHT_OFFSET if weight_offset else 0) | (FLAG_ROUND_XHAT if round_xhat else 0)
    eps = _eps_value("rmsnorm.add_rms_norm", eps)
    _check_eps("rmsnorm.add_rms_norm", eps, RuntimeError)
    x, r, w = input, residual, weight
    if k > 1:
        x, r = input.flatten(-k), residual.flatten(-k)
        w = weight.flatten() if weight is not None else None
    needs_grad = _grad_enabled() and (
        input.requires_grad or residual.requires_grad or (weight is not None and weight.requires_grad)
    )
    # torch.func, forward AD (as in _forward_eager) and D = 0 (F.rms_norm's empty result): torch ops, h in the
    # residual's dtype, y in the input's.
    if _functorch_active() or _fwad._current_level >= 0 or x.shape[-1] == 0:
        h = (x.float() + r.float()).to(r.dtype)
        y = _forward_formula(h, w, eps, flags, dtype, check=False)
    elif _is_compiling() or _tracing():  # one differentiable op whatever the grad mode (_traced_forward)
        y, h, _rstd = torch.ops.rmsnorm.add_forward(x, r, w, eps, flags)
    elif needs_grad:
        y, h = _EagerAddRMSNorm.apply(x, r, w, eps, flags)
    else:
        with _below_autograd():  # no autograd kernel to pass through
            y, h, _rstd = _add_forward_op(x, r, w, eps, flags)
    return (y.view(shape), h.view(shape)) if k > 1 else (y, h)


@torch.library.register_fake("rmsnorm::forward_quant")
def _forward_quant_fake(x, weight, eps, flags, out_dtype, scale, scale_ub):
    _check_devices("rmsnorm.forward_quant", x, weight=weight, scale=scale, scale_ub=scale_ub)
    scales = x.new_empty((0,) if scale is not None else x.shape[:-1], dtype=torch.float32)
    return x.new_empty(x.shape, dtype=out_dtype), scales


_GROUP_SIZES = (64, 128)


def _check_group_size(op, group_size):
    """The fake kernels' check of the block ops' group_size (the real kernels': python/csrc/ops.cpp)."""
    if type(group_size) is not int or group_size not in _GROUP_SIZES:
        raise RuntimeError(f"{op}: group_size must be 64 or 128, got {group_size}")


def _block_scales_fake(x, group_size, column_major_scales, scales_alignment=1):
    """The block ops' scales: float32 (x's leading shape, nb = ceil(D / group_size)), contiguous, or column-major
    (the contiguous (nb, rows...) tensor with its first dim moved last; for 2-D x, stride (1, rows)), its block
    stride rounded up to a multiple of scales_alignment in the storage of a contiguous (nb, padded) tensor."""
    _check_scales_alignment("rmsnorm: block scales", column_major_scales, scales_alignment, RuntimeError)
    nb = -(-x.shape[-1] // group_size)
    lead = tuple(x.shape[:-1])
    if not column_major_scales:
        return x.new_empty(lead + (nb,), dtype=torch.float32)
    strides, st = [], 1
    for n in reversed(lead):  # the leading dims dense among themselves, the block dim outermost
        strides.append(st)
        st *= max(n, 1)
    padded = -(-st // scales_alignment) * scales_alignment
    if scales_alignment > 1:
        return x.new_empty((nb, padded), dtype=torch.float32).as_strided(lead + (nb,), tuple(reversed(strides)) +
                                                                         (padded,))
    return x.new_empty_strided(lead + (nb,), tuple(reversed(strides)) + (st,), dtype=torch.float32)


def _check_scales_alignment(op, column_major_scales, scales_alignment, error=ValueError):
    if type(scales_alignment) is not int or not 1 <= scales_alignment <= 1024:
        raise error(f"{op}: scales_alignment must be an int in 1..1024, got {scales_alignment!r}")
    if scales_alignment != 1 and not column_major_scales:
        raise error(f"{op}: scales_alignment pads column-major scales; it needs column_major_scales=True")


def _check_scale_tensors(op, scale, scale_ub):
    """scale and scale_ub are tensors (or None): the kernels read them from the input's memory, so that a scale
    that changes between calls costs no host sync and no recompile; a Python number is refused here, by name."""
    for name, t in (("scale", scale), ("scale_ub", scale_ub)):
        if t is not None and not isinstance(t, torch.Tensor):
            hint = (f"; e.g. torch.tensor([{float(t)!r}], device=input.device)"
                    if isinstance(t, (int, float)) and not isinstance(t, bool) else "")
            raise TypeError(f"{op}: {name} must be a one-element float32 tensor on the input's device (or None), "
                            f"got {type(t).__name__}{hint}")


def _check_block_args(op, group_size, column_major_scales, scale):
    """rms_norm_quant's and add_rms_norm_quant's rules for group_size and column_major_scales: whether block scales
    were asked for."""
    if group_size is None:
        if column_major_scales:
            raise ValueError(f"{op}: column_major_scales=True needs block scales (group_size=64 or 128)")
        return False
    if type(group_size) is not int or group_size not in _GROUP_SIZES:
        raise ValueError(f"{op}: group_size must be None (one scale per row, or a static scale), 64 or 128, got "
                         f"{group_size!r}")
    if scale is not None:
        raise ValueError(f"{op}: group_size={group_size} gives dynamic block scales; a static scale cannot be given "
                         "with it")
    return True


@torch.library.register_fake("rmsnorm::forward_block_quant")
def _forward_block_quant_fake(x, weight, eps, flags, out_dtype, group_size, column_major_scales, scale_ub,
                              scales_alignment=1):
    _check_group_size("rmsnorm.forward_block_quant", group_size)
    _check_devices("rmsnorm.forward_block_quant", x, weight=weight, scale_ub=scale_ub)
    return x.new_empty(x.shape, dtype=out_dtype), _block_scales_fake(x, group_size, column_major_scales,
                                                                     scales_alignment)


@torch.library.register_fake("rmsnorm::add_forward_block_quant")
def _add_forward_block_quant_fake(x, residual, weight, eps, flags, out_dtype, group_size, column_major_scales,
                                  scale_ub, scales_alignment=1):
    _check_group_size("rmsnorm.add_forward_block_quant", group_size)
    _check_devices("rmsnorm.add_forward_block_quant", x, residual=residual, weight=weight, scale_ub=scale_ub)
    return (x.new_empty(x.shape, dtype=out_dtype),
            _block_scales_fake(x, group_size, column_major_scales, scales_alignment), x.new_empty(x.shape))


def _detached(*ts):
    return tuple(t.detach() if t is not None else None for t in ts)


def rms_norm_quant(
    input: torch.Tensor,
    normalized_shape: int | Sequence[int] | torch.Size,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    *,
    dtype: torch.dtype = torch.float8_e4m3fn,
    scale: torch.Tensor | None = None,
    scale_ub: torch.Tensor | None = None,
    weight_offset: bool = False,
    round_xhat: bool = False,
    group_size: int | None = None,
    column_major_scales: bool = False,
    scales_alignment: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rms_norm`` with its output quantized to ``dtype`` (``torch.float8_e4m3fn`` or ``torch.int8``), by vLLM's
    rules (``docs/fusions.md``): with ``scale`` (a one-element float32 tensor on ``input``'s device, read there
    and not checked) ``q = quant(y * (1 / scale))``;
    without it a per-row scale ``s = max(min(max|y|, scale_ub) / qmax, min_scale)``, returned as the second value
    (float32, ``input``'s shape without the normalized dims; empty with a static scale). ``y`` is exactly
    ``rms_norm``'s output (``round_xhat=True`` gives vLLM's y). Not differentiable. Unlike ``rms_norm``, an empty
    normalized dim (D = 0) raises a RuntimeError: a row with no elements has no scale.

    ``group_size`` (64 or 128; default None, the above) gives block scales instead: the per-row rule applied to
    each block of ``group_size`` consecutive columns of a row alone (the last block holds the rest), vLLM's
    ``rms_norm_per_block_quant``, for fp8 GEMMs with 1 x 128 (or 1 x 64) block scaling. The scales are then float32
    of shape ``input.shape[:-k] + (nb,)`` with ``nb = ceil(D / group_size)`` (D the product of the normalized
    dims); contiguous, or with ``column_major_scales=True`` stored transposed (for 2-D input the ``.t()`` of a
    contiguous ``(nb, rows)`` tensor, strides ``(1, rows)``: the MN-major layout of fp8 GEMMs with 1 x 128 scaling).
    ``scales_alignment`` (column-major only; default 1) rounds that block stride up to a multiple of it, in the
    storage of a contiguous ``(nb, padded rows)`` tensor: 4 starts each block's column on 16 bytes, as TMA loads of
    the scales want (the padding is not written). Block scales are dynamic: ``scale`` must be None with them;
    ``scale_ub`` bounds each block's max|y| (fp8 only)."""
    op = "rmsnorm.rms_norm_quant"
    _check_scale_tensors(op, scale, scale_ub)
    blocks = _check_block_args(op, group_size, column_major_scales, scale)
    _check_scales_alignment(op, column_major_scales, scales_alignment)
    normalized_shape = _normalized_dims(op, input, normalized_shape)
    _check_weight(op, input, normalized_shape, weight)
    k = len(normalized_shape)
    shape = input.shape
    flags = (FLAG_WEIGHT_OFFSET if weight_offset else 0) | (FLAG_ROUND_XHAT if round_xhat else 0)
    eps = _eps_value(op, eps)
    _check_eps(op, eps, RuntimeError)
    x, w = input, weight
    if k > 1:
        x = input.flatten(-k)
        w = weight.flatten() if weight is not None else None
    # The outputs are not differentiable: eager calls go below autograd (no autograd kernel to pass through).
    # torch.compile cannot trace that context manager; there the inputs are detached, so that the outputs carry no
    # autograd history (the op has no autograd kernel: with an input that requires grad, autograd's fallback would
    # give them a grad_fn whose backward gives nothing).
    if _is_compiling():
        x, w, scale, scale_ub = _detached(x, w, scale, scale_ub)
    with contextlib.nullcontext() if _is_compiling() else _below_autograd():
        if blocks:
            q, scales = torch.ops.rmsnorm.forward_block_quant.default(x, w, eps, flags, dtype, group_size,
                                                                      bool(column_major_scales), scale_ub,
                                                                      scales_alignment)
        else:
            q, scales = torch.ops.rmsnorm.forward_quant.default(x, w, eps, flags, dtype, scale, scale_ub)
    return (q.view(shape) if k > 1 else q), scales


@torch.library.register_fake("rmsnorm::add_forward_quant")
def _add_forward_quant_fake(x, residual, weight, eps, flags, out_dtype, scale, scale_ub):
    _check_devices("rmsnorm.add_forward_quant", x, residual=residual)
    q, scales = _forward_quant_fake(x, weight, eps, flags, out_dtype, scale, scale_ub)
    return q, scales, x.new_empty(x.shape)


def add_rms_norm_quant(
    input: torch.Tensor,
    residual: torch.Tensor,
    normalized_shape: int | Sequence[int] | torch.Size,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    *,
    dtype: torch.dtype = torch.float8_e4m3fn,
    scale: torch.Tensor | None = None,
    scale_ub: torch.Tensor | None = None,
    weight_offset: bool = False,
    round_xhat: bool = False,
    group_size: int | None = None,
    column_major_scales: bool = False,
    scales_alignment: int = 1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pre-norm residual step with a quantized output: ``h = input + residual`` (fp32 sum, one rounding), then
    ``rms_norm_quant(h, ...)``; returns ``(q, scales, h)``, bit for bit ``add_rms_norm``'s h and ``rms_norm_quant``
    of it (block scales with ``group_size``, laid out per ``column_major_scales`` and ``scales_alignment``).
    Arguments as in ``add_rms_norm`` and ``rms_norm_quant``, except that ``residual`` must have ``input``'s dtype
    (no fp32 residual stream here). Not differentiable."""
    op = "rmsnorm.add_rms_norm_quant"
    _check_scale_tensors(op, scale, scale_ub)
    blocks = _check_block_args(op, group_size, column_major_scales, scale)
    _check_scales_alignment(op, column_major_scales, scales_alignment)
    normalized_shape = _normalized_dims(op, input, normalized_shape)
    _check_residual(op, input, residual, False)
    _check_weight(op, input, normalized_shape, weight)
    k = len(normalized_shape)
    shape = input.shape
    flags = (FLAG_WEIGHT_OFFSET if weight_offset else 0) | (FLAG_ROUND_XHAT if round_xhat else 0)
    eps = _eps_value(op, eps)
    _check_eps(op, eps, RuntimeError)
    x, r, w = input, residual, weight
    if k > 1:
        x, r = input.flatten(-k), residual.flatten(-k)
        w = weight.flatten() if weight is not None else None
    if _is_compiling():  # as in rms_norm_quant
        x, r, w, scale, scale_ub = _detached(x, r, w, scale, scale_ub)
    with contextlib.nullcontext() if _is_compiling() else _below_autograd():
        if blocks:
            q, scales, h = torch.ops.rmsnorm.add_forward_block_quant.default(
                x, r, w, eps, flags, dtype, group_size, bool(column_major_scales), scale_ub, scales_alignment)
        else:
            q, scales, h = torch.ops.rmsnorm.add_forward_quant.default(x, r, w, eps, flags, dtype, scale, scale_ub)
    return (q.view(shape), scales, h.view(shape)) if k > 1 else (q, scales, h)


if cpp_autograd:

    def _scripted_op(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, flags: int) -> torch.Tensor:
        """RMSNorm under torch.jit.script: the differentiable operator (the C++ autograd node) that eager uses."""
        return torch.ops.rmsnorm.forward_autograd(x, weight, eps, flags)

else:

    def _scripted_op(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, flags: int) -> torch.Tensor:
        """Without the C++ autograd node: rmsnorm::forward, differentiable through its registered autograd (the
        same formula; more host time per call)."""
        return torch.ops.rmsnorm.forward(x, weight, eps, flags)[0]


if (FLAG_WEIGHT_OFFSET, FLAG_ROUND_XHAT, _DEFAULT_EPS, _FLOAT32_MAX) != (1, 2, 1.1920928955078125e-07,
                                                                        3.4028234663852886e38):
    raise ImportError("rmsnorm: RMSNorm._scripted_forward's constants differ from the module's")


class RMSNorm(torch.nn.RMSNorm):
    """``torch.nn.RMSNorm`` on the rmsnorm library: the same constructor, parameter and state dict (an
    ``nn.RMSNorm`` state dict loads into it and back), plus the library's ``weight_offset`` and ``round_xhat``
    (see ``rms_norm``). With ``weight_offset`` the weight starts at zeros, so that ``w' = 1 + w`` starts at one."""

    def __init__(
        self,
        normalized_shape: int | Sequence[int] | torch.Size,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device=None,
        dtype=None,
        *,
        weight_offset: bool = False,
        round_xhat: bool = False,
    ) -> None:
        super().__init__(normalized_shape, eps, elementwise_affine, device, dtype)
        self.weight_offset = weight_offset
        self.round_xhat = round_xhat
        if weight_offset:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.elementwise_affine:
            if getattr(self, "weight_offset", False):
                torch.nn.init.zeros_(self.weight)
            else:
                torch.nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():
            return self._scripted_forward(x)
        return self._eager_forward(x)

    @torch.jit.unused
    def _eager_forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(
            x, self.normalized_shape, self.weight, self.eps, weight_offset=self.weight_offset,
            round_xhat=self.round_xhat,
        )

    def _scripted_forward(self, x: torch.Tensor) -> torch.Tensor:
        """forward under torch.jit.script, which cannot compile rms_norm: the same operator on the same arguments
        (so the same bits and gradients), the shape checked here, the rest of the argument rules by the operator.
        An input with no elements gets an empty result after the operator's checks, as in rms_norm.
        swap_rmsnorm's subclasses (hf.py), which override forward, do not script."""
        # TorchScript takes no module-level Python numbers: _DEFAULT_EPS, FLAG_WEIGHT_OFFSET, FLAG_ROUND_XHAT and
        # _FLOAT32_MAX are written out (a check after _scripted_op ties them).
        k = len(self.normalized_shape)
        if k == 0:  # as rms_norm and nn.RMSNorm refuse it
            raise RuntimeError("rmsnorm.RMSNorm: normalized_shape must have at least one dim")
        shape_ok = x.dim() >= k
        if shape_ok:
            i = x.dim() - k
            for n in self.normalized_shape:
                if x.shape[i] != n:
                    shape_ok = False
                i += 1
        if not shape_ok:
            raise RuntimeError("rmsnorm.RMSNorm: the input's last dims are not normalized_shape")
        eps_opt = self.eps
        eps = eps_opt if eps_opt is not None else 1.1920928955078125e-07
        flags = (1 if self.weight_offset else 0) | (2 if self.round_xhat else 0)
        w = self.weight
        if x.numel() == 0:
            # The operator's checks, which this path does not reach (rms_norm's _check_rms_norm_args, _check_eps).
            half = x.dtype == torch.float16 or x.dtype == torch.bfloat16
            if not half and x.dtype != torch.float32:
                raise RuntimeError("rmsnorm.RMSNorm: the input must be float32, float16 or bfloat16")
            if w is not None:  # a nested if: TorchScript compiles the second test only where a weight exists
                if w.dtype != x.dtype and not (half and w.dtype == torch.float32):
                    raise RuntimeError("rmsnorm.RMSNorm: the weight must have the input's dtype, or float32 with a "
                                       "16-bit input")
            if not 0.0 <= eps <= 3.4028234663852886e38:  # _FLOAT32_MAX
                raise RuntimeError("rmsnorm.RMSNorm: eps must be >= 0 and finite as a float32")
            # No value to compute: a product that keeps x and the weight in the graph, so that their gradients are
            # eager's (empty, and zeros).
            return (x.float() * w.float()).to(x.dtype) if w is not None else x.clone()
        if k > 1:
            return _scripted_op(x.flatten(x.dim() - k), w.flatten() if w is not None else None, eps, flags).view(
                x.shape)
        return _scripted_op(x, w, eps, flags)

    def extra_repr(self) -> str:
        s = super().extra_repr()
        if self.weight_offset:
            s += ", weight_offset=True"
        if self.round_xhat:
            s += ", round_xhat=True"
        return s


from .hf import swap_rmsnorm  # noqa: E402  (needs RMSNorm)
