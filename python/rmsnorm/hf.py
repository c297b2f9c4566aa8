"""Swap the RMSNorm modules of a Hugging Face transformers model (or plain ``torch.nn.RMSNorm`` modules) for
``rmsnorm.RMSNorm``, keeping each model's rounding convention.

The conventions, as transformers' modeling code computes them (read from transformers 5.24):

- Llama style (LlamaRMSNorm; Mistral, Qwen2, Qwen3 incl. its per-head q/k norms, Qwen3-MoE and Phi3 have the same
  forward): ``weight * (x.float() * rsqrt(mean(x^2) + eps)).to(input_dtype)``, i.e. x_hat rounded to the input
  dtype before the weight: ``round_xhat=True``. Its eps is ``variance_epsilon``. The product has torch's promoted
  dtype: with an fp32 weight and 16-bit activations (or a 16-bit weight and fp32 activations) it is float32, and
  so is the swapped module's output (``out_dtype``).
- Gemma style (GemmaRMSNorm, Gemma2RMSNorm, Gemma3RMSNorm incl. q/k norms): ``(x_hat * (1.0 + weight.float()))``
  in fp32, rounded once to the input dtype: ``weight_offset=True`` (the 1 added in fp32). Its eps is ``eps``.
- ``torch.nn.RMSNorm``: ``x.float() * rsqrt(mean(x^2) + eps) * weight`` in fp32 (a weight of another dtype widened),
  rounded once to the input dtype.

The swapped module shares the original's weight ``Parameter`` (the same object: optimizer state, tied weights,
requires_grad, dtype and device carry over), and its state dict keys are the same.
"""

from __future__ import annotations

import torch

from . import RMSNorm, rms_norm  # this module is imported by __init__.py once they are defined

