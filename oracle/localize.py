"""Name the first operator whose output changed for a target: where a divergence starts, inside the model.

A failing trial says *that* a target's bits moved; this module says *where*. It reruns the target
twice on an engine in our process, once as the expected run (alone) and once as the failing run
(the trial), with a `TorchDispatchMode` that copies, for every aten op of every forward pass, the
output rows that belong to the target. Rows are keyed by (module path, op, occurrence of that op in
that module within the pass, the target's token position), so the two runs line up by token
position even when the prompt was chunked differently. Walking the failing run in execution order,
the first op call whose rows differ bitwise from the expected run's rows at the same positions is
the answer; its row-aligned inputs are checked to have been equal (the root-cause rule: the first
op that changed what it was given equal). Capture is by row, never by hashing whole tensors.

What counts as a "row": a tensor derived from the pass's token inputs (tracked by identity, so
weights and caches never match by accident) whose leading dimension is the pass's token count
(the native engine's flattened `[num_tokens, ...]` layout; `[R, ...]` after the logits rows are
picked), or whose `[B, S]` / `[B, H, S]` dimensions are the batch and sequence of a Hugging Face
forward. Views only pass the row identity on; ops whose outputs are not row-aligned are skipped.

Entry points: `localize_trial` (what the runner calls for a failing trial), `localize_runs` (any
two runs: prefill vs decode, cold vs warm cache) and `localize_from_report` (`oracle localize`).
"""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from oracle.compare import first_divergence
from oracle.engines.base import Completion, Mode, Request
from oracle.errors import EngineError
from oracle.execute import RunSpec

if TYPE_CHECKING:
    from oracle.engines.native.engine import NativeEngine
    from oracle.engines.native.model import StepInputs
    from oracle.engines.native.scheduler import ScheduledSeq

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")

# (module path, op name, occurrence of that op in that module within its pass)
OpKey = tuple[str, str, int]


@dataclass(frozen=True)
class LocalizedOp:
    """The first op whose output rows for the target differ between the expected and the failing run.

    `positions`: the target's token positions whose rows differ in that op call; `shape`: the op's
    full output shape in the failing run; `ulp`: the largest distance between differing elements
    on the ordered integer line of their bit patterns (None for non-float outputs); `inputs_equal`:
    whether every row-aligned input of that call was bitwise equal in both runs (None when an input
    could not be checked); `pass_evidence`: what shared that forward pass with the target;
    `eager`: True when the rerun was forced eager where production is compiled (vLLM), None where the
    engine only runs eagerly; `still_diverged`: whether the captured rerun's outputs still differed.
    """

    module: str
    op: str
    layer: int | None
    forward_pass: int
    engine_step: int | None
    positions: tuple[int, ...]
    shape: tuple[int, ...]
    ulp: int | None
    max_abs_diff: float | None
    inputs_equal: bool | None
    pass_evidence: dict[str, Any] = field(default_factory=dict)
    eager: bool | None = None
    still_diverged: bool = True
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["positions"] = list(self.positions)
        d["shape"] = list(self.shape)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LocalizedOp:
        return cls(**{**d, "positions": tuple(d["positions"]), "shape": tuple(d["shape"])})

    def describe(self) -> str:
        """One line for the console, junit and a pytest failure message."""
        layer = f" (layer {self.layer})" if self.layer is not None else ""
        where = f"pass {self.forward_pass}" + (f", step {self.engine_step}" if self.engine_step is not None else "")
        size = f"{self.ulp} ULP" if self.ulp is not None else "differs"
        if self.max_abs_diff is not None:
            size += f", max abs {self.max_abs_diff:.3g}"
        inputs = {True: "inputs equal", False: "inputs differed", None: "inputs unchecked"}[self.inputs_equal]
        ev = self.pass_evidence
        shared = ", ".join(f"{k} {ev[k]}" for k in ("num_seqs", "num_tokens", "num_prefill_tokens",
                                                     "num_decode_tokens") if k in ev)
        kind = ("prefill" if ev.get("target_is_prefill") else "decode") if "target_is_prefill" in ev else ""
        line = (f"{self.module or '<model>'} {self.op}{layer} at {where}, positions {_ranges(self.positions)}, "
                f"shape {list(self.shape)}: {size}, {inputs}; pass: {', '.join(x for x in (kind, shared) if x)}")
        if self.eager:
            line += "; rerun eager" + ("" if self.still_diverged else " (no longer diverged)")
        elif not self.still_diverged:
            line += "; the rerun's outputs did not diverge"
        return line + (f"; {self.note}" if self.note else "")


