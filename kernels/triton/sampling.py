"""A sampled row's outputs in one read of its logits: token, log-probability and top-2, on CUDA.

For logits [R, C] float32, program r walks row r once in blocks of `block` lanes (config.row_tiles,
as reduction.py) and writes out[r] = [token, logprob bits, top-1 bits, top-2 bits] (int64 [R, 4], a
float32's bits as an int32 widened with its sign, the columns of oracle/engines/native/sampler.py):

- token: the row's argmax as torch.argmax on CUDA computes it (NaN is the largest value and the first
  NaN wins; otherwise the first index of the maximum, -0.0 and +0.0 equal), or the row's entry of
  `drawn` where that is >= 0 (a token drawn by seeded sampling).
- logprob: log_softmax(row)[token], bitwise what reduction.log_softmax writes there. The running max
  and sum of exponentials per lane, the tree reductions over the lanes and the final formula are
  reduction.softmax_kernel's pass 1 and its LOG branch, copied. This file MUST mirror that kernel:
  tests/unit/triton_interpreter_sampling_cases.py compares the bits with reduction.log_softmax and
  fails on any drift, and tests/unit/test_kernels_triton_sampling_layout.py checks that the compiler
  gives the sum the same register layout (so the same tree); tests/gpu/test_sampling_cuda.py, the bits.
- top-2: torch.topk(row, 2).values: the largest two entries, duplicates kept ([5, 5] for two 5s), in
  the order of torch's radix select (NaN above +inf, +0.0 above -0.0), in every row whatever the number
  of rows. torch.topk itself does not keep that order for a -0.0/+0.0 tie (a single 151,936-wide row came
  back [-0.0, +0.0] on an H100, torch 2.11), so there the two paths may differ. Which NaN's payload comes back
  when a row holds several NaNs is not specified (nor is it by torch).

Nothing depends on R: row r's outputs are a function of row r alone, bitwise.
"""

from __future__ import annotations

import torch

from .config import row_tiles
from .language import tl, triton

# A constexpr, so that the kernels see an int32 (a literal -2147483648 would be typed from 2147483648).
_INT32_MIN = tl.constexpr(-(2**31))


@triton.jit
def _order_key(bits):
    """float32 bits (int32) -> an int32 whose signed order is torch's radix order; every NaN -> INT32_MAX."""
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negative floats: flip the magnitude so larger is larger
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return tl.where(is_nan, 0x7FFFFFFF, key)


@triton.jit
def _pick(lanes, lane, values):
    """values[lane] of an int32 [BLOCK] tensor (exact: a max over one real entry and INT32_MIN)."""
    return tl.max(tl.where(lanes == lane, values, _INT32_MIN), axis=0)


