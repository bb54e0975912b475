"""softmax, log_softmax, sum, mean and RMS norm on CUDA: one Triton program per row.

Every op reduces rows [R, C] (the reduced dims moved last and flattened, the kept dims flattened
into rows, as the CPU backend does). A program owns one row and walks it in blocks of `block`
lanes (config.row_tiles, a function of C alone): lane l accumulates columns l, l + block, ... in
order, in fp32 (fp64 for fp64), then one tree reduction of fixed shape combines the lanes. Nothing
in that sequence depends on R, so row i of op(x[:M]) has the bits of op(x[i:i+1]).

A reduction that includes dim 0 of a tensor with two or more dims runs across the rows
themselves: there is no batch to be invariant to, and those calls go to torch's kernel through
the `.out` overloads, which this package does not override (so they cannot recurse).

On CUDA, F.rms_norm reaches `aten::_fused_rms_norm` (torch 2.8+: `rms_norm` is composite and
calls the fused op unless the weight's dtype differs from the input's); the composite fallback
(pow, mean.dim, add, rsqrt, mul) reduces only in mean.dim, which is covered too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from .config import FLOAT_DTYPES, row_tiles
from .language import tl, triton

# --- kernels ----------------------------------------------------------------------------------------


@triton.jit
def softmax_kernel(
    x_ptr, out_ptr, C, stride_x, stride_out,
    BLOCK: tl.constexpr, LOG: tl.constexpr, ACC_DTYPE: tl.constexpr,
):
    """out[r] = softmax(x[r]) (LOG: log_softmax) over C columns; program r owns row r."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    out_row = out_ptr + row * stride_out
    lanes = tl.arange(0, BLOCK)
    # Pass 1, per lane: the running max m and sum s of exp(x - m), rescaled when m grows.
    m = tl.full((BLOCK,), float("-inf"), ACC_DTYPE)
    s = tl.zeros((BLOCK,), ACC_DTYPE)
    for c0 in range(0, C, BLOCK):
        cols = c0 + lanes
        x = tl.load(x_row + cols, mask=cols < C, other=float("-inf")).to(ACC_DTYPE)
        m_new = tl.maximum(m, x)
        # A lane that has seen only -inf keeps m = -inf; shifting by 0 there avoids inf - inf.
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - shift) + tl.exp(x - shift)
        m = m_new
    row_max = tl.max(m, axis=0)
    row_shift = tl.where(row_max == float("-inf"), 0.0, row_max)
    total = tl.sum(s * tl.exp(m - row_shift), axis=0)
    log_total = tl.log(total)
    # Pass 2: write.
    for c0 in range(0, C, BLOCK):
        cols = c0 + lanes
        x = tl.load(x_row + cols, mask=cols < C, other=0.0).to(ACC_DTYPE)
        y = (x - row_shift) - log_total if LOG else tl.exp(x - row_shift) / total
        tl.store(out_row + cols, y.to(out_ptr.dtype.element_ty), mask=cols < C)


