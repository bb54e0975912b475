"""Per-op capture of Hugging Face models (oracle.capture): forward hooks name the modules, and each
top-level forward that holds the target is a pass."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from typing import Any, Protocol, TypeGuard

import torch

from oracle.capture.rows import Grid, PassLayout, RowCapture
from oracle.engines.contract import (
    Completion,
    Engine,
    LaysOutPasses,
    ResetsPrefixCache,
    RunSpec,
    capabilities,
)


def _matrix(t: Any) -> TypeGuard[torch.Tensor]:
    """A `[B, S]` tensor."""
    return isinstance(t, torch.Tensor) and t.dim() == 2


def _target_tokens(kwargs: dict[str, Any], target_index: int, s_size: int) -> tuple[list[bool], list[int]] | None:
    """Which of the `s_size` columns of row `target_index` hold a token (not padding), and each column's
    position: from `position_ids` when given, else from the attention mask's running count; None with neither."""
    mask, pos = kwargs.get("attention_mask"), kwargs.get("position_ids")
    valid = [bool(v) for v in mask[target_index, -s_size:].tolist()] if _matrix(mask) else [True] * s_size
    if _matrix(pos):
        return valid, [int(p) for p in pos[min(target_index, pos.shape[0] - 1)].tolist()]
    if _matrix(mask):
        return valid, [int(p) - 1 for p in mask[target_index].cumsum(-1)[-s_size:].tolist()]
    return None


def hf_layout(forward_pass: int, kwargs: dict[str, Any], target_index: int) -> PassLayout | None:
    """The target's tokens in a Hugging Face forward over `[B, S]` inputs (left padding allowed).

    Positions come from `position_ids` when given, else from the attention mask's running count.
    """
    ids = kwargs.get("input_ids")
    if not _matrix(ids) or target_index >= ids.shape[0]:
        return None
    b_size, s_size = ids.shape
    found = _target_tokens(kwargs, target_index, s_size)
    if found is None:
        return None
    valid, positions = found
    cols = [s for s in range(s_size) if valid[s]]
    mask = kwargs.get("attention_mask")
    num_tokens = int(mask[:, -s_size:].sum()) if _matrix(mask) else b_size * s_size
    evidence = {"num_seqs": b_size, "num_tokens": num_tokens, "target_slot": target_index,
                "target_num_tokens": len(cols), "target_is_prefill": forward_pass == 0 or s_size > 1,
                "padded_width": s_size}
    return PassLayout(forward_pass, forward_pass, _padded_grids(b_size, s_size, target_index, cols, positions),
                      evidence)


def _padded_grids(b_size: int, s_size: int, target_index: int, cols: list[int],
                  positions: list[int]) -> tuple[Grid, ...]:
    """The target's row `target_index`, columns `cols`, in each shape a padded forward's tensors take."""
    at = tuple(positions[s] for s in cols)
    grids = [Grid((b_size, s_size), tuple((target_index, s) for s in cols), at)]  # [B, S, ...]
    if s_size > 1 and cols:  # generate keeps only the last position's logits: [B, 1, vocab]
        grids.append(Grid((b_size, 1), ((target_index, 0),), (positions[cols[-1]],)))
    # Linear layers flatten [B, S, in] to [B * S, in] around their matmul.
    grids.append(Grid((b_size * s_size,), tuple((target_index * s_size + s,) for s in cols), at))
    return tuple(grids)


class HFEngine(Engine, Protocol):
    """An engine over a Hugging Face module (`model`): what `capture_hf` drives."""

    model: torch.nn.Module


def _layout_of(engine: HFEngine) -> Callable[[int, dict[str, Any], int], PassLayout | None]:
    """`hf_layout`, or the engine's own `localize_layout` where it lays its rows out otherwise (packed, one row
    per request) and says so."""
    if capabilities(engine).localize_layout and isinstance(engine, LaysOutPasses):
        return engine.localize_layout
    return hf_layout


def _scope_hooks(model: torch.nn.Module, stack: list[str]) -> list[Any]:
    """Hooks on every submodule that keep `stack` the qualified names of the modules running now (innermost
    last); the handles, to remove them."""

    def push(name: str) -> Callable[..., None]:
        return lambda module, args: stack.append(name)

    def pop(module: torch.nn.Module, args: Any, output: Any) -> None:
        if stack:
            stack.pop()

    handles = []
    for name, module in model.named_modules():
        if name:
            handles.append(module.register_forward_pre_hook(push(name)))
            handles.append(module.register_forward_hook(pop, always_call=True))
    return handles


def _generate(engine: HFEngine, run: RunSpec) -> list[Completion]:
    """`run`'s requests, from a cold prefix cache where the engine can reset it, after its warm-up requests."""
    if capabilities(engine).reset_prefix_cache and isinstance(engine, ResetsPrefixCache):
        engine.reset_prefix_cache()
    if run.warm_with:
        engine.generate(run.warm_with)
    return engine.generate(run.requests, run.max_num_batched_tokens)


def capture_hf(engine: HFEngine, run: RunSpec, rows: RowCapture) -> Completion:
    """Hooks on `engine.model`: every submodule's qualified name is the scope; the top forward is a pass.

    Where the target's tokens sit in a forward comes from `hf_layout` (`input_ids` [B, S], row
    `target_index`), or from the engine's `localize_layout` when it declares one
    (`oracle.engines.contract.LaysOutPasses`).
    """
    model = engine.model
    stack: list[str] = []
    rows.module_path = lambda: stack[-1] if stack else ""
    capture = rows
    counter = itertools.count()
    active: list[contextlib.ExitStack] = []
    layout_of = _layout_of(engine)

    def begin(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        layout = layout_of(next(counter), {**kwargs, **({"input_ids": args[0]} if args else {})},
                           run.target_index)
        if layout is None:
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        exits = contextlib.ExitStack()
        exits.enter_context(capture.forward_pass(layout, (ids,) if isinstance(ids, torch.Tensor) else ()))
        active.append(exits)

    def end(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if active:
            active.pop().close()

    handles = [model.register_forward_pre_hook(begin, with_kwargs=True),
               model.register_forward_hook(end, with_kwargs=True, always_call=True),
               *_scope_hooks(model, stack)]
    try:
        out = _generate(engine, run)
    finally:
        for h in handles:
            h.remove()
        while active:
            active.pop().close()
    return out[run.target_index]
