"""Swap the RMSNorm modules of a Hugging Face transformers model (or plain ``torch.nn.RMSNorm`` modules) for
``rmsnorm.RMSNorm``, keeping each model's rounding convention.

The conventions, as transformers' modeling code computes them (read from transformers 5.24):

- Llama style (LlamaRMSNorm; Mistral, Qwen2, Qwen3 incl. its per-head q/k norms, Qwen3-MoE and Phi3 have the same
  forward): ``weight * (x.float() * rsqrt(mean(x^2) + eps)).to(input_dtype)``, i.e. x_hat rounded to the input
  dtype before the weight: ``round_xhat=True``. Its eps is ``variance_epsilon``.
- Gemma style (GemmaRMSNorm, Gemma2RMSNorm, Gemma3RMSNorm incl. q/k norms): ``(x_hat * (1.0 + weight.float()))``
  in fp32, rounded once to the input dtype: ``weight_offset=True`` (the 1 added in fp32). Its eps is ``eps``.

The swapped module shares the original's weight ``Parameter`` (the same object: optimizer state, tied weights,
requires_grad, dtype and device carry over), and its state dict keys are the same.
"""

from __future__ import annotations

import torch

_LLAMA_STYLE = frozenset(
    {"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "Qwen3MoeRMSNorm", "Phi3RMSNorm"}
)
_GEMMA_STYLE = frozenset({"GemmaRMSNorm", "Gemma2RMSNorm", "Gemma3RMSNorm"})


def _replacement(module: torch.nn.Module):
    from . import RMSNorm

    name = type(module).__name__
    if name in _LLAMA_STYLE:
        eps, kwargs = module.variance_epsilon, {"round_xhat": True}
    elif name in _GEMMA_STYLE:
        eps, kwargs = module.eps, {"weight_offset": True}
    elif type(module) is torch.nn.RMSNorm:
        new = RMSNorm(module.normalized_shape, module.eps, module.elementwise_affine, device="meta")
        if module.elementwise_affine:
            new.weight = module.weight
        return new
    else:
        return None
    weight = module.weight
    new = RMSNorm(tuple(weight.shape), eps, True, device="meta", **kwargs)
    new.weight = weight
    return new


def swap_rmsnorm(model: torch.nn.Module) -> list[str]:
    """Replace, in place, every RMSNorm module of ``model`` whose convention is known (see the module docstring)
    by an ``rmsnorm.RMSNorm`` with the same convention, eps and weight. Returns the qualified names replaced.

    Inputs whose dtype differs from the weight's (an fp32 weight with bf16 activations) are not supported yet: the
    swapped module raises a TypeError for them."""
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