# ---------------------------------------------------------------------------------------------
# What one forward pass looks like to the capture


@dataclass(frozen=True)
class Grid:
    """A token layout of a pass and where the target's tokens sit in it.

    `shape` is `(T,)` for a flattened layout (rows along dim 0) or `(B, S)` for a batch of
    sequences; `rows[i]` indexes into it (a 1- or 2-tuple) and holds token `positions[i]`.
    """

    shape: tuple[int, ...]
    rows: tuple[tuple[int, ...], ...]
    positions: tuple[int, ...]


@dataclass(frozen=True)
class PassLayout:
    forward_pass: int
    engine_step: int | None
    grids: tuple[Grid, ...]  # tried in order; the first that fits a tensor's shape wins
    evidence: dict[str, Any]


@dataclass
class OpCall:
    """One captured op call: the target's rows of its output, in execution order."""

    index: int
    forward_pass: int
    key: OpKey
    positions: tuple[int, ...]
    rows: torch.Tensor  # [n, *row_shape], on the CPU
    shape: tuple[int, ...]
    inputs: tuple[OpKey, ...]  # producers of its row-aligned inputs


def _select_rows(t: torch.Tensor, grid: Grid) -> torch.Tensor | None:
    """The target's rows of `t` as [n, ...], or None when `t` is not laid out on `grid`."""
    if t.dim() == 0 or not grid.rows:
        return None
    if len(grid.shape) == 1:
        if t.shape[0] != grid.shape[0]:
            return None
        first, last = grid.rows[0][0], grid.rows[-1][0]
        if last - first == len(grid.rows) - 1:  # a sequence's tokens are contiguous in the flattened layout
            return t.narrow(0, first, len(grid.rows))
        return t.index_select(0, torch.tensor([r[0] for r in grid.rows], device=t.device))
    b_size, s_size = grid.shape
    if t.dim() < 2 or t.shape[0] != b_size:
        return None
    on_dim1 = t.shape[1] == s_size
    on_dim2 = t.dim() >= 4 and t.shape[2] == s_size  # [B, H, S, ...] inside attention
    if on_dim1 == on_dim2:  # neither, or ambiguous (H == S)
        return None
    dim = 1 if on_dim1 else 2
    return torch.stack([t[b].select(dim - 1, s) for b, s in grid.rows])