@triton.jit
def sum_kernel(
    x_ptr, out_ptr, C, stride_x,
    BLOCK: tl.constexpr, MEAN: tl.constexpr, ACC_DTYPE: tl.constexpr,
):
    """out[r] = sum(x[r]) (MEAN: divided by C) over C columns; program r owns row r."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    lanes = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), ACC_DTYPE)
    for c0 in range(0, C, BLOCK):
        cols = c0 + lanes
        acc += tl.load(x_row + cols, mask=cols < C, other=0.0).to(ACC_DTYPE)
    total = tl.sum(acc, axis=0)
    if MEAN:
        total = total / C
    tl.store(out_ptr + row, total.to(out_ptr.dtype.element_ty))


@triton.jit
def rms_tile(x_row, r_row, cols, C, ACC_DTYPE: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """Columns `cols` of a row in ACC_DTYPE: x, or with HAS_RESIDUAL r + x rounded to x's dtype once, as
    torch's half-precision add does (fp32 sum of the two, then one rounding)."""
    x = tl.load(x_row + cols, mask=cols < C, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(r_row + cols, mask=cols < C, other=0.0)
        x = (r.to(tl.float32) + x.to(tl.float32)).to(x.dtype)
    return x.to(ACC_DTYPE)


@triton.jit
def row_rstd(
    x_row, r_row, C, eps, lanes,
    BLOCK: tl.constexpr, ACC_DTYPE: tl.constexpr, FP64: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
):
    """1 / sqrt(mean(x^2) + eps) of one row (`rms_tile`'s values), in ACC_DTYPE.

    The one copy of the RMS reduction: rms_norm_kernel and the fused kernels of fused.py call it, so the
    fused ones sum in the same order by construction (lane l accumulates columns l, l + BLOCK, ...; then
    one tl.sum). The tree of that tl.sum follows the register layout the compiler gives `squares`, which
    follows the loads: callers pass `lanes` whose contiguity gives the loads the same vector width.
    """
    squares = tl.zeros((BLOCK,), ACC_DTYPE)
    for c0 in range(0, C, BLOCK):
        cols = c0 + lanes
        x = rms_tile(x_row, r_row, cols, C, ACC_DTYPE, HAS_RESIDUAL)
        # One fused multiply-add, written out: the contraction the compiler made of `squares += x * x` while
        # Triton's FP fusion was on by default, kept whatever that default (off from Triton 3.10) and
        # whatever a caller's launch sets (the fused kernels launch with it off).
        squares = tl.fma(x, x, squares)
    total = tl.sum(squares, axis=0)
    # Correctly rounded divides and sqrt: the CPU backend's rsqrt formula. (fp64's sqrt and divide are IEEE
    # already; sqrt_rn and div_rn take fp32 only.) The mean too: fp32's `/` is an approximate reciprocal and
    # a multiply, which ptxas fuses with the `+ eps` into one FFMA where FP fusion is on and not where it is
    # off, so a kernel launched with it off (the fused ones) would round the mean otherwise.
    one = tl.full((), 1.0, ACC_DTYPE)
    if FP64:
        rstd = one / tl.sqrt(total / C + eps)
    else:
        rstd = tl.math.div_rn(one, tl.sqrt_rn(tl.math.div_rn(total, tl.full((), C, ACC_DTYPE)) + eps))
    return rstd


@triton.jit
def rms_norm_kernel(
    x_ptr, w_ptr, out_ptr, rstd_ptr, C, stride_x, stride_out, eps,
    BLOCK: tl.constexpr, HAS_WEIGHT: tl.constexpr, ACC_DTYPE: tl.constexpr, FP64: tl.constexpr,
):
    """out[r] = x[r] / sqrt(mean(x[r]^2) + eps) (* w), rstd[r] = 1 / sqrt(...); computed in ACC_DTYPE.

    FP64 says ACC_DTYPE is fp64 (a flag, since comparing dtypes inside a kernel is not reliable).
    """
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    out_row = out_ptr + row * stride_out
    lanes = tl.arange(0, BLOCK)
    rstd = row_rstd(x_row, x_row, C, eps, lanes, BLOCK, ACC_DTYPE, FP64, False)
    tl.store(rstd_ptr + row, rstd.to(rstd_ptr.dtype.element_ty))
    for c0 in range(0, C, BLOCK):
        cols = c0 + lanes
        x = tl.load(x_row + cols, mask=cols < C, other=0.0).to(ACC_DTYPE)
        y = x * rstd
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + cols, mask=cols < C, other=0.0).to(ACC_DTYPE)
        tl.store(out_row + cols, y.to(out_ptr.dtype.element_ty), mask=cols < C)


# --- launchers --------------------------------------------------------------------------------------


def _acc_dtype(*dtypes: torch.dtype | None) -> tl.dtype:
    return tl.float64 if torch.float64 in dtypes else tl.float32


def _as_rows(x: torch.Tensor, dims: Sequence[int]) -> tuple[torch.Tensor, list[int]]:
    """x with `dims` moved last and flattened: ([R, C] with unit stride along C, kept shape)."""
    kept = [d for d in range(x.dim()) if d not in dims]
    kept_shape = [x.shape[d] for d in kept]
    reduced = math.prod(x.shape[d] for d in dims)
    rows = x.permute(*kept, *dims).reshape(math.prod(kept_shape), reduced)
    if rows.shape[1] > 1 and rows.stride(1) != 1:
        rows = rows.contiguous()
    return rows, kept_shape


# (x, dim, half_to_float, *, out) -> out: aten::_softmax.out / aten::_log_softmax.out
SoftmaxOut = Callable[..., torch.Tensor]


def _softmax_like(
    op: SoftmaxOut, log: bool, x: torch.Tensor, dim: int, half_to_float: bool, block: int | None
) -> torch.Tensor:
    out_dtype = torch.float32 if half_to_float else x.dtype
    if x.dim() == 0 or x.dtype not in FLOAT_DTYPES or (x.dim() >= 2 and dim % x.dim() == 0):
        return op(x, dim, half_to_float, out=x.new_empty(x.shape, dtype=out_dtype))
    dim = dim % x.dim()
    moved = x.movedim(dim, -1)
    rows, _ = _as_rows(moved, [moved.dim() - 1])  # [R, C]
    out = rows.new_empty(rows.shape, dtype=out_dtype)
    num_rows, length = rows.shape
    if num_rows and length:
        tiles = row_tiles(length)
        softmax_kernel[(num_rows,)](
            rows, out, length, rows.stride(0), out.stride(0),
            BLOCK=block or tiles.block, LOG=log, ACC_DTYPE=_acc_dtype(x.dtype), num_warps=tiles.num_warps,
        )
    return out.view(moved.shape).movedim(-1, dim).contiguous()


def softmax(x: torch.Tensor, dim: int, half_to_float: bool = False, block: int | None = None) -> torch.Tensor:
    """exp(x) / sum(exp(x)) along `dim`; each slice depends only on itself, bitwise. `block`: tests only."""
    return _softmax_like(torch.ops.aten._softmax.out, False, x, dim, half_to_float, block)


def log_softmax(x: torch.Tensor, dim: int, half_to_float: bool = False, block: int | None = None) -> torch.Tensor:
    """x - log(sum(exp(x))) along `dim`; each slice depends only on itself, bitwise. `block`: tests only."""
    return _softmax_like(torch.ops.aten._log_softmax.out, True, x, dim, half_to_float, block)


