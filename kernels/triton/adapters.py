"""The CUDA adapters: the exact aten signatures, registered by `registry.py` on the `CUDA` key.

This module imports no triton: `registry.py` imports it to build its rows, and `import
oracle_kernels` must work on machines without triton. Each adapter imports its kernel module on
first call (a dict lookup after that), so a CUDA call without triton fails with an ImportError
that says what to install rather than silently running torch's batch-variant kernel.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# --- matrix products (matmul.py) ------------------------------------------------------------------


def mm_adapter(self: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    """aten::mm(Tensor self, Tensor mat2) -> Tensor"""
    from . import matmul

    return matmul.mm(self, mat2)


def addmm_adapter(
    self: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *, beta: complex = 1, alpha: complex = 1
) -> torch.Tensor:
    """aten::addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor"""
    from . import matmul

    return matmul.addmm(self, mat1, mat2, beta, alpha)


def bmm_adapter(self: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    """aten::bmm(Tensor self, Tensor mat2) -> Tensor"""
    from . import matmul

    return matmul.bmm(self, mat2)


# --- row reductions (reduction.py) ------------------------------------------------------------------


def softmax_adapter(self: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
    """aten::_softmax(Tensor self, int dim, bool half_to_float) -> Tensor"""
    from . import reduction

    return reduction.softmax(self, dim, half_to_float)


def log_softmax_adapter(self: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
    """aten::_log_softmax(Tensor self, int dim, bool half_to_float) -> Tensor"""
    from . import reduction

    return reduction.log_softmax(self, dim, half_to_float)


def sum_adapter(
    self: torch.Tensor, dim: Sequence[int] | None, keepdim: bool = False, *, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """aten::sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor"""
    from . import reduction

    return reduction.sum_dim(self, dim, keepdim, dtype)


def mean_adapter(
    self: torch.Tensor, dim: Sequence[int] | None, keepdim: bool = False, *, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """aten::mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor"""
    from . import reduction

    return reduction.mean_dim(self, dim, keepdim, dtype)


def fused_rms_norm_adapter(
    input: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None, eps: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """aten::_fused_rms_norm(Tensor input, int[] normalized_shape, Tensor? weight, float? eps) -> (Tensor, Tensor)"""
    from . import reduction

    return reduction.rms_norm(input, normalized_shape, weight, eps)


# --- elementwise (pointwise.py) ----------------------------------------------------------------------


def silu_adapter(self: torch.Tensor) -> torch.Tensor:
    """aten::silu(Tensor self) -> Tensor"""
    from . import pointwise

    return pointwise.silu(self)


def sigmoid_adapter(self: torch.Tensor) -> torch.Tensor:
    """aten::sigmoid(Tensor self) -> Tensor"""
    from . import pointwise

    return pointwise.sigmoid(self)


def rsqrt_adapter(self: torch.Tensor) -> torch.Tensor:
    """aten::rsqrt(Tensor self) -> Tensor"""
    from . import pointwise

    return pointwise.rsqrt(self)


# --- attention (attention.py) --------------------------------------------------------------------------


def paged_attention_adapter(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    num_kv_splits: int,
) -> torch.Tensor:
    """oracle_kernels::paged_attention(...) on CUDA; `num_kv_splits` is ignored: the split is fixed."""
    from . import attention

    return attention.paged_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale)


# --- the decoder's fused chains (fused.py; kernels/fused.py defines the ops and their compositions) ----------
# bf16 and fp16 run the fused kernel; any other dtype, or operands of mixed dtypes, the composition.


def rms_norm_adapter(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """oracle_kernels::rms_norm(Tensor x, Tensor weight, float eps) -> Tensor"""
    from .. import fused as composed
    from . import fused

    if not fused.fusable(x, weight):
        return composed.rms_norm_composed(x, weight, eps)
    return fused.add_rms_norm(x, None, weight, eps)[0]


def add_rms_norm_adapter(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """oracle_kernels::add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)"""
    from .. import fused as composed
    from . import fused

    if not fused.fusable(x, residual, weight) or x.shape != residual.shape:
        h = residual + x
        return composed.rms_norm_composed(h, weight, eps), h
    return fused.add_rms_norm(x, residual, weight, eps)


def qk_norm_rope_adapter(
    x: torch.Tensor, weight: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, eps: float
) -> torch.Tensor:
    """oracle_kernels::qk_norm_rope(Tensor x, Tensor? weight, Tensor cos, Tensor sin, float eps) -> Tensor"""
    from .. import fused as composed
    from . import fused

    head_dim = x.shape[-1]
    operands = (x, cos, sin) if weight is None else (x, weight, cos, sin)
    if (not fused.fusable(*operands) or x.dim() != 3 or head_dim % 2 or head_dim > fused.MAX_HEAD_DIM
            or cos.shape != (x.shape[0], 1, head_dim) or sin.shape != cos.shape):
        return composed.rope_composed(composed.rms_norm_composed(x, weight, eps) if weight is not None else x, cos, sin)
    return fused.qk_norm_rope(x, weight, cos, sin, eps)


def silu_mul_adapter(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """oracle_kernels::silu_mul(Tensor gate, Tensor up) -> Tensor"""
    from . import fused

    if not fused.fusable(gate, up) or gate.shape != up.shape:
        return torch.nn.functional.silu(gate) * up
    return fused.silu_mul(gate, up)