class RowCapture(TorchDispatchMode):
    """Records the target's rows of every row-aligned aten op output while a pass is active.

    `module_path()` names the innermost module the model is in (a scope stack the model keeps).
    """

    def __init__(self, module_path: Callable[[], str]) -> None:
        super().__init__()
        self.module_path = module_path
        self.calls: list[OpCall] = []
        self.passes: list[PassLayout] = []
        self._layout: PassLayout | None = None
        self._producer: WeakIdKeyDictionary = WeakIdKeyDictionary()  # tensor -> OpKey of what made it
        self._counts: dict[tuple[str, str], int] = {}

    @contextlib.contextmanager
    def forward_pass(self, layout: PassLayout, inputs: Sequence[torch.Tensor]) -> Iterator[None]:
        """Capture one pass; `inputs` are its token-aligned inputs (ids, positions): rows start there."""
        self._layout = layout
        self._counts = {}
        self.passes.append(layout)
        for t in inputs:
            self._record(("", "input", self._count("", "input")), t, ())
        try:
            with self:
                yield
        finally:
            self._layout = None

    def _count(self, module: str, op: str) -> int:
        n = self._counts.get((module, op), 0)
        self._counts[(module, op)] = n + 1
        return n

    def _record(self, key: OpKey, t: torch.Tensor, inputs: tuple[OpKey, ...]) -> bool:
        assert self._layout is not None
        for grid in self._layout.grids:
            rows = _select_rows(t, grid)
            if rows is not None:
                self._producer[t] = key
                self.calls.append(OpCall(len(self.calls), self._layout.forward_pass, key, grid.positions,
                                         rows.detach().to("cpu", copy=True), tuple(t.shape), inputs))
                return True
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self._layout is None:
            return out
        module = self.module_path()
        name = str(func)
        occurrence = self._count(module, name)
        flat_in, _ = tree_flatten((args, kwargs))
        producers = tuple(dict.fromkeys(
            p for t in flat_in if isinstance(t, torch.Tensor) and (p := self._producer.get(t)) is not None))
        if not producers:
            return out
        flat_out = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)] or _written(func, args, kwargs)
        for j, t in enumerate(flat_out):
            key: OpKey = (module, name if len(flat_out) == 1 else f"{name}[{j}]", occurrence)
            if out is not None and func._schema.is_mutable and t not in self._producer:
                continue  # a write into a buffer that holds no rows (the KV cache): not the target's rows
            if getattr(func, "is_view", False) and len(producers) == 1:
                # A view holds the same values as its base: pass the base's identity on.
                if _fits(t, self._layout):
                    self._producer[t] = producers[0]
                continue
            self._record(key, t, producers)
        return out


def _written(func: Any, args: Any, kwargs: Any) -> list[torch.Tensor]:
    """The tensors an op that returns nothing writes into (an `out`/`output` argument, as vLLM's attention)."""
    named = dict(zip((a.name for a in func._schema.arguments), args, strict=False)) | dict(kwargs or {})
    return [t for a in func._schema.arguments
            if a.alias_info is not None and a.alias_info.is_write and isinstance(t := named.get(a.name), torch.Tensor)]


def _fits(t: torch.Tensor, layout: PassLayout) -> bool:
    for g in layout.grids:
        if len(g.shape) == 1 and t.dim() > 0 and t.shape[0] == g.shape[0]:
            return True
        if len(g.shape) == 2 and t.dim() >= 2 and t.shape[0] == g.shape[0] and g.shape[1] in tuple(t.shape[1:3]):
            return True
    return False


@dataclass(frozen=True)
class Captured:
    """Everything one captured run produced."""

    calls: tuple[OpCall, ...]
    passes: tuple[PassLayout, ...]
    completion: Completion

    def rows_at(self) -> dict[tuple[OpKey, int], tuple[OpCall, int]]:
        """(op key, position) -> (the call, its row index): where to find each position's row."""
        index: dict[tuple[OpKey, int], tuple[OpCall, int]] = {}
        for call in self.calls:
            for i, pos in enumerate(call.positions):
                index.setdefault((call.key, pos), (call, i))
        return index


# ---------------------------------------------------------------------------------------------
# Comparing two captured runs


