"""silu, sigmoid and rsqrt for the CPU: elementwise ops whose torch kernel is batch-variant.

No reduction here, yet torch's CPU kernels for these ops give an element a result that depends
on the tensor's size. Their loops run the vectorised function on whole vectors and a scalar
function on the leftover tail of each thread's chunk; the two round differently (fp32 silu and
sigmoid; bf16/fp16 rsqrt), and where the chunks end depends on the number of elements.

We compose each op from operations whose element result does not depend on where the element
sits: IEEE +, -, *, / and sqrt (correctly rounded in the vector and the scalar path alike), and
torch.exp, whose CPU kernel hands every contiguous run to one vectorised routine, tail included.
The tests check the result against every row's solo value and against torch's op.
"""

from __future__ import annotations

import torch

from ..config import TILED_DTYPES

# Computation dtype per input dtype: halves go through float32 and round once at the end.
_COMPUTE_DTYPE = {torch.float64: torch.float64, torch.float32: torch.float32}

# --- kernels: position-independent formulas ----------------------------------------------------


def silu_kernel(x: torch.Tensor) -> torch.Tensor:
    """x / (1 + exp(-x)), elementwise, in x's dtype (float32 or float64)."""
    return x / (torch.exp(-x) + 1)


def sigmoid_kernel(x: torch.Tensor) -> torch.Tensor:
    """1 / (1 + exp(-x)), elementwise, in x's dtype (float32 or float64)."""
    return torch.reciprocal(torch.exp(-x) + 1)


def rsqrt_kernel(x: torch.Tensor) -> torch.Tensor:
    """1 / sqrt(x), elementwise; torch's float32/float64 rsqrt is a correctly rounded sqrt and divide."""
    return torch.rsqrt(x, out=torch.empty_like(x))  # aten::rsqrt.out, which enable() leaves alone


# --- launchers ----------------------------------------------------------------------------------


def _in_compute_dtype(x: torch.Tensor) -> torch.Tensor:
    dtype = _COMPUTE_DTYPE.get(x.dtype, torch.float32)
    return x if x.dtype == dtype else x.to(dtype)


def _as(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return y if y.dtype == dtype else y.to(dtype)


def silu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x); halves computed in float32 and rounded once."""
    if x.dtype not in TILED_DTYPES:
        return torch.ops.aten.silu.out(x, out=torch.empty_like(x))
    return _as(silu_kernel(_in_compute_dtype(x)), x.dtype)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """1 / (1 + exp(-x)); halves computed in float32 and rounded once."""
    if x.dtype not in TILED_DTYPES:
        return torch.ops.aten.sigmoid.out(x, out=torch.empty_like(x, dtype=torch.get_default_dtype()))
    return _as(sigmoid_kernel(_in_compute_dtype(x)), x.dtype)


def rsqrt(x: torch.Tensor) -> torch.Tensor:
    """1 / sqrt(x); halves computed in float32 and rounded once."""
    if x.dtype not in TILED_DTYPES:
        return torch.ops.aten.rsqrt.out(x, out=torch.empty_like(x, dtype=torch.get_default_dtype()))
    return _as(rsqrt_kernel(_in_compute_dtype(x)), x.dtype)


# --- adapters: the exact aten signatures --------------------------------------------------------


def silu_adapter(self: torch.Tensor) -> torch.Tensor:
    """aten::silu(Tensor self) -> Tensor"""
    return silu(self)


def sigmoid_adapter(self: torch.Tensor) -> torch.Tensor:
    """aten::sigmoid(Tensor self) -> Tensor"""
    return sigmoid(self)


def rsqrt_adapter(self: torch.Tensor) -> torch.Tensor:
    """aten::rsqrt(Tensor self) -> Tensor"""
    return rsqrt(self)
