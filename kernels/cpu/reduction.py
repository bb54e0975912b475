"""softmax, log_softmax, sum and mean for the CPU: torch's own kernels on canonical row tiles.

The reduced dims are moved last and flattened, the kept dims flattened into rows: `[R, C]`.
Every kernel call then reduces exactly `reduce_rows` rows of length C, so torch's reduction
cannot pick a different split of C over threads (it does, for few rows) because the caller had
a different number of rows.

A reduction that includes dim 0 of a tensor with two or more dims runs across the rows
themselves: its result depends on every row by definition, so there is no order to make
invariant, and those calls go to torch's kernel unchanged. A 1-D tensor is one row.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from ..config import TILED_DTYPES, cpu_tiles
from .tiling import map_row_tiles

# (tile [T, C], dim, half_to_float, *, out [T, C]) -> out: `aten::_softmax.out` / `aten::_log_softmax.out`
SoftmaxOut = Callable[..., torch.Tensor]
# (tile [T, C], dims, keepdim, *, dtype, out [T]) -> out: `aten::sum.IntList_out` / `aten::mean.out`
ReduceOut = Callable[..., torch.Tensor]
# The kernels call those overloads through torch's Python bindings (`torch.sum(..., out=)` is
# `aten::sum.IntList_out`): the same kernel, a few microseconds less per call than the OpOverload.
_BINDINGS: dict[object, Callable[..., torch.Tensor]] = {
    torch.ops.aten._softmax.out: torch._softmax,
    torch.ops.aten._log_softmax.out: torch._log_softmax,
    torch.ops.aten.sum.IntList_out: torch.sum,
    torch.ops.aten.mean.out: torch.mean,
}

# --- kernels: one call of torch's reduction on a fixed shape ------------------------------------


def softmax_kernel(op: SoftmaxOut, x: torch.Tensor, half_to_float: bool, out: torch.Tensor) -> None:
    """out [T, C] = op(x [T, C]) over the last dim; T is the dtype's fixed `reduce_rows`."""
    op(x, -1, half_to_float, out=out)


def reduce_kernel(op: ReduceOut, x: torch.Tensor, dtype: torch.dtype | None, out: torch.Tensor) -> None:
    """out [T] = op(x [T, C]) over the last dim; T is the dtype's fixed `reduce_rows`."""
    op(x, [-1], False, dtype=dtype, out=out)


# --- launchers ----------------------------------------------------------------------------------


def _softmax_like(op: SoftmaxOut, x: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
    out_dtype = torch.float32 if half_to_float else x.dtype
    if x.dim() == 0 or x.dtype not in TILED_DTYPES:
        return op(x, dim, half_to_float, out=x.new_empty(x.shape, dtype=out_dtype))
    dim = dim % x.dim()
    if x.dim() >= 2 and dim == 0:
        return op(x, dim, half_to_float, out=x.new_empty(x.shape, dtype=out_dtype))
    last = dim == x.dim() - 1
    moved = x if last else x.movedim(dim, -1)
    rows = moved.reshape(math.prod(moved.shape[:-1]), moved.shape[-1]).contiguous()  # [R, C]
    tile = cpu_tiles(x.dtype).reduce_rows
    kernel_op = _BINDINGS[op]
    out = map_row_tiles(lambda t, o: softmax_kernel(kernel_op, t[0], half_to_float, o), [rows], rows.shape[1:],
                        out_dtype, tile)
    return out.view(moved.shape) if last else out.view(moved.shape).movedim(-1, dim).contiguous()


def softmax(x: torch.Tensor, dim: int, half_to_float: bool = False) -> torch.Tensor:
    """exp(x) / sum(exp(x)) along `dim`; each slice along `dim` depends only on itself, bitwise."""
    return _softmax_like(torch.ops.aten._softmax.out, x, dim, half_to_float)


def log_softmax(x: torch.Tensor, dim: int, half_to_float: bool = False) -> torch.Tensor:
    """x - log(sum(exp(x))) along `dim`; each slice along `dim` depends only on itself, bitwise."""
    return _softmax_like(torch.ops.aten._log_softmax.out, x, dim, half_to_float)


def _reduced_dims(dim: Sequence[int] | None, ndim: int) -> list[int]:
    # aten's convention: no dims (None or []) reduces every dim.
    if not dim:
        return list(range(ndim))
    return sorted({d % ndim for d in dim})


def _reduce(
    op: ReduceOut, x: torch.Tensor, dim: Sequence[int] | None, keepdim: bool, dtype: torch.dtype | None
) -> torch.Tensor:
    accumulates_float = x.dtype in TILED_DTYPES or dtype in TILED_DTYPES
    dims = _reduced_dims(dim, x.dim()) if x.dim() > 0 else []
    if not accumulates_float or x.dim() == 0 or (x.dim() >= 2 and 0 in dims):
        # Exact integer sums, scalars, and reductions across rows: torch's kernel as is.
        return op(x, dim, keepdim, dtype=dtype, out=x.new_empty(0, dtype=_result_dtype(x, dtype)))
    kept = [d for d in range(x.dim()) if d not in dims]
    kept_shape = [x.shape[d] for d in kept]
    reduced_len = math.prod(x.shape[d] for d in dims)
    moved = x if kept == list(range(len(kept))) else x.permute(*kept, *dims)
    rows = moved.reshape(math.prod(kept_shape), reduced_len).contiguous()  # [R, C]
    out_dtype = _result_dtype(x, dtype)
    tile = cpu_tiles(x.dtype if x.dtype in TILED_DTYPES else out_dtype).reduce_rows
    kernel_op = _BINDINGS[op]
    out = map_row_tiles(lambda t, o: reduce_kernel(kernel_op, t[0], dtype, o), [rows], (), out_dtype, tile)
    result = out.view(kept_shape)
    if keepdim:
        for d in dims:
            result = result.unsqueeze(d)
    return result


def _result_dtype(x: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None:
        return dtype
    if x.is_floating_point() or x.is_complex():
        return x.dtype
    return torch.int64  # sum of integers or bools, as torch does


def sum_dim(
    x: torch.Tensor, dim: Sequence[int] | None, keepdim: bool = False, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Sum over `dim`; each output element depends only on the elements it sums, bitwise."""
    return _reduce(torch.ops.aten.sum.IntList_out, x, dim, keepdim, dtype)


def mean_dim(
    x: torch.Tensor, dim: Sequence[int] | None, keepdim: bool = False, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Mean over `dim`; each output element depends only on the elements it averages, bitwise."""
    return _reduce(torch.ops.aten.mean.out, x, dim, keepdim, dtype)


# --- adapters: the exact aten signatures --------------------------------------------------------


def softmax_adapter(self: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
    """aten::_softmax(Tensor self, int dim, bool half_to_float) -> Tensor"""
    return softmax(self, dim, half_to_float)


def log_softmax_adapter(self: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
    """aten::_log_softmax(Tensor self, int dim, bool half_to_float) -> Tensor"""
    return log_softmax(self, dim, half_to_float)


def sum_adapter(
    self: torch.Tensor, dim: Sequence[int] | None, keepdim: bool = False, *, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """aten::sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor"""
    return sum_dim(self, dim, keepdim, dtype)


def mean_adapter(
    self: torch.Tensor, dim: Sequence[int] | None, keepdim: bool = False, *, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """aten::mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor"""
    return mean_dim(self, dim, keepdim, dtype)