_LLAMA_STYLE = frozenset(
    {"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "Qwen3MoeRMSNorm", "Phi3RMSNorm"}
)
_GEMMA_STYLE = frozenset({"GemmaRMSNorm", "Gemma2RMSNorm", "Gemma3RMSNorm"})


def _model_weight(x, weight):
    """The weight as the kernels take it for the model's product: as it is where it has x's dtype or is float32;
    any other 16-bit weight (with float32 activations, or float16 with bfloat16 ones), which the model's product
    promotes to float32, widened to float32 (exact). That costs a float32 copy of the weight per call (D floats);
    its gradient reaches the 16-bit weight through autograd, rounded once, as the model's own does."""
    if weight.dtype == x.dtype or weight.dtype == torch.float32:
        return weight
    return weight.float()


_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _kernels_take(x, weight):
    """Whether the kernels compute this call: x a strided tensor (not nested or sparse) and x and the weight of
    float32, float16 or bfloat16. The rest (a model in float64, say, for gradcheck, or jagged activations) is
    computed as the replaced module computes it, in torch."""
    return (x.layout == torch.strided and not x.is_nested and x.dtype in _KERNEL_DTYPES
            and (weight is None or weight.dtype in _KERNEL_DTYPES))


def _model_x_hat(x, eps):
    """x_hat in float32 as the models compute it: ``x.float() * rsqrt(mean(x.float()^2) + eps)``."""
    xf = x.to(torch.float32)
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


def _llama_style_rms_norm(x, normalized_shape, weight, eps):
    """``rms_norm`` with ``round_xhat``, y in the promoted dtype of the weight and x, as ``weight *
    x_hat.to(input_dtype)`` gives it."""
    if not _kernels_take(x, weight):
        return weight * _model_x_hat(x, eps).to(x.dtype)
    out_dtype = None if weight.dtype == x.dtype else torch.promote_types(weight.dtype, x.dtype)
    return rms_norm(x, normalized_shape, _model_weight(x, weight), eps, round_xhat=True, out_dtype=out_dtype)


def _gemma_style_rms_norm(x, normalized_shape, weight, eps):
    """``rms_norm`` with ``weight_offset``: ``x_hat * (1.0 + weight.float())`` in fp32, rounded once to x's dtype."""
    if not _kernels_take(x, weight):
        return (_model_x_hat(x, eps) * (1.0 + weight.float())).type_as(x)
    return rms_norm(x, normalized_shape, _model_weight(x, weight), eps, weight_offset=True)


def _torch_style_rms_norm(x, normalized_shape, weight, eps):
    """``rms_norm`` as ``torch.nn.RMSNorm`` computes it with any weight dtype: x times rsqrt in fp32, times the
    weight widened to fp32 (exact), rounded once to x's dtype. What the kernels do not take goes to
    ``F.rms_norm``."""
    if not _kernels_take(x, weight):
        return torch.nn.functional.rms_norm(x, normalized_shape, weight, eps)
    return rms_norm(x, normalized_shape, _model_weight(x, weight) if weight is not None else None, eps)


# torch.fx.symbolic_trace records these as one call each, as __init__.py has it record rms_norm: the dtype tests
# above cannot be traced symbolically.
torch.fx.wrap("_llama_style_rms_norm")
torch.fx.wrap("_gemma_style_rms_norm")
torch.fx.wrap("_torch_style_rms_norm")


class LlamaStyleRMSNorm(RMSNorm):
    """``RMSNorm`` with ``round_xhat``, its output in the promoted dtype of the weight and the input, as
    ``weight * x_hat.to(input_dtype)`` gives it (swap_rmsnorm's replacement of the Llama-style modules)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _llama_style_rms_norm(x, self.normalized_shape, self.weight, self.eps)


class GemmaStyleRMSNorm(RMSNorm):
    """``RMSNorm`` with ``weight_offset`` (swap_rmsnorm's replacement of the Gemma-style modules), which takes a
    weight of any of the three dtypes with activations of any, as the model's ``1.0 + weight.float()`` does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _gemma_style_rms_norm(x, self.normalized_shape, self.weight, self.eps)


class TorchStyleRMSNorm(RMSNorm):
    """``RMSNorm`` that takes what ``torch.nn.RMSNorm`` takes (swap_rmsnorm's replacement of it): a weight of
    another dtype than the input's is widened to float32 and y has the input's dtype, as torch computes it; a
    float64 or nested input goes to ``F.rms_norm``. Under ``torch.jit.script`` it is ``RMSNorm`` (the kernels'
    dtypes only)."""

    @torch.jit.unused
    def _eager_forward(self, x: torch.Tensor) -> torch.Tensor:
        return _torch_style_rms_norm(x, self.normalized_shape, self.weight, self.eps)


def _replacement(module: torch.nn.Module):
    name = type(module).__name__
    if name in _LLAMA_STYLE:
        new = LlamaStyleRMSNorm(tuple(module.weight.shape), module.variance_epsilon, True, device="meta",
                                round_xhat=True)
    elif name in _GEMMA_STYLE:
        new = GemmaStyleRMSNorm(tuple(module.weight.shape), module.eps, True, device="meta", weight_offset=True)
    elif type(module) is torch.nn.RMSNorm:
        new = TorchStyleRMSNorm(module.normalized_shape, module.eps, module.elementwise_affine, device="meta")
        if not module.elementwise_affine:
            return new
    else:
        return None
    new.weight = module.weight
    return new


def swap_rmsnorm(model: torch.nn.Module) -> list[str]:
    """Replace, in place, every RMSNorm module of ``model`` whose convention is known (see the module docstring)
    by an ``rmsnorm.RMSNorm`` with the same convention, eps and weight. Returns the qualified names replaced.

    Mixed dtypes are taken as the model computes them, whatever the weight's and the activations' dtypes: the Llama
    style's output has their promoted dtype (float32 for any mix), the Gemma style's and ``torch.nn.RMSNorm``'s the
    activations'. An fp32 weight goes to the kernels as it is; a 16-bit weight of another dtype than the
    activations' (or, with float32 activations, than y's) is widened to float32 on each call (D floats), as the
    model's product widens it. Inputs the kernels do not take (float64, nested or sparse tensors, a float64 weight)
    are computed by the replaced module's own formula in torch (``F.rms_norm`` for ``torch.nn.RMSNorm``)."""
    swapped = []
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            new = _replacement(child)
            if new is None:
                continue
            new.train(child.training)
            setattr(parent, child_name, new)
            swapped.append(f"{parent_name}.{child_name}" if parent_name else child_name)
    return swapped