def _int_view(t: torch.Tensor) -> torch.Tensor:
    """The bit patterns of a float tensor as signed ints of the same width (ints stay as they are)."""
    if not t.is_floating_point():
        return t
    ints = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}
    return t.view(ints[t.element_size()])


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool | None:
    """Bitwise equality; None when the two rows cannot be compared (shape or dtype differs)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return None
    return bool(torch.equal(_int_view(a), _int_view(b)))


def _ulp(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """Largest distance between elements on the ordered integer line of their bit patterns."""
    if not a.is_floating_point() or a.shape != b.shape:
        return None
    top = 1 << (8 * a.element_size() - 1)

    def ordered(t: torch.Tensor) -> torch.Tensor:
        bits = _int_view(t).to(torch.int64)
        return torch.where(bits < 0, -(bits + top), bits)  # -0.0 and 0.0 both map to 0

    return int((ordered(a) - ordered(b)).abs().max().item()) if a.numel() else 0


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float | None:
    if not a.is_floating_point() or a.shape != b.shape or not a.numel():
        return None
    return float((a.to(torch.float64) - b.to(torch.float64)).abs().max().item())


def first_differing_op(expected: Captured, actual: Captured, *, eager: bool | None = None) -> LocalizedOp | None:
    """The first op call of `actual`, in execution order, whose target rows differ from `expected`'s.

    Rows are matched by (op key, token position); positions or keys present in one run only are
    not compared. Equality is bitwise on the rows' bit patterns.
    """
    expected_at = expected.rows_at()
    actual_at = actual.rows_at()
    passes = {p.forward_pass: p for p in actual.passes}
    still = first_divergence(expected.completion, actual.completion) is not None
    incomparable = 0
    for call in actual.calls:
        differing: list[int] = []
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        for i, pos in enumerate(call.positions):
            found = expected_at.get((call.key, pos))
            if found is None:
                continue
            other, j = found
            same = _bitwise_equal(other.rows[j], call.rows[i])
            if same is None:
                incomparable += 1
            elif not same:
                differing.append(pos)
                pairs.append((other.rows[j], call.rows[i]))
        if not differing:
            continue
        ulps = [u for a, b in pairs if (u := _ulp(a, b)) is not None]
        diffs = [d for a, b in pairs if (d := _max_abs(a, b)) is not None]
        layout = passes[call.forward_pass]
        module, op, _ = call.key
        match = _LAYER.search(module)
        note = f"{incomparable} rows earlier could not be compared (shapes differ)" if incomparable else ""
        return LocalizedOp(
            module=module, op=op, layer=int(match.group(1)) if match else None,
            forward_pass=call.forward_pass, engine_step=layout.engine_step, positions=tuple(differing),
            shape=call.shape, ulp=max(ulps) if ulps else None, max_abs_diff=max(diffs) if diffs else None,
            inputs_equal=_inputs_equal(call, differing, expected_at, actual_at),
            pass_evidence=dict(layout.evidence), eager=eager, still_diverged=still, note=note,
        )
    return None


def _inputs_equal(call: OpCall, positions: list[int], expected_at: dict[tuple[OpKey, int], tuple[OpCall, int]],
                  actual_at: dict[tuple[OpKey, int], tuple[OpCall, int]]) -> bool | None:
    """Were the rows of every row-aligned input of `call` bitwise equal at `positions` in both runs?"""
    verdict: bool | None = True
    for producer in call.inputs:
        for pos in positions:
            a, b = expected_at.get((producer, pos)), actual_at.get((producer, pos))
            if a is None or b is None:
                verdict = None
                continue
            same = _bitwise_equal(a[0].rows[a[1]], b[0].rows[b[1]])
            if same is False:
                return False
            if same is None:
                verdict = None
    return verdict


# ---------------------------------------------------------------------------------------------
# Engines: how each one lets us capture a run


def _native_layout(forward_pass: int, step: int, batch: list[ScheduledSeq], inputs: StepInputs,
                   target_index: int) -> PassLayout | None:
    """The target's rows in a native pass: token rows from query_start_loc, its logits row, and the evidence."""
    slot = next((j for j, item in enumerate(batch) if item.seq.index == target_index), None)
    if slot is None:
        return None
    item = batch[slot]
    qsl = inputs.query_start_loc.tolist()
    start = item.seq.num_computed_tokens
    n = item.num_new_tokens
    num_tokens = int(inputs.input_ids.shape[0])
    tokens = Grid((num_tokens,), tuple((qsl[slot] + k,) for k in range(n)), tuple(range(start, start + n)))
    grids = [tokens]
    if item.completes:
        row = sum(1 for it in batch[:slot] if it.completes)
        num_rows = int(inputs.logits_indices.shape[0])
        if num_rows != num_tokens:
            grids.append(Grid((num_rows,), ((row,),), (start + n - 1,)))
    prefill = [it for it in batch if it.is_prefill]
    evidence = {
        "num_seqs": len(batch), "num_tokens": num_tokens,
        "num_prefill_tokens": sum(it.num_new_tokens for it in prefill),
        "num_decode_tokens": sum(it.num_new_tokens for it in batch if not it.is_prefill),
        "target_slot": slot, "target_num_tokens": n, "target_is_prefill": item.is_prefill,
        "target_chunked": item.is_prefill and (item.seq.num_prefill_passes > 0 or not item.completes),
        "target_kv_len": start + n, "max_kv_len": int(inputs.seq_lens.max().item()),
        "num_kv_splits": inputs.num_kv_splits,
    }
    return PassLayout(forward_pass, step, tuple(grids), evidence)