@triton.jit
def sampled_rows_kernel(
    x_ptr, drawn_ptr, out_ptr, C, stride_x,
    BLOCK: tl.constexpr, HAS_DRAWN: tl.constexpr,
):
    """out[r] = [token, logprob, top-1, top-2] of row r (see the module docstring); program r owns row r."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    lanes = tl.arange(0, BLOCK)
    # reduction.softmax_kernel's pass 1 (ACC_DTYPE fp32): per lane, the running max m and sum s.
    m = tl.full((BLOCK,), float("-inf"), tl.float32)
    s = tl.zeros((BLOCK,), tl.float32)
    # Per lane: the argmax so far (value, column) and the top-2 so far (order keys and bits).
    best = tl.full((BLOCK,), float("-inf"), tl.float32)
    best_col = lanes
    k1 = tl.full((BLOCK,), _INT32_MIN, tl.int32)
    k2 = tl.full((BLOCK,), _INT32_MIN, tl.int32)
    b1 = tl.zeros((BLOCK,), tl.int32)
    b2 = tl.zeros((BLOCK,), tl.int32)
    for c0 in range(0, C, BLOCK):
        cols = c0 + lanes
        valid = cols < C
        x = tl.load(x_row + cols, mask=valid, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - shift) + tl.exp(x - shift)
        m = m_new
        # Strictly better only, so a lane keeps its first maximum (a NaN beats any number).
        better = (x > best) | ((x != x) & (best == best))
        best = tl.where(better, x, best)
        best_col = tl.where(better, cols, best_col)
        bits = x.to(tl.int32, bitcast=True)
        key = tl.where(valid, _order_key(bits), _INT32_MIN)
        up1 = key > k1
        up2 = key > k2
        k2 = tl.where(up1, k1, tl.where(up2, key, k2))
        b2 = tl.where(up1, b1, tl.where(up2, bits, b2))
        k1 = tl.where(up1, key, k1)
        b1 = tl.where(up1, bits, b1)
    # reduction.softmax_kernel's row max, sum and log, as written there.
    row_max = tl.max(m, axis=0)
    row_shift = tl.where(row_max == float("-inf"), 0.0, row_max)
    total = tl.sum(s * tl.exp(m - row_shift), axis=0)
    log_total = tl.log(total)
    # Argmax across lanes: the first NaN if any, else the first column holding the maximum. A lane
    # past C holds column >= C, after every real column, so an all -inf row gives column 0.
    lane_nan = best != best
    nan_col = tl.min(tl.where(lane_nan, best_col, C), axis=0)
    top = tl.max(tl.where(lane_nan, float("-inf"), best), axis=0)
    max_col = tl.min(tl.where(best == top, best_col, C + BLOCK), axis=0)
    token = tl.where(tl.max(lane_nan.to(tl.int32), axis=0) > 0, nan_col, max_col).to(tl.int64)
    if HAS_DRAWN:
        drawn = tl.load(drawn_ptr + row)
        token = tl.where(drawn >= 0, drawn, token)
    # reduction.softmax_kernel's LOG formula for the token's column.
    x_token = tl.load(x_row + token).to(tl.float32)
    logprob = (x_token - row_shift) - log_total
    # Top-2 across lanes: the winning lane's first, then the best of its second and the others' firsts.
    top1_key = tl.max(k1, axis=0)
    lane1 = tl.min(tl.where(k1 == top1_key, lanes, BLOCK), axis=0)
    top1 = _pick(lanes, lane1, b1)
    rest_k = tl.where(lanes == lane1, k2, k1)
    rest_b = tl.where(lanes == lane1, b2, b1)
    top2_key = tl.max(rest_k, axis=0)
    lane2 = tl.min(tl.where(rest_k == top2_key, lanes, BLOCK), axis=0)
    top2 = tl.where(top2_key == _INT32_MIN, top1, _pick(lanes, lane2, rest_b))  # C == 1: [x, x]
    out_row = out_ptr + row * 4
    tl.store(out_row, token)
    tl.store(out_row + 1, logprob.to(tl.int32, bitcast=True).to(tl.int64))
    tl.store(out_row + 2, top1.to(tl.int64))
    tl.store(out_row + 3, top2.to(tl.int64))


def sampled_rows(logits: torch.Tensor, drawn: torch.Tensor | None = None, block: int | None = None) -> torch.Tensor:
    """[R, 4] int64 (token, logprob, top-1, top-2 bits) of `logits` [R, C] float32; see the module docstring.

    `drawn` [R] int64: the token of rows sampled elsewhere, -1 where the row takes its argmax.
    `block`: tests only (it must be the block reduction.log_softmax uses for the logprob to match).
    """
    if logits.dim() != 2 or logits.dtype != torch.float32 or logits.shape[1] == 0:
        raise ValueError(f"sampled_rows: expected [R, C >= 1] float32 logits, got {tuple(logits.shape)} {logits.dtype}")
    if drawn is not None and (drawn.shape != logits.shape[:1] or drawn.dtype != torch.int64):
        raise ValueError(f"sampled_rows: expected [R] int64 drawn tokens, got {tuple(drawn.shape)} {drawn.dtype}")
    rows = logits if logits.stride(1) == 1 else logits.contiguous()
    num_rows, length = rows.shape
    out = torch.empty((num_rows, 4), dtype=torch.int64, device=rows.device)
    if num_rows:
        tiles = row_tiles(length)
        sampled_rows_kernel[(num_rows,)](
            rows, drawn if drawn is not None else out, out, length, rows.stride(0),
            BLOCK=block or tiles.block, HAS_DRAWN=drawn is not None, num_warps=tiles.num_warps,
        )
    return out
