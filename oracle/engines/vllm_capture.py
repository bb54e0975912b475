"""Per-op capture of vLLM's model, wherever it runs: the worker's own process at TP 1, each rank's at TP > 1.

`ModelCapture` hooks every module of a vLLM model (the scope names the capture keys ops by) and opens a
`RowCapture` pass at each model forward that holds the target, placed by `pass_layout` from the pass's
`PassContext` (oracle.engines.vllm_tap). The pass stays open through the step (vLLM computes logits after the
model's forward). `in_process` yields the `capture(run, rows)` function of `oracle.capture.localize_with` for a
model in the worker's own process; the ranks' side is `oracle.engines.vllm_ranks`.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from oracle.engines.vllm_tap import PassContext, Scheduled

if TYPE_CHECKING:
    from oracle.capture.rows import RowCapture

# FlashAttention's ops return `Tensor[]` with alias annotations that fail under Python dispatch: the
# capture observes their calls at the Python level (oracle.capture.rows.RowCapture.bypass).
BYPASS_OPS = ("_vllm_fa3_C.fwd", "_vllm_fa2_C.varlen_fwd", "_vllm_fa2_C.fwd_kvcache")


def rows_of(positions: list[int], ids: list[int] | None, start: int, n: int, tokens: list[int] | None) -> list[int]:
    """Every row r of a flattened pass where a sequence's tokens start..start+n-1 could sit (by position and id)."""
    want = list(range(start, start + n))
    hits = []
    for r in range(len(positions) - n + 1):
        if positions[r] != start or positions[r:r + n] != want:
            continue
        if ids is not None and tokens is not None and ids[r:r + n] != tokens[start:start + n]:
            continue
        hits.append(r)
    return hits


def _flat_inputs(kwargs: dict[str, Any]) -> tuple[list[int], list[int] | None] | None:
    """A forward's `[num_tokens]` positions and token ids (None where the forward is given none), or None
    without positions."""
    positions_t, ids_t = kwargs.get("positions"), kwargs.get("input_ids")
    if positions_t is None:
        return None
    positions = [int(p) for p in positions_t.reshape(-1).tolist()]
    ids = [int(i) for i in ids_t.reshape(-1).tolist()] if ids_t is not None else None
    return positions, ids


def _pass_evidence(now: dict[str, Scheduled], me: Scheduled, enforce_eager: bool) -> dict[str, Any]:
    """What the pass was, and the target's share of it (`me`), for the localized finding."""
    prefill = [p for p in now.values() if p.is_prefill]
    n, c = me.num_new_tokens, me.num_computed_before
    return {"num_seqs": me.num_seqs, "num_tokens": me.num_tokens,
            "num_prefill_tokens": sum(p.num_new_tokens for p in prefill),
            "num_decode_tokens": sum(p.num_new_tokens for p in now.values() if not p.is_prefill),
            "target_num_tokens": n, "target_is_prefill": me.is_prefill,
            "target_kv_len": c + n, "enforce_eager": enforce_eager}


def _seq_index(starts: dict[str, list[int]], first: int) -> int | None:
    """The rank of the sequence whose rows start at `first` among the pass's sequences, None unless every
    sequence's rows were told apart. Sequences are laid out in the order of the input batch, which is also their
    block-table row."""
    if not all(len(v) == 1 for v in starts.values()):
        return None
    return sorted(v[0] for v in starts.values()).index(first)


def pass_layout(ctx: PassContext | None, forward_pass: int, kwargs: dict[str, Any]) -> Any:
    """The target's rows in one vLLM forward over flattened `[num_tokens]` inputs (None: not in this pass).

    The context says which positions the target computes in this pass; its rows are the run of rows holding
    those positions (and its token ids); its logits row is its rank among the pass's sequences, which vLLM lays
    out in the order of their rows.
    """
    from oracle.capture.rows import Grid, PassLayout

    me = ctx.now.get(ctx.target) if ctx is not None else None
    if ctx is None or me is None:  # a pass without the target: no copy of its inputs to the host (a sync on CUDA)
        return None
    flat = _flat_inputs(kwargs)
    if flat is None:
        return None
    positions, ids = flat
    starts = {rid: rows_of(positions, ids, s.num_computed_before, s.num_new_tokens, list(ctx.tokens.get(rid, ())) or None)
              for rid, s in ctx.now.items()}
    mine = starts[ctx.target]
    if len(mine) != 1:
        return None  # not found, or another sequence holds the same tokens at the same positions
    first, n, c = mine[0], me.num_new_tokens, me.num_computed_before
    grids = [Grid((len(positions),), tuple((first + k,) for k in range(n)), tuple(range(c, c + n)))]
    seq_index = _seq_index(starts, first)
    if me.completes and seq_index is not None and len(ctx.now) != len(positions):
        grids.append(Grid((len(ctx.now),), ((seq_index,),), (c + n - 1,)))  # [num_seqs, vocab] logits
    return PassLayout(forward_pass, ctx.step, tuple(grids), _pass_evidence(ctx.now, me, ctx.enforce_eager),
                      seq_index=seq_index, kv_len=c + n, block_size=ctx.block_size)


