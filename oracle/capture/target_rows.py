"""The target's rows of a tensor: of one the pass lays out row by row (`select_rows`, by its `Grid`), and of the KV
cache, at the target's own slots (`kv_rows`) or through its block table (`kv_place`, `is_paged_cache`)."""

from __future__ import annotations

from typing import Any, TypeGuard

import torch

from oracle.capture.copies import flat_leaves
from oracle.engines.contract import Grid, PassLayout


def select_rows(t: torch.Tensor, grid: Grid) -> torch.Tensor | None:
    """The target's rows of `t` as [n, ...], or None when `t` is not laid out on `grid`."""
    if t.dim() == 0 or not grid.rows:
        return None
    return _flat_rows(t, grid) if len(grid.shape) == 1 else _batch_rows(t, grid)


def _flat_rows(t: torch.Tensor, grid: Grid) -> torch.Tensor | None:
    """A `(T,)` grid: rows along dim 0."""
    if t.shape[0] != grid.shape[0]:
        return None
    first, last = grid.rows[0][0], grid.rows[-1][0]
    if last - first == len(grid.rows) - 1:  # a sequence's tokens are contiguous in the flattened layout
        return t.narrow(0, first, len(grid.rows))
    return t.index_select(0, torch.tensor([r[0] for r in grid.rows], device=t.device))


def _batch_rows(t: torch.Tensor, grid: Grid) -> torch.Tensor | None:
    """A `(B, S)` grid: sequences along dim 0, tokens along dim 1, or dim 2 inside attention (`[B, H, S, ...]`)."""
    b_size, s_size = grid.shape
    if t.dim() < 2 or t.shape[0] != b_size:
        return None
    on_dim1 = t.shape[1] == s_size
    on_dim2 = t.dim() >= 4 and t.shape[2] == s_size
    if on_dim1 == on_dim2:  # neither, or ambiguous (H == S)
        return None
    dim = 1 if on_dim1 else 2
    return torch.stack([t[b].select(dim - 1, s) for b, s in grid.rows])


def fits(t: torch.Tensor, layout: PassLayout) -> bool:
    for g in layout.grids:
        if len(g.shape) == 1 and t.dim() > 0 and t.shape[0] == g.shape[0]:
            return True
        if len(g.shape) == 2 and t.dim() >= 2 and t.shape[0] == g.shape[0] and g.shape[1] in tuple(t.shape[1:3]):
            return True
    return False


def row_base(t: torch.Tensor, layout: PassLayout) -> torch.Tensor | None:
    """A slice written in place changes its row-aligned base: that base, or None."""
    base = t._base
    return base if isinstance(base, torch.Tensor) and fits(base, layout) else None


def kv_place(layout: PassLayout) -> tuple[int, int, int] | None:
    """(seq_index, kv_len, block_size): where the target's KV sits in a paged cache, when the engine said."""
    seq, n, bs = layout.seq_index, layout.kv_len, layout.block_size
    return (seq, n, bs) if seq is not None and n is not None and bs else None


def is_paged_cache(t: Any, table: torch.Tensor, block_size: int) -> TypeGuard[torch.Tensor]:
    """A float `[num_blocks, block_size, H, D]` argument beside the block table: a paged KV cache."""
    return (isinstance(t, torch.Tensor) and t is not table and t.is_floating_point() and t.dim() == 4
            and t.shape[1] == block_size)


def kv_slots(args: Any, kwargs: dict[str, Any], grid: Grid) -> torch.Tensor | None:
    """The target's cache slots in a KV write: its rows of the call's row-aligned integer index argument."""
    if len(grid.shape) != 1:
        return None
    slots = next((t for t in flat_leaves((args, kwargs)) if _is_index(t, grid.shape[0])), None)
    if slots is None:
        return None
    mine = select_rows(slots, grid)
    return mine if mine is not None and mine.numel() else None


def _is_index(t: Any, length: int) -> TypeGuard[torch.Tensor]:
    """A 1-D integer tensor of `length` entries (not a mask)."""
    return (isinstance(t, torch.Tensor) and t.dim() == 1 and not t.is_floating_point() and t.dtype != torch.bool
            and t.shape[0] == length)


def kv_rows(cache: torch.Tensor, args: Any, kwargs: dict[str, Any], grid: Grid,
            block_size: int | None) -> torch.Tensor | None:
    """The target's rows of `cache` as a KV write left them: `[n, ...]` at its own slots, or None."""
    mine = kv_slots(args, kwargs, grid)
    if mine is None:
        return None
    flat = _slot_view(cache, int(mine.max().item()), block_size)
    if flat is None:
        return None
    return flat.index_select(0, mine.to(flat.device).long())


def _slot_view(cache: torch.Tensor, max_slot: int, block_size: int | None) -> torch.Tensor | None:
    """`cache` as `[slots, ...]`: a flat `[slots, H, D]` view as it is, a paged `[num_blocks, block_size, H, D]`
    one flattened; None when neither fits."""
    if cache.dim() == 4 and (block_size is None or cache.shape[1] == block_size):
        flat = cache.flatten(0, 1)
        return flat if flat.shape[0] > max_slot else None
    if cache.dim() in (2, 3) and cache.shape[0] > max_slot:
        return cache
    return None