def _capture_native(engine: NativeEngine, run: RunSpec) -> Captured:
    capture = RowCapture(lambda: engine.decoder.scopes.path[-1] if engine.decoder.scopes.path else "")
    counter = itertools.count()

    @contextlib.contextmanager
    def hook(step: int, batch: list[ScheduledSeq], inputs: StepInputs) -> Iterator[None]:
        layout = _native_layout(next(counter), step, batch, inputs, run.target_index)
        if layout is None:
            yield
            return
        with capture.forward_pass(layout, (inputs.input_ids,)):
            yield

    _reset(engine)
    if run.warm_with:
        engine.generate(run.warm_with)
    engine.capture = hook
    try:
        out = engine.generate(run.requests, run.budget) if run.budget else engine.generate(run.requests)
    finally:
        engine.capture = None
    return Captured(tuple(capture.calls), tuple(capture.passes), out[run.target_index])


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


def _capture_transformers(engine: Any, run: RunSpec) -> Captured:
    """Hooks on `engine.model`: every submodule's qualified name is the scope; the top forward is a pass.

    Where the target's tokens sit in a forward comes from `hf_layout` (`input_ids` [B, S], row
    `target_index`), or from `engine.localize_layout(forward_pass, forward_kwargs, target_index)
    -> PassLayout | None` when the engine defines one.
    """
    model: torch.nn.Module = engine.model
    stack: list[str] = []
    capture = RowCapture(lambda: stack[-1] if stack else "")
    counter = itertools.count()
    active: list[contextlib.ExitStack] = []
    handles: list[Any] = []

    # An engine that lays its rows out otherwise (packed, one row per request) says where the target is.
    layout_of = getattr(engine, "localize_layout", None) or hf_layout

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
        _reset(engine)
        if run.warm_with:
            engine.generate(run.warm_with)
        out = engine.generate(run.requests, run.budget) if run.budget else engine.generate(run.requests)
    finally:
        for h in handles:
            h.remove()
        while active:
            active.pop().close()
    return Captured(tuple(capture.calls), tuple(capture.passes), out[run.target_index])


def _reset(engine: Any) -> None:
    reset = getattr(engine, "reset_prefix_cache", None)
    if reset is not None:
        reset()


def _runs_elsewhere(engine: Any) -> bool:
    """Engines whose model runs in another process localize there: `engine.localize(expected, actual)`."""
    return callable(getattr(engine, "localize", None))


def capture_run(engine: Any, run: RunSpec) -> Captured:
    """Run `run` on `engine` with the target's rows captured per op. EngineError for engines we cannot hook."""
    from oracle.engines.native.engine import NativeEngine

    if isinstance(engine, NativeEngine):
        return _capture_native(engine, run)
    if isinstance(getattr(engine, "model", None), torch.nn.Module):
        return _capture_transformers(engine, run)
    raise EngineError(f"localize: cannot capture ops of engine {type(engine).__name__} "
                      "(native and transformers engines run in this process)")


