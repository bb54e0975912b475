"""Canonical row tiles: the one mechanism behind every CPU kernel of this package.

torch's CPU kernels pick their code path from the shape of the call (MKL's gemm has separate
paths for M=1, M<4 and M>=4; reductions split the reduced dim over threads when there are
few output rows). `map_row_tiles` hides the caller's row count from them: it calls a kernel
only on tiles of exactly `tile` rows, zero-padding the last one, so every call a row goes
through has the same shape. What remains, that a row's result does not depend on where it
sits inside a tile or on what the other rows hold, is checked by the tests at every position.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

# kernel(input_tiles, out_tile): every tensor has exactly `tile` rows; writes out_tile in place.
TileKernel = Callable[[Sequence[torch.Tensor], torch.Tensor], None]


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """A contiguous copy of `x` [r, ...] grown to [rows, ...] with zero rows (r <= rows)."""
    # constant_pad_nd pads the last dims first (dim 0 is the final pair) and keeps x's strides, so a
    # strided x still needs the copy that makes it contiguous.
    return torch.constant_pad_nd(x, [0, 0] * (x.dim() - 1) + [0, rows - x.shape[0]], 0).contiguous()


def map_row_tiles(
    kernel: TileKernel, inputs: Sequence[torch.Tensor], row_shape: Sequence[int], dtype: torch.dtype, tile: int
) -> torch.Tensor:
    """[R, *row_shape] of `dtype`, filled by calling `kernel` on row tiles of exactly `tile` rows.

    inputs: contiguous tensors [R, ...] whose row r contributes only to row r of the result. When R
    is not a multiple of `tile` they are zero-padded to the next one (a contiguous copy), so every
    tile, the last included, is a contiguous view of `tile` rows and the kernel never sees a shape
    that depends on R. The result is the first R rows of the padded output.
    """
    num_rows = inputs[0].shape[0]
    padded_rows = -(-num_rows // tile) * tile
    if padded_rows != num_rows:
        inputs = [pad_rows(x, padded_rows) for x in inputs]
    out = inputs[0].new_empty((padded_rows, *row_shape), dtype=dtype)
    for start in range(0, padded_rows, tile):
        rows = slice(start, start + tile)
        kernel([x[rows] for x in inputs], out[rows])
    return out if padded_rows == num_rows else out[:num_rows]