class ModelCapture:
    """Hooks on one vLLM model: the module scope of every op, and a `RowCapture` pass opened at each forward
    that holds the target (`context()` gives the pass's `PassContext`). `remove()` takes the hooks off."""

    def __init__(self, model: Any, context: Callable[[], PassContext | None]) -> None:
        self.context = context
        self.rows: RowCapture | None = None
        self.stack: list[str] = []
        self.counter = itertools.count()
        self._open: contextlib.ExitStack | None = None
        self._handles = [model.register_forward_pre_hook(self._begin, with_kwargs=True)]
        for name, module in model.named_modules():
            if name:
                self._handles.append(module.register_forward_pre_hook(self._push(name)))
                self._handles.append(module.register_forward_hook(self._pop, always_call=True))

    def start(self, rows: RowCapture | None) -> None:
        """Capture into `rows` from the next forward on (None: capture nothing), passes counted from 0."""
        self.close_pass()
        self.counter = itertools.count()
        self.rows = rows
        if rows is not None:
            rows.module_path = lambda: self.stack[-1] if self.stack else ""
            rows.bypass = BYPASS_OPS
            rows.enter = ("vllm",)  # vllm::unified_attention_with_output and kin: the kernels inside are named

    def close_pass(self) -> None:
        if self._open is not None:
            self._open.close()
            self._open = None

    def remove(self) -> None:
        self.close_pass()
        self.rows = None
        for h in self._handles:
            h.remove()

    def _begin(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        import torch

        self.close_pass()
        named = dict(zip(("input_ids", "positions"), args, strict=False)) | kwargs
        forward_pass = next(self.counter)
        layout = pass_layout(self.context(), forward_pass, named) if self.rows is not None else None
        if layout is None or self.rows is None:
            return
        exits = contextlib.ExitStack()
        inputs = [t for t in (named.get("input_ids"), named.get("positions")) if isinstance(t, torch.Tensor)]
        exits.enter_context(self.rows.forward_pass(layout, inputs))
        self._open = exits

    def _push(self, name: str) -> Any:
        return lambda module, args: self.stack.append(name)

    def _pop(self, module: Any, args: Any, output: Any) -> None:
        if self.stack:
            self.stack.pop()


def find_model(engine: Any) -> Any:
    """The model (an nn.Module) inside vLLM's in-process engine core: executor -> worker -> runner -> model."""
    core = engine.engine.engine_core.engine_core
    executor = core.model_executor
    worker = getattr(executor, "driver_worker", None)
    worker = getattr(worker, "worker", worker)
    runner = getattr(worker, "model_runner", None)
    model = getattr(runner, "model", None)
    if model is None and runner is not None and hasattr(runner, "get_model"):
        model = runner.get_model()
    if model is None:
        raise RuntimeError("localize: cannot find the model in this vLLM version's engine core")
    return model


def block_size(engine: Any) -> Any:
    """The KV cache's block size from the engine's `VllmConfig`, None where it does not say."""
    cache_config = getattr(getattr(getattr(engine, "engine", None), "vllm_config", None), "cache_config", None)
    return getattr(cache_config, "block_size", None)


@contextlib.contextmanager
def targeting(engine: Any) -> Iterator[dict[str, Any]]:
    """The worker's tap describes every pass of the target named in the yielded dict's "target" (the caller's
    request id; None: no pass is described), with the engine step counted from "step"."""
    state: dict[str, Any] = {"target": None, "step": 0}

    def describe(now: dict[str, Scheduled]) -> PassContext | None:
        rid = engine.internal_ids.get(state["target"]) if state["target"] is not None else None
        if rid is None or rid not in now:
            return None
        return PassContext(state["step"], rid, dict(now), engine.tap.tokens_of(now), block_size(engine),
                           bool(engine.spec.enforce_eager))

    original_step = engine.engine.step

    def step() -> Any:
        try:
            return original_step()
        finally:
            state["step"] += 1

    engine.tap.describe = describe
    engine.engine.step = step
    try:
        yield state
    finally:
        del engine.engine.step
        engine.tap.describe = None
        engine.tap.context = None


def drive(engine: Any, state: dict[str, Any], spec: Any, on_target: Callable[[], None] = lambda: None) -> Any:
    """Run `spec` (a RunSpec) on the worker's engine: the prefix cache emptied, warmed with `spec.warm_with`
    (not described), then its requests with the target described; the target's Completion."""
    state["target"] = None  # nothing is captured while the cache is warmed
    if engine.spec.enable_prefix_caching:
        engine.engine.reset_prefix_cache()
    if spec.warm_with:
        engine.generate(list(spec.warm_with), None)
    on_target()
    state.update(step=0, target=spec.requests[spec.target_index].request_id)
    try:
        out = engine.generate(list(spec.requests), spec.max_num_batched_tokens)
    finally:
        state["target"] = None
    return out[spec.target_index]


@contextlib.contextmanager
def in_process(engine: Any) -> Iterator[Any]:
    """Yields `capture(run, rows) -> Completion` for a model in the worker's own process (TP 1)."""
    from oracle.engines.contract import RunSpec

    with targeting(engine) as state:
        hooks = ModelCapture(find_model(engine), lambda: engine.tap.context)

        def run(spec: RunSpec, rows: RowCapture) -> Any:
            hooks.start(None)
            try:
                return drive(engine, state, spec, lambda: hooks.start(rows))
            finally:
                hooks.start(None)

        original_step = engine.engine.step

        def step() -> Any:  # the pass stays open through the step: vLLM computes logits after the forward
            try:
                return original_step()
            finally:
                hooks.close_pass()

        engine.engine.step = step
        try:
            yield run
        finally:
            engine.engine.step = original_step
            hooks.remove()
