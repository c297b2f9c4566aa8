"""Shared test helpers: devices, random inputs, the float64 reference and its tolerances."""

from __future__ import annotations

import math

import pytest
import torch

import rmsnorm

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Unit roundoff of each storage dtype (half an ulp at 1).
UNIT = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
F32_UNIT = 2.0**-24

HAVE_CUDA = torch.cuda.is_available() and rmsnorm.cuda_built()
CUDA_SKIP_REASON = (
    "no CUDA device" if not torch.cuda.is_available() else "rmsnorm was built without its CUDA backend"
)
requires_cuda = pytest.mark.skipif(not HAVE_CUDA, reason=CUDA_SKIP_REASON)

DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]


def randn(*shape, dtype=torch.float32, device="cpu", gen=None, scale=1.0):
    """Normal values, never exactly zero (zeros hide unwritten outputs)."""
    t = torch.randn(*shape, generator=gen, dtype=torch.float32) * scale
    t = torch.where(t == 0, torch.full_like(t, 0.5), t)
    return t.to(dtype=dtype, device=device)


def row_scaled(x, gen):
    """Neighbouring rows scaled by very different factors (1e-3 .. 1e3), so that a row normalized by another row's
    sum of squares fails at once."""
    rows = x.shape[:-1]
    f = 10.0 ** (torch.randint(-3, 4, rows, generator=gen).to(torch.float32))
    return (x.float() * f.unsqueeze(-1).to(x.device)).to(x.dtype)


def reference(x, weight, eps, weight_offset=False, round_xhat=False, gy=None):
    """float64 reference over the last dim: y (rounded to x's dtype) and, given gy, gx and gw in float64 (gw as the
    exact sum) with the per-element bounds on their fp32 accumulation."""
    dt = x.dtype
    xd = x.double()
    D = x.shape[-1]
    r = torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)
    xh = xd * r
    if weight is None:
        wp = torch.ones(D, dtype=torch.float64, device=x.device)
    else:
        wp = weight.double() + (1.0 if weight_offset else 0.0)
    if round_xhat:
        y = (xh.to(dt).double() * wp).to(dt)
    else:
        y = (xh * wp).to(dt)
    out = {"y": y, "y_exact": xh * wp, "xhat": xh}
    if gy is not None:
        g = gy.double()
        m = (xh * wp * g).mean(-1, keepdim=True)
        out["gx"] = r * (wp * g - xh * m)
        # Scale of the terms that cancel in gx, for its bound.
        out["gx_scale"] = r * (wp.abs() * g.abs() + xh.abs() * (xh * wp * g).abs().mean(-1, keepdim=True))
        prod = (g * xh).reshape(-1, D)
        out["gw"] = prod.sum(0)
        out["gw_abs"] = prod.abs().sum(0)
        out["rows"] = prod.shape[0]
    return out


def check_close(name, got, want, bound):
    """Every element within its bound; on failure, report the worst element."""
    got = got.double().cpu()
    want = want.double().cpu()
    bound = torch.as_tensor(bound, dtype=torch.float64).cpu().expand_as(want)
    err = (got - want).abs()
    bad = ~(err <= bound)  # NaN fails
    if bad.any():
        ratio = torch.where(bad, err / bound.clamp_min(1e-300), torch.zeros_like(err))
        ratio = torch.nan_to_num(ratio, nan=float("inf"))
        i = int(ratio.flatten().argmax())
        idx = tuple(int(v) for v in torch.unravel_index(torch.tensor(i), want.shape))
        raise AssertionError(
            f"{name}: {int(bad.sum())} of {want.numel()} elements out of bounds; worst at {idx}: "
            f"got {got[idx].item():.9g}, want {want[idx].item():.9g}, bound {bound[idx].item():.3g}"
        )


def y_bound(ref, dtype, D, round_xhat):
    """One ulp of the output (a rounding on either side of a near tie), one more of x_hat with round_xhat, plus fp32
    accumulation."""
    u = UNIT[dtype]
    b = 2.02 * u * ref["y"].double().abs() + 16 * math.sqrt(D) * F32_UNIT * ref["y_exact"].abs()
    if round_xhat:
        b = b + u * ref["y_exact"].abs()
    # Subnormal / tiny outputs: the smallest normal of the dtype.
    return b + torch.finfo(dtype).tiny


def gx_bound(ref, dtype, D):
    u = UNIT[dtype]
    return 2.02 * u * ref["gx"].abs() + 32 * math.sqrt(D) * F32_UNIT * ref["gx_scale"] + torch.finfo(dtype).tiny


def gw_bound(ref, dtype):
    """gw: fp32 accumulation over all rows (a bound growing with sqrt(rows)), then one rounding to the dtype."""
    u = UNIT[dtype]
    return (
        2.02 * u * ref["gw"].abs()
        + 16 * math.sqrt(ref["rows"] * 1.0 + 64) * F32_UNIT * ref["gw_abs"]
        + torch.finfo(dtype).tiny
    )
