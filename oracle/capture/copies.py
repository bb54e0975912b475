"""Copies of an op call's inputs, taken before it runs: to run it again alone, or write it to repro/.

Same shapes, dtypes, strides and device; a paged KV cache is cut down to the blocks the call's
block table names (the table renumbered to match), so a 40 GB cache costs only what the call reads.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

BLOCK_TABLE_ARGS = ("block_table", "block_tables", "page_table")


@functools.cache
def arg_names(func: Any) -> tuple[str, ...]:
    """An op's argument names, from its schema (cached: asked on every captured op)."""
    return tuple(a.name for a in func._schema.arguments)


def named_args(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """An op call's arguments by their schema names."""
    named = dict(zip(arg_names(func), args, strict=False))
    if kwargs:
        named.update(kwargs)
    return named


def flat_leaves(tree: Any) -> list[Any]:
    """`tree_flatten(tree)[0]`, what an op call's arguments or results hold, in the same order: plain tuples, lists
    and dicts walked here, their subclasses (torch.Size, a named tuple, an OrderedDict) by pytree. An op's arguments
    hold no other container (pytree would also walk a deque, a leaf here).

    No closure and no reference cycle: the leaves are tensors, and the capture's bookkeeping (weak maps keyed by
    tensors) must see each one die when the model drops it, not when the cyclic garbage collector runs."""
    out: list[Any] = []
    stack: list[Any] = [tree]
    while stack:
        x = stack.pop()
        kind = type(x)
        if kind is tuple or kind is list:
            stack.extend(reversed(x))
        elif kind is dict:
            stack.extend(reversed(list(x.values())))
        elif isinstance(x, (tuple, list, dict)):
            out.extend(tree_flatten(x)[0])
        else:
            out.append(x)
    return out


# A copy larger than this is refused: confirming must not take the device's memory.
MAX_COPY_BYTES = 4 << 30


def _clone(t: torch.Tensor) -> torch.Tensor:
    """A copy with the same shape, dtype, strides and device (overlapping strides: a dense copy)."""
    try:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)
    except RuntimeError:
        return t.clone()


def block_table(named: dict[str, Any]) -> torch.Tensor | None:
    """A paged attention call's block table (its first tensor argument named like one), or None."""
    return next((named[n] for n in BLOCK_TABLE_ARGS if isinstance(named.get(n), torch.Tensor)), None)


def _compacted(named: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Replacements for a paged call's block table and caches: only the blocks the table names."""
    table = _integer_table(named)
    if table is None:
        return {}
    paged = _paged_caches(named, table)
    if not paged:
        return {}
    num_blocks = max(t.shape[0] for t in paged.values())
    used = torch.unique(table[table >= 0]).long()
    name = next(n for n in BLOCK_TABLE_ARGS if named.get(n) is table)
    out = {name: _clone(_renumbered(table, used, num_blocks))}
    out.update((a, t.index_select(0, used.to(t.device)).contiguous()) for a, t in paged.items()
               if t.shape[0] == num_blocks)
    return out


def _integer_table(named: dict[str, Any]) -> torch.Tensor | None:
    """The call's block table when it can name blocks: a non-empty 2-D integer tensor."""
    table = block_table(named)
    if table is None or table.dim() != 2 or table.is_floating_point() or not table.numel():
        return None
    return table


def _paged_caches(named: dict[str, Any], table: torch.Tensor) -> dict[str, torch.Tensor]:
    """The arguments the table indexes: float, 4 dims or more, more blocks than the table's top entry.

    A paged cache is [num_blocks, block_size, H, D], indexed by the table along dim 0. A query or output
    [T, H, D] is never one, however many tokens the pass holds (T may exceed the top block).
    """
    top = int(table.max().item())
    return {a: t for a, t in named.items() if isinstance(t, torch.Tensor) and t is not table
            and t.is_floating_point() and t.dim() >= 4 and t.shape[0] > top}


def _renumbered(table: torch.Tensor, used: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """`table` with block `used[i]` renamed `i` (the compacted caches hold the used blocks in order); -1 stays."""
    lut = torch.zeros(num_blocks, dtype=table.dtype, device=table.device)
    lut[used] = torch.arange(used.numel(), dtype=table.dtype, device=table.device)
    return torch.where(table >= 0, lut[table.clamp(min=0).long()], table)


def clone_inputs(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Copies of an op call's arguments, taken before it runs; RuntimeError when too large to copy."""
    named = named_args(func, args, kwargs)
    replaced = _compacted(named)
    by_id = {id(named[a]): t for a, t in replaced.items()}
    size = sum(t.numel() * t.element_size() for t in flat_leaves((args, kwargs))
               if isinstance(t, torch.Tensor) and id(t) not in by_id)
    if size > MAX_COPY_BYTES:
        raise RuntimeError(f"{size / 2**30:.1f} GiB of inputs, over the {MAX_COPY_BYTES >> 30} GiB limit")

    def copy(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return by_id[id(x)] if id(x) in by_id else _clone(x)
        return x

    return tuple(tree_map(copy, list(args))), {k: tree_map(copy, v) for k, v in kwargs.items()}
