"""silu, sigmoid and rsqrt on CUDA: one elementwise Triton kernel.

torch's CUDA kernels for these ops already give an element a result that does not depend on the
tensor's size (every element runs the same functor). They are covered anyway so that the CUDA
backend replaces the same ops as the CPU one, and `audit` reports the same coverage on both
devices. Halves are computed in fp32 and rounded once, with the formulas of the CPU backend:
x / (1 + exp(-x)), 1 / (1 + exp(-x)) and 1 / sqrt(x), divide and sqrt correctly rounded.
"""

from __future__ import annotations

import torch

from .config import FLOAT_DTYPES, POINTWISE_BLOCK, POINTWISE_NUM_WARPS
from .language import tl, triton

SILU, SIGMOID, RSQRT = 0, 1, 2

# --- kernel -------------------------------------------------------------------------------------------


@triton.jit
def unary_math(x, OP: tl.constexpr, BLOCK: tl.constexpr, FP64: tl.constexpr):
    """op(x) for x in fp32 (fp64 when FP64), with a correctly rounded divide and sqrt.

    Triton's fp32 `/` is the approximate div.full (2 ulp), and sqrt_rn / div_rn take fp32 only
    (fp64's `/` and sqrt are IEEE already). unary_kernel and fused.py's silu_mul_kernel both call it.
    """
    num = x if OP == 0 else tl.full((BLOCK,), 1.0, x.dtype)
    den = (tl.sqrt(x) if FP64 else tl.sqrt_rn(x)) if OP == 2 else tl.exp(-x) + 1.0
    return num / den if FP64 else tl.math.div_rn(num, den)


@triton.jit
def unary_kernel(x_ptr, out_ptr, n, OP: tl.constexpr, BLOCK: tl.constexpr, FP64: tl.constexpr):
    """out[i] = op(x[i]) for i < n, both contiguous; program p owns elements [p * BLOCK, (p + 1) * BLOCK).

    Computed in fp32 (fp64 when FP64) by `unary_math`, rounded once to out's dtype.
    """
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask, other=1.0)
    x = x.to(tl.float64) if FP64 else x.to(tl.float32)
    y = unary_math(x, OP, BLOCK, FP64)
    tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)


# --- launchers ----------------------------------------------------------------------------------------


def _unary(op: int, x: torch.Tensor) -> torch.Tensor:
    src = x.contiguous()
    out = torch.empty_like(src)
    n = src.numel()
    if n:
        grid = (triton.cdiv(n, POINTWISE_BLOCK),)
        fp64 = x.dtype == torch.float64
        unary_kernel[grid](src, out, n, OP=op, BLOCK=POINTWISE_BLOCK, FP64=fp64, num_warps=POINTWISE_NUM_WARPS)
    return out


def silu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x), elementwise; halves computed in fp32 and rounded once."""
    if x.dtype not in FLOAT_DTYPES:
        return torch.ops.aten.silu.out(x, out=torch.empty_like(x))
    return _unary(SILU, x)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """1 / (1 + exp(-x)), elementwise; halves computed in fp32 and rounded once."""
    if x.dtype not in FLOAT_DTYPES:
        return torch.ops.aten.sigmoid.out(x, out=torch.empty_like(x, dtype=torch.get_default_dtype()))
    return _unary(SIGMOID, x)


def rsqrt(x: torch.Tensor) -> torch.Tensor:
    """1 / sqrt(x), elementwise; halves computed in fp32 and rounded once."""
    if x.dtype not in FLOAT_DTYPES:
        return torch.ops.aten.rsqrt.out(x, out=torch.empty_like(x, dtype=torch.get_default_dtype()))
    return _unary(RSQRT, x)
