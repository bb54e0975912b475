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
def unary_kernel(x_ptr, out_ptr, n, OP: tl.constexpr, BLOCK: tl.constexpr, ACC_DTYPE: tl.constexpr):
    """out[i] = op(x[i]) for i < n, both contiguous; program p owns elements [p * BLOCK, (p + 1) * BLOCK)."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask, other=1.0).to(ACC_DTYPE)
    one = tl.full((BLOCK,), 1.0, ACC_DTYPE)
    if OP == 0:
        y = tl.math.div_rn(x, tl.exp(-x) + 1.0)
    elif OP == 1:
        y = tl.math.div_rn(one, tl.exp(-x) + 1.0)
    else:
        y = tl.math.div_rn(one, tl.sqrt_rn(x))
    tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)


# --- launchers ----------------------------------------------------------------------------------------


def _unary(op: int, x: torch.Tensor) -> torch.Tensor:
    src = x.contiguous()
    out = torch.empty_like(src)
    n = src.numel()
    if n:
        acc = tl.float64 if x.dtype == torch.float64 else tl.float32
        grid = (triton.cdiv(n, POINTWISE_BLOCK),)
        unary_kernel[grid](src, out, n, OP=op, BLOCK=POINTWISE_BLOCK, ACC_DTYPE=acc, num_warps=POINTWISE_NUM_WARPS)
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
