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
    padded = x.new_zeros((rows, *x.shape[1:]))
    padded[: x.shape[0]] = x
    return padded


def map_row_tiles(kernel: TileKernel, inputs: Sequence[torch.Tensor], out: torch.Tensor, tile: int) -> torch.Tensor:
    """Fill `out` [R, ...] by calling `kernel` on row tiles of exactly `tile` rows.

    inputs: tensors [R, ...] whose row r contributes only to row r of `out`. Full tiles are
    passed as views; the last partial tile is zero-padded on the way in and trimmed on the
    way out, so the kernel never sees a shape that depends on R. Returns `out`.
    """
    num_rows = out.shape[0]
    full = num_rows // tile
    for i in range(full):
        rows = slice(i * tile, (i + 1) * tile)
        kernel([x[rows] for x in inputs], out[rows])
    tail = num_rows - full * tile
    if tail:
        rows = slice(full * tile, num_rows)
        scratch = out.new_empty((tile, *out.shape[1:]))
        kernel([pad_rows(x[rows], tile) for x in inputs], scratch)
        out[rows] = scratch[:tail]
    return out
