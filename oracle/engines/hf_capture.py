"""Per-op capture of Hugging Face models (oracle.capture): forward hooks name the modules, and each
top-level forward that holds the target is a pass."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from typing import Any, Protocol

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


def hf_layout(forward_pass: int, kwargs: dict[str, Any], target_index: int) -> PassLayout | None:
    """The target's tokens in a Hugging Face forward over `[B, S]` inputs (left padding allowed).

    Positions come from `position_ids` when given, else from the attention mask's running count.
    """
    ids = kwargs.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or target_index >= ids.shape[0]:
        return None
    b_size, s_size = ids.shape
    mask = kwargs.get("attention_mask")
    pos = kwargs.get("position_ids")
    valid = [True] * s_size
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        valid = [bool(v) for v in mask[target_index, -s_size:].tolist()]
    if isinstance(pos, torch.Tensor) and pos.dim() == 2:
        positions = [int(p) for p in pos[min(target_index, pos.shape[0] - 1)].tolist()]
    elif isinstance(mask, torch.Tensor) and mask.dim() == 2:
        positions = [int(p) - 1 for p in mask[target_index].cumsum(-1)[-s_size:].tolist()]
    else:
        return None
    cols = [s for s in range(s_size) if valid[s]]
    grids = [Grid((b_size, s_size), tuple((target_index, s) for s in cols), tuple(positions[s] for s in cols))]
    if s_size > 1 and cols:  # generate keeps only the last position's logits: [B, 1, vocab]
        grids.append(Grid((b_size, 1), ((target_index, 0),), (positions[cols[-1]],)))
    # Linear layers flatten [B, S, in] to [B * S, in] around their matmul.
    grids.append(Grid((b_size * s_size,), tuple((target_index * s_size + s,) for s in cols),
                      tuple(positions[s] for s in cols)))
    num_tokens = int(mask[:, -s_size:].sum()) if isinstance(mask, torch.Tensor) and mask.dim() == 2 else b_size * s_size
    evidence = {"num_seqs": b_size, "num_tokens": num_tokens, "target_slot": target_index,
                "target_num_tokens": len(cols), "target_is_prefill": forward_pass == 0 or s_size > 1,
                "padded_width": s_size}
    return PassLayout(forward_pass, forward_pass, tuple(grids), evidence)


class HFEngine(Engine, Protocol):
    """An engine over a Hugging Face module (`model`): what `capture_hf` drives."""

    model: torch.nn.Module


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
    handles: list[Any] = []

    # An engine that lays its rows out otherwise (packed, one row per request) says where the target is.
    layout_of = hf_layout
    if capabilities(engine).localize_layout and isinstance(engine, LaysOutPasses):
        layout_of = engine.localize_layout

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

    def push(name: str) -> Callable[..., None]:
        return lambda module, args: stack.append(name)

    def pop(module: torch.nn.Module, args: Any, output: Any) -> None:
        if stack:
            stack.pop()

    handles.append(model.register_forward_pre_hook(begin, with_kwargs=True))
    handles.append(model.register_forward_hook(end, with_kwargs=True, always_call=True))
    for name, module in model.named_modules():
        if name:
            handles.append(module.register_forward_pre_hook(push(name)))
            handles.append(module.register_forward_hook(pop, always_call=True))
    try:
        if capabilities(engine).reset_prefix_cache and isinstance(engine, ResetsPrefixCache):
            engine.reset_prefix_cache()
        if run.warm_with:
            engine.generate(run.warm_with)
        out = engine.generate(run.requests, run.max_num_batched_tokens)
    finally:
        for h in handles:
            h.remove()
        while active:
            active.pop().close()
    return out[run.target_index]