def _reduced_dims(dim: Sequence[int] | None, ndim: int) -> list[int]:
    # aten's convention: no dims (None or []) reduces every dim.
    if not dim:
        return list(range(ndim))
    return sorted({d % ndim for d in dim})


def _result_dtype(x: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None:
        return dtype
    if x.is_floating_point() or x.is_complex():
        return x.dtype
    return torch.int64  # sum of integers or bools, as torch does


# (x, dims, keepdim, *, dtype, out) -> out: aten::sum.IntList_out / aten::mean.out
ReduceOut = Callable[..., torch.Tensor]


def _reduce(
    op: ReduceOut, mean: bool, x: torch.Tensor, dim: Sequence[int] | None, keepdim: bool,
    dtype: torch.dtype | None, block: int | None,
) -> torch.Tensor:
    out_dtype = _result_dtype(x, dtype)
    dims = _reduced_dims(dim, x.dim()) if x.dim() > 0 else []
    ours = x.dtype in FLOAT_DTYPES and out_dtype in FLOAT_DTYPES
    if not ours or x.dim() == 0 or (x.dim() >= 2 and 0 in dims):
        # Exact integer sums, complex, scalars, and reductions across rows: torch's kernel as is.
        return op(x, dim, keepdim, dtype=dtype, out=x.new_empty(0, dtype=out_dtype))
    rows, kept_shape = _as_rows(x, dims)  # [R, C]
    out = rows.new_empty(rows.shape[0], dtype=out_dtype)
    num_rows, length = rows.shape
    if num_rows:
        if length == 0:
            # torch: the empty sum is 0 and the empty mean is NaN.
            out.fill_(float("nan") if mean else 0)
        else:
            tiles = row_tiles(length)
            sum_kernel[(num_rows,)](
                rows, out, length, rows.stride(0),
                BLOCK=block or tiles.block, MEAN=mean, ACC_DTYPE=_acc_dtype(x.dtype, out_dtype),
                num_warps=tiles.num_warps,
            )
    result = out.view(kept_shape)
    if keepdim:
        for d in dims:
            result = result.unsqueeze(d)
    return result


def sum_dim(
    x: torch.Tensor, dim: Sequence[int] | None, keepdim: bool = False, dtype: torch.dtype | None = None,
    block: int | None = None,
) -> torch.Tensor:
    """Sum over `dim`; each output element depends only on the elements it sums, bitwise."""
    return _reduce(torch.ops.aten.sum.IntList_out, False, x, dim, keepdim, dtype, block)


def mean_dim(
    x: torch.Tensor, dim: Sequence[int] | None, keepdim: bool = False, dtype: torch.dtype | None = None,
    block: int | None = None,
) -> torch.Tensor:
    """Mean over `dim`; each output element depends only on the elements it averages, bitwise."""
    return _reduce(torch.ops.aten.mean.out, True, x, dim, keepdim, dtype, block)


def rms_norm(
    x: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None, eps: float | None,
    block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMS norm over the last len(normalized_shape) dims -> (out in x's dtype, rstd [..., 1, ...] fp32).

    As `aten::_fused_rms_norm`: computed in fp32 (fp64 for fp64), rstd kept with unit dims. Each
    row depends only on itself and the weight, bitwise.
    """
    axis = x.dim() - len(normalized_shape)
    if axis < 0 or tuple(x.shape[axis:]) != tuple(normalized_shape):
        raise RuntimeError(f"rms_norm: input shape {tuple(x.shape)} does not end in {tuple(normalized_shape)}")
    if x.dtype not in FLOAT_DTYPES:
        raise RuntimeError(f"rms_norm: expected a floating-point input, got {x.dtype}")
    if weight is not None and tuple(weight.shape) != tuple(normalized_shape):
        raise RuntimeError(f"rms_norm: weight shape {tuple(weight.shape)} is not {tuple(normalized_shape)}")
    acc_torch = torch.float64 if x.dtype == torch.float64 else torch.float32
    if eps is None:
        eps = torch.finfo(acc_torch).eps  # torch's default: the machine epsilon of the compute dtype
    rows, _ = _as_rows(x, list(range(axis, x.dim())))  # [R, C]
    num_rows, length = rows.shape
    out = rows.new_empty(rows.shape)
    rstd = torch.empty(num_rows, dtype=acc_torch, device=x.device)
    w = weight.contiguous().view(-1) if weight is not None else None
    if num_rows and length:
        tiles = row_tiles(length)
        rms_norm_kernel[(num_rows,)](
            rows, w if w is not None else rows, out, rstd, length, rows.stride(0), out.stride(0), eps,
            BLOCK=block or tiles.block, HAS_WEIGHT=w is not None, ACC_DTYPE=_acc_dtype(x.dtype),
            FP64=x.dtype == torch.float64, num_warps=tiles.num_warps,
        )
    stat_shape = [*x.shape[:axis], *([1] * len(normalized_shape))]
    return out.view(x.shape), rstd.view(stat_shape)