def can_localize(engine: Any) -> bool:
    """True for engines we can capture: in this process (native, transformers) or in their worker (vLLM)."""
    from oracle.engines.native.engine import NativeEngine

    return (isinstance(engine, NativeEngine) or isinstance(getattr(engine, "model", None), torch.nn.Module)
            or _runs_elsewhere(engine))


def localize_runs(engine: Any, expected: RunSpec, actual: RunSpec) -> LocalizedOp | None:
    """Capture both runs on `engine` and name the first op whose target rows differ (None: no op differs).

    Both runs start from a reset prefix cache. The engine keeps its mode: pass the engine whose
    runs diverged (the invariant one for an invariance failure). An engine whose model runs in a
    worker process (vLLM) does both captures there, in eager mode: `engine.localize(expected, actual)`.
    """
    if _runs_elsewhere(engine):
        found: LocalizedOp | None = engine.localize(expected, actual)
        return found
    with torch.no_grad():
        exp = capture_run(engine, expected)
        act = capture_run(engine, actual)
    return first_differing_op(exp, act)


def localize_trial(engine: Any, solo_requests: Sequence[Request], trial_requests: Sequence[Request],
                   target_index: int, budget: int | None = None) -> LocalizedOp | None:
    """The first op at which the target of a failing trial departs from its solo run.

    `solo_requests`: the target alone (its first request is the target), run with the engine's
    default budget, as the reference is; `trial_requests[target_index]` is the target within the
    trial, run with the trial's per-pass token budget `budget`.
    """
    return localize_runs(engine, RunSpec(tuple(solo_requests), 0),
                         RunSpec(tuple(trial_requests), target_index, budget))


def _ranges(positions: Sequence[int]) -> str:
    """[3, 4, 5, 9] -> "3-5, 9"."""
    parts: list[str] = []
    run_start = prev = None
    for p in positions:
        if prev is not None and p == prev + 1:
            prev = p
            continue
        if run_start is not None:
            parts.append(str(run_start) if run_start == prev else f"{run_start}-{prev}")
        run_start = prev = p
    if run_start is not None:
        parts.append(str(run_start) if run_start == prev else f"{run_start}-{prev}")
    return ", ".join(parts) or "-"


def localize_from_report(report_path: Path, trial_id: int) -> LocalizedOp | None:
    """`oracle localize REPORT.json --trial ID`: rebuild the trial from the report and localize it.

    Runs on a fresh engine in the mode the report's divergence for that trial was found in
    (invariant when the report holds none); ConfigError when the trial is not in the report,
    EngineError when the engine cannot be captured.
    """
    from oracle.engines import build_engine
    from oracle.plan import Plan, resolve_model, solo_request, trial_requests
    from oracle.prompts import load_targets, vocab_size_of
    from oracle.replay import find_trial, report_config
    from oracle.report import load_report

    report = load_report(report_path)
    config = report_config(report, report_path)
    trial, recorded = find_trial(report, trial_id)
    mode: Mode = recorded.mode if recorded else "invariant"
    model_dir = resolve_model(config)
    plan = Plan(config, model_dir, tuple(load_targets(config, model_dir)), (trial,), report.seed,
                vocab_size_of(model_dir))
    engine = build_engine(config.engine, model_dir, mode)
    try:
        if not can_localize(engine):
            raise EngineError(f"localize: engine {config.engine.kind} cannot be captured (native, transformers "
                              "and vLLM engines can)")
        requests, at = trial_requests(plan, trial)
        return localize_trial(engine, [solo_request(plan, trial.target)], requests, at, trial.max_num_batched_tokens)
    finally:
        engine.close()
