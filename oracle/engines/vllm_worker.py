"""The vLLM worker process: one `vllm.LLMEngine` for one mode, stepped by hand, answering over a socket.

`python -m oracle.engines.vllm_worker FD` is started by `oracle.engines.vllm_engine.VllmEngine`
with the environment of its mode already set (VLLM_BATCH_INVARIANT, OMP_NUM_THREADS, ...), because
vLLM reads those once, at import and engine start, and `torch.library` overrides are process-wide.
FD is one end of a socket pair; messages are pickled tuples (`multiprocessing.connection`):

    parent -> worker: ("start", WorkerSpec) first, then ("generate", requests, max_num_batched_tokens),
                      ("localize", expected RunSpec, actual RunSpec), ("reset_prefix_cache",), ("close",)
    worker -> parent: ("ready", info) | ("ok", result) | ("error", text) | ("config_error", text)

The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so this module steps it
itself: a request joins when the step counter reaches its `arrival_step`, and the scheduler's
output of every step is recorded as the evidence of what shared each forward pass.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from oracle.engines.contract import Completion, Request, SamplingParams, StepEvidence

_AUDIT_SAMPLING = SamplingParams(max_tokens=2, temperature=0.0, logits="none")


@dataclass(frozen=True)
class WorkerSpec:
    """Everything the worker needs to build its engine; plain data, sent pickled."""

    model: str
    mode: str
    invariance: str  # "vllm" | "oracle_kernels" | "none"
    dtype: str
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    logprobs: int
    enforce_eager: bool
    max_model_len: int | None
    seed: int
    audit: bool
    engine_args: dict[str, Any] = field(default_factory=dict)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1

    @property
    def uses_oracle_kernels(self) -> bool:
        return self.mode == "invariant" and self.invariance == "oracle_kernels"


class WorkerConfigError(Exception):
    """A setting vLLM rejected that the user chose (reported as a ConfigError by the parent)."""


class NotInForce(Exception):
    """Invariant mode's kernels are not in force in some rank (reported as KernelsNotInForce by the parent)."""


@dataclass
class _Scheduled:
    """One request's share of one forward pass, read from the scheduler right after it scheduled."""

    num_seqs: int
    num_tokens: int
    is_prefill: bool
    completes: bool  # the pass reaches the end of the known tokens, so it samples a token
    num_computed_before: int
    num_output_tokens: int
    num_new_tokens: int = 0


class _SchedulerTap:
    """Wraps `scheduler.schedule` to keep, per call, what each scheduled request did in that pass.

    Read inside the call because the scheduler advances `num_computed_tokens` there and frees
    finished requests in `update_from_output`, after which they are gone.
    """

    def __init__(self, scheduler: Any) -> None:
        self._scheduler = scheduler
        self._schedule = scheduler.schedule
        self.passes: list[dict[str, _Scheduled]] = []
        scheduler.schedule = self._tapped

    def _tapped(self, *args: Any, **kwargs: Any) -> Any:
        out = self._schedule(*args, **kwargs)
        counts: dict[str, int] = out.num_scheduled_tokens
        total = int(out.total_num_scheduled_tokens)
        one: dict[str, _Scheduled] = {}
        for rid, n in counts.items():
            req = self._scheduler.requests[rid]
            after = int(req.num_computed_tokens)  # already advanced by this pass
            one[rid] = _Scheduled(
                num_seqs=len(counts), num_tokens=total, is_prefill=after - n < req.num_prompt_tokens,
                completes=after >= req.num_tokens, num_computed_before=after - n,
                num_output_tokens=int(req.num_output_tokens), num_new_tokens=int(n),
            )
        if total:
            self.passes.append(one)
        return out

    def take(self) -> list[dict[str, _Scheduled]]:
        passes, self.passes = self.passes, []
        return passes


@dataclass
class _Track:
    """Per request of one generate call."""

    index: int
    out: Completion
    want: str  # "full" | "digest" | "none"
    prefill_passes: int = 0
    num_cached_tokens: int = 0

    def record_pass(self, step: int, seq_position: int, p: _Scheduled, shape: dict[str, Any]) -> None:
        """This request's share of one forward pass (`p`), in a pass of `shape`, as one step of evidence."""
        if p.is_prefill and self.prefill_passes == 0:
            self.num_cached_tokens = p.num_computed_before  # a new request starts past its cached prefix
        chunked = p.is_prefill and (self.prefill_passes > 0 or not p.completes)
        self.prefill_passes += p.is_prefill
        self.out.evidence.append(StepEvidence(
            engine_step=step, num_seqs=p.num_seqs, num_tokens=p.num_tokens, is_prefill=p.is_prefill,
            chunked=chunked, num_cached_tokens=self.num_cached_tokens,
            token_index=p.num_output_tokens if p.completes else None, seq_position=seq_position,
            kv_len=p.num_computed_before + p.num_new_tokens, **shape,
        ))


def _pass_shape(passes: list[_Scheduled]) -> dict[str, Any]:
    """The shape of one forward pass, from every request the scheduler put in it (ours and vLLM's own)."""
    prefill = sum(p.num_new_tokens for p in passes if p.is_prefill)
    return {
        "num_prefill_tokens": prefill, "num_decode_tokens": sum(p.num_new_tokens for p in passes) - prefill,
        "max_query_len": max((p.num_new_tokens for p in passes), default=0),
        "max_kv_len": max((p.num_computed_before + p.num_new_tokens for p in passes), default=0),
        "has_chunked": any(p.is_prefill and not p.completes for p in passes),
    }


def _sampling_params(s: SamplingParams, logprobs: int) -> Any:
    """vLLM's sampling parameters for one request: a logprob row per step (the whole vocabulary when the
    logits are asked for), token ids only, exactly `max_tokens` of them, each step's tokens as they come."""
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.sampling_params import RequestOutputKind

    k = -1 if s.logits in ("full", "digest") else logprobs
    return VllmSamplingParams(
        max_tokens=s.max_tokens, temperature=s.temperature, seed=s.seed if s.temperature > 0 else None,
        top_p=s.top_p, top_k=s.top_k if s.top_k > 0 else -1, logprobs=k, detokenize=False, ignore_eos=True,
        output_kind=RequestOutputKind.DELTA, flat_logprobs=True,
    )


class WorkerEngine:
    """A `vllm.LLMEngine` built for one mode, and the loop that steps it for one trial at a time."""

    def __init__(self, spec: WorkerSpec) -> None:
        import vllm
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        self.spec = spec
        kwargs: dict[str, Any] = dict(
            model=spec.model, dtype=spec.dtype, skip_tokenizer_init=True, seed=spec.seed,
            max_num_seqs=spec.max_num_seqs, max_num_batched_tokens=spec.max_num_batched_tokens,
            enable_chunked_prefill=spec.enable_chunked_prefill, enable_prefix_caching=spec.enable_prefix_caching,
            # -1: the full vocabulary may be asked for (logits "full" / "digest").
            max_logprobs=-1, enforce_eager=spec.enforce_eager,
            # Outputs must belong to the step that scheduled them, or the evidence would be off by one.
            async_scheduling=False, disable_log_stats=True,
            tensor_parallel_size=spec.tensor_parallel_size, pipeline_parallel_size=spec.pipeline_parallel_size,
        )
        if spec.max_model_len is not None:
            kwargs["max_model_len"] = spec.max_model_len
        kwargs.update(_mode_args(spec))
        try:
            args = EngineArgs(**kwargs)
        except TypeError as e:  # an engine_args key EngineArgs does not have
            raise WorkerConfigError(str(e)) from e
        # Invariant mode's kernels come from oracle's vLLM plugin (oracle.engines.vllm_plugin), which vLLM runs
        # in this process and in every rank it starts; the environment (ORACLE_VLLM_KERNELS) asks for them.
        self.engine = LLMEngine.from_engine_args(args)
        client: Any = self.engine.engine_core  # an InprocClient with VLLM_ENABLE_V1_MULTIPROCESSING=0
        core = client.engine_core
        self.scheduler = core.scheduler
        self.tap = _SchedulerTap(self.scheduler)
        self.internal_ids: dict[str, str] = {}  # the caller's request id -> vLLM's
        self.vocab_size = int(self.engine.model_config.get_vocab_size())
        self.info: dict[str, Any] = {
            "engine_version": vllm.__version__, "vocab_size": self.vocab_size,
            "max_model_len": int(self.engine.model_config.max_model_len),
        }
        self.info.update(_threads())
        ranks = self._ranks()
        self.info["ranks"] = ranks
        self.info["linear_kernel"] = _agreed([r["linear_kernel"] for r in ranks])
        if any("ops" in r for r in ranks):
            self.info["ops"] = ranks[0].get("ops")  # rank 0's, as a single-process engine reports them
        self.info["posture"] = _posture(self.engine, spec, ranks)
        if spec.mode == "invariant":
            from oracle.engines.vllm_coverage import coverage

            self.info["coverage"] = coverage(spec.invariance, self.info["posture"], ranks)
        if spec.uses_oracle_kernels:
            import oracle_kernels

            from oracle.engines.vllm_plugin import not_in_force

            device = "cuda" if str(self.info["posture"].get("device")).startswith("cuda") else "cpu"
            self.info["covered_ops"] = oracle_kernels.covered_ops(device)
            why = not_in_force(ranks, spec.tensor_parallel_size * spec.pipeline_parallel_size)
            if why:
                raise NotInForce("; ".join(why))

    def _ranks(self) -> list[dict[str, Any]]:
        """Each rank's own account of what it runs (`vllm_plugin.rank_report`, run in the rank's process), with
        the ops its forward passes reached in a short audit when `spec.audit`; sorted by rank."""
        from oracle.engines import vllm_plugin

        ranks = list(self.engine.collective_rpc(vllm_plugin.rank_report))
        if self.spec.audit:
            by_rank = {r.get("rank"): r for r in ranks}
            for ops in self._audit():
                if ops.get("rank") in by_rank:
                    by_rank[ops.pop("rank")]["ops"] = ops
        return sorted(ranks, key=lambda r: (r.get("rank") is None, r.get("rank") or 0))

    def _audit(self) -> list[dict[str, Any]]:
        """Run two short requests side by side and list, per rank, the ops its passes reached.

        `batch_variant_*` are the aten ops `oracle_kernels.audit` knows to be batch-variant, split by
        whether our kernel ran them; `opaque` are vLLM's own custom ops (`_C::`, `vllm::`), whose
        insides torch cannot see, so no aten override reaches them. Recorded in each rank's process
        (`vllm_plugin.audit_begin` / `audit_end`), where the model runs.
        """
        from oracle.engines import vllm_plugin

        reqs = [Request("audit-a", tuple(range(1, 6)), _AUDIT_SAMPLING),
                Request("audit-b", tuple(range(7, 16)), _AUDIT_SAMPLING)]
        self.engine.collective_rpc(vllm_plugin.audit_begin)
        try:
            self.generate(reqs, None)
        finally:
            found = list(self.engine.collective_rpc(vllm_plugin.audit_end))
        if self.spec.enable_prefix_caching:
            self.engine.reset_prefix_cache()
        return found

    def shutdown(self) -> None:
        """Stop vLLM's engine core and the rank processes it started now, rather than at interpreter exit, where
        nothing told them to go (a TP 2 worker then outlived the parent's grace period and was terminated)."""
        with contextlib.suppress(Exception):
            self.engine.engine_core.shutdown()

    def reset_prefix_cache(self) -> bool:
        return bool(self.engine.reset_prefix_cache())

    def localize(self, expected: Any, actual: Any, repro_dir: str | None = None) -> dict[str, Any] | None:
        """Localize here (`oracle.capture.localize_with`): both runs captured per op, the op confirmed
        alone, `repro_dir` written; the finding as JSON, or None.

        Only meaningful with `enforce_eager`: CUDA graphs and torch.compile run ops no dispatch mode sees.
        """
        from pathlib import Path

        from oracle.capture import localize_with

        with _vllm_capture(self) as capture:
            found = localize_with(capture, expected, actual, eager=self.spec.enforce_eager,
                                  repro_dir=Path(repro_dir) if repro_dir else None, imports=("vllm",))
        return found.to_json() if found is not None else None

    def generate(self, requests: Sequence[Request], max_num_batched_tokens: int | None) -> list[Completion]:
        """Add each request when the step counter reaches its arrival step; step until all finish."""
        # vLLM's own knob for a scheduling budget below the batch capacity the engine was built with.
        self.scheduler.max_num_scheduled_tokens = max_num_batched_tokens or self.spec.max_num_batched_tokens
        tracks: dict[str, _Track] = {}
        order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_step)
        # A budget that can never schedule a prompt would loop forever: bound the steps instead.
        limit = max((r.arrival_step for r in requests), default=0) + 4 * sum(
            len(r.prompt_token_ids) + r.sampling.max_tokens for r in requests) + 64
        self.tap.take()
        try:
            self._run(requests, order, tracks, limit, max_num_batched_tokens)
        except BaseException:
            # Leave the engine empty for the next call, whatever stopped this one.
            self.engine.abort_request(list(tracks))
            self.tap.take()
            raise
        done = sorted(tracks.values(), key=lambda t: t.index)
        return [t.out for t in done]

    def _run(self, requests: Sequence[Request], order: list[int], tracks: dict[str, _Track], limit: int,
             max_num_batched_tokens: int | None) -> None:
        step = added = 0
        while added < len(order) or self.engine.has_unfinished_requests():
            while added < len(order) and requests[order[added]].arrival_step <= step:
                self._add(requests[order[added]], order[added], tracks)
                added += 1
            if self.engine.has_unfinished_requests():
                self._step(step, tracks)
            step += 1
            if step > limit:
                raise RuntimeError(f"no completion after {limit} engine steps (budget {max_num_batched_tokens}, "
                                   f"chunked prefill {self.spec.enable_chunked_prefill})")

    def _add(self, r: Request, index: int, tracks: dict[str, _Track]) -> None:
        """Hand request `r` (the `index`th of the call) to vLLM and start tracking it under vLLM's id."""
        s = r.sampling
        prompt: Any = {"prompt_token_ids": list(r.prompt_token_ids)}  # a TokensPrompt
        rid = self.engine.add_request(r.request_id, prompt, _sampling_params(s, self.spec.logprobs))
        self.internal_ids[r.request_id] = rid
        out = Completion(r.request_id, [], [], logits=[] if s.logits == "full" else None,
                         logits_digests=[] if s.logits == "digest" else None, top2=[])
        tracks[rid] = _Track(index, out, s.logits)

    def _step(self, step: int, tracks: dict[str, _Track]) -> None:
        """One engine step: the passes it ran recorded as evidence, the tokens it sampled as output."""
        outputs = self.engine.step()
        self._record_passes(step, tracks)
        by_external = {t.out.request_id: t for t in tracks.values()}
        for o in outputs:
            self._record_tokens(by_external[o.request_id], o)

    def _record_passes(self, step: int, tracks: dict[str, _Track]) -> None:
        for one in self.tap.take():
            shape = _pass_shape(list(one.values()))
            for position, (rid, p) in enumerate(one.items()):
                t = tracks.get(rid)
                if t is not None:
                    t.record_pass(step, position, p, shape)

    def _record_tokens(self, t: _Track, o: Any) -> None:
        c = o.outputs[0]
        lp = c.logprobs  # FlatLogprobs: the positions of this step's new tokens only (DELTA)
        for j, token in enumerate(c.token_ids):
            lo, hi = lp.start_indices[j], lp.end_indices[j]
            ids = np.asarray(lp.token_ids[lo:hi], dtype=np.int64)
            vals = np.asarray(lp.logprobs[lo:hi], dtype=np.float32)  # float32 already; exact
            hit = np.flatnonzero(ids == token)
            if hit.size == 0:
                raise RuntimeError(f"request {t.out.request_id}: vLLM returned no logprob for sampled token {token}")
            t.out.token_ids.append(int(token))
            t.out.logprobs.append(float(vals[hit[0]]))
            if t.want in ("full", "digest"):
                row = np.full(self.vocab_size, -np.inf, dtype=np.float32)  # [vocab] logprobs
                row[ids] = vals
                top = np.partition(row, -2)[-2:]
                top2 = (float(top[1]), float(top[0]))
                if t.out.logits is not None:
                    t.out.logits.append(row)
                elif t.out.logits_digests is not None:
                    t.out.logits_digests.append(hashlib.sha256(row.tobytes()).hexdigest())
            else:
                _, first = np.unique(ids, return_index=True)  # the sampled token may be listed twice
                best = np.sort(vals[first])[::-1]
                top2 = (float(best[0]), float(best[1] if best.size > 1 else best[0]))
            assert t.out.top2 is not None
            t.out.top2.append(top2)


def _mode_args(spec: WorkerSpec) -> dict[str, Any]:
    """The user's engine_args, with what invariant mode's oracle_kernels need of vLLM on CUDA where left unset
    (oracle.engines.vllm_coverage.oracle_kernels_args)."""
    if not spec.uses_oracle_kernels:
        return dict(spec.engine_args)
    from vllm.platforms import current_platform

    from oracle.engines.vllm_coverage import oracle_kernels_args

    if not current_platform.is_cuda():
        return dict(spec.engine_args)
    return oracle_kernels_args(spec.engine_args, spec.enforce_eager)


def _find_model(engine: WorkerEngine) -> Any:
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


def _rows_of(positions: list[int], ids: list[int] | None, start: int, n: int, tokens: list[int] | None) -> list[int]:
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


def _row_starts(engine: WorkerEngine, now: dict[str, _Scheduled], positions: list[int],
                ids: list[int] | None) -> dict[str, list[int]]:
    """Per request of the pass, every row where its new tokens could start (one, where the pass tells them apart)."""
    starts: dict[str, list[int]] = {}
    for rid, sched in now.items():
        request = engine.scheduler.requests.get(rid)
        tokens = list(getattr(request, "all_token_ids", [])) or None
        starts[rid] = _rows_of(positions, ids, sched.num_computed_before, sched.num_new_tokens, tokens)
    return starts


def _pass_evidence(now: dict[str, _Scheduled], me: _Scheduled, enforce_eager: bool) -> dict[str, Any]:
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


def _block_size(engine: WorkerEngine) -> Any:
    """The KV cache's block size from the engine's `VllmConfig`, None where it does not say."""
    cache_config = getattr(getattr(getattr(engine, "engine", None), "vllm_config", None), "cache_config", None)
    return getattr(cache_config, "block_size", None)


def _vllm_layout(engine: WorkerEngine, forward_pass: int, step: int, kwargs: dict[str, Any],
                 target_rid: str) -> Any:
    """The target's rows in one vLLM forward over flattened `[num_tokens]` inputs.

    The scheduler tap says which positions the target computes in this pass; its rows are the
    run of rows holding those positions (and its token ids); its logits row is its rank among the
    pass's sequences, which vLLM lays out in the order of their rows.
    """
    from oracle.capture.rows import Grid, PassLayout

    now = engine.tap.passes[-1] if engine.tap.passes else {}
    me = now.get(target_rid)
    if me is None:  # a pass without the target: no copy of its inputs to the host (a sync on CUDA)
        return None
    flat = _flat_inputs(kwargs)
    if flat is None:
        return None
    positions, ids = flat
    starts = _row_starts(engine, now, positions, ids)
    mine = starts[target_rid]
    if len(mine) != 1:
        return None  # not found, or another sequence holds the same tokens at the same positions
    first, n, c = mine[0], me.num_new_tokens, me.num_computed_before
    grids = [Grid((len(positions),), tuple((first + k,) for k in range(n)), tuple(range(c, c + n)))]
    seq_index = _seq_index(starts, first)
    if me.completes and seq_index is not None and len(now) != len(positions):
        grids.append(Grid((len(now),), ((seq_index,),), (c + n - 1,)))  # [num_seqs, vocab] logits
    return PassLayout(forward_pass, step, tuple(grids), _pass_evidence(now, me, engine.spec.enforce_eager),
                      seq_index=seq_index, kv_len=c + n, block_size=_block_size(engine))


# FlashAttention's ops return `Tensor[]` with alias annotations that fail under Python dispatch: the
# capture observes their calls at the Python level (oracle.capture.rows.RowCapture.bypass).
BYPASS_OPS = ("_vllm_fa3_C.fwd", "_vllm_fa2_C.varlen_fwd", "_vllm_fa2_C.fwd_kvcache")


@contextlib.contextmanager
def _vllm_capture(engine: WorkerEngine) -> Iterator[Any]:
    """Yields `capture(run, rows) -> Completion`: hooks on every module of vLLM's model name the scope;
    the model's forward opens a pass that stays open through the step (vLLM computes logits after it)."""
    import itertools

    import torch

    from oracle.capture.rows import RowCapture
    from oracle.engines.contract import RunSpec

    model = _find_model(engine)
    stack: list[str] = []
    state: dict[str, Any] = {"target": None, "step": 0, "open": None, "counter": itertools.count(), "rows": None}

    def close_pass() -> None:
        if state["open"] is not None:
            state["open"].close()
            state["open"] = None

    def begin(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        close_pass()
        named = dict(zip(("input_ids", "positions"), args, strict=False)) | kwargs
        rid = engine.internal_ids.get(state["target"])  # set when the request was added, before its first pass
        layout = _vllm_layout(engine, next(state["counter"]), state["step"], named, rid) if rid else None
        rows: RowCapture | None = state["rows"]
        if layout is None or rows is None:
            return
        exits = contextlib.ExitStack()
        inputs = [t for t in (named.get("input_ids"), named.get("positions")) if isinstance(t, torch.Tensor)]
        exits.enter_context(rows.forward_pass(layout, inputs))
        state["open"] = exits

    def push(name: str) -> Any:
        return lambda module, args: stack.append(name)

    def pop(module: Any, args: Any, output: Any) -> None:
        if stack:
            stack.pop()

    handles = [model.register_forward_pre_hook(begin, with_kwargs=True)]
    for name, module in model.named_modules():
        if name:
            handles.append(module.register_forward_pre_hook(push(name)))
            handles.append(module.register_forward_hook(pop, always_call=True))
    original_step = engine.engine.step

    def step() -> Any:
        try:
            return original_step()
        finally:
            close_pass()
            state["step"] += 1

    def run(spec: RunSpec, rows: RowCapture) -> Completion:
        state["target"] = None  # nothing is captured while the cache is warmed
        state["rows"] = None
        if engine.spec.enable_prefix_caching:
            engine.engine.reset_prefix_cache()
        if spec.warm_with:
            engine.generate(list(spec.warm_with), None)
        rows.module_path = lambda: stack[-1] if stack else ""
        rows.bypass = BYPASS_OPS
        rows.enter = ("vllm",)  # vllm::unified_attention_with_output and kin: the kernels inside are named
        state.update(step=0, counter=itertools.count(), rows=rows,
                     target=spec.requests[spec.target_index].request_id)
        try:
            out = engine.generate(list(spec.requests), spec.max_num_batched_tokens)
        finally:
            close_pass()
            state["rows"] = None
        return out[spec.target_index]

    engine.engine.step = step
    try:
        yield run
    finally:
        del engine.engine.step
        close_pass()
        for h in handles:
            h.remove()


_UNKNOWN = "unknown"
# Environment variables of the worker that decide kernels, reductions or scheduling (the posture's `env`).
_POSTURE_ENV = ("VLLM_BATCH_INVARIANT", "VLLM_ATTENTION_BACKEND", "VLLM_FLASH_ATTN_VERSION",
                "VLLM_USE_FLASHINFER_SAMPLER", "VLLM_CPU_ATTN_SPLIT_KV", "CUBLAS_WORKSPACE_CONFIG", "NCCL_ALGO",
                "NCCL_PROTO", "OMP_NUM_THREADS")
_THREAD_ENV = ("OMP_NUM_THREADS", "VLLM_CPU_ATTN_SPLIT_KV", "VLLM_BATCH_INVARIANT", "VLLM_CPU_OMP_THREADS_BIND")
# Compilation passes that shard activations across ranks (sequence parallelism and its fused kin).
_SP_PASSES = ("enable_sp", "enable_sequence_parallelism", "fuse_gemm_comms")


def _agreed(values: list[Any]) -> Any:
    """One value where every rank agrees, else each rank's value in rank order ("rank 0: x; rank 1: y")."""
    if not values:
        return _UNKNOWN
    if all(v == values[0] for v in values):
        return values[0]
    return "; ".join(f"rank {i}: {v}" for i, v in enumerate(values))


def _per_rank(ranks: list[dict[str, Any]], key: str) -> list[Any]:
    """Each rank's `key`, in rank order ("unknown" where a rank did not report it)."""
    return [r.get(key, _UNKNOWN) for r in ranks]


def _environ(keys: tuple[str, ...]) -> dict[str, str]:
    import os

    return {k: os.environ[k] for k in keys if k in os.environ}


def _read(obj: Any, *path: str) -> Any:
    """`obj.a.b...` along `path`, "unknown" where an attribute on the way is missing or None."""
    for name in path:
        obj = getattr(obj, name, None)
        if obj is None:
            return _UNKNOWN
    return obj


def _text(value: Any) -> Any:
    """A setting as a report holds it: a scalar as it is, anything else as its text."""
    return value if isinstance(value, (bool, int, float, str)) else str(value)


def _attention(cfg: Any, ranks: list[dict[str, Any]]) -> Any:
    """The ranks' attention backend (at TP > 1 this process holds no attention layer), with FlashAttention's
    version where it is FlashAttention."""
    attention = _agreed(_per_rank(ranks, "attention_backend"))
    if "FLASH_ATTN" not in attention:
        return attention
    fa_version = _read(cfg, "attention_config", "flash_attn_version")
    with contextlib.suppress(Exception):
        from vllm.v1.attention.backends.fa_utils import get_flash_attn_version

        fa_version = get_flash_attn_version() if fa_version == _UNKNOWN else fa_version
    return attention + (f" (FA{fa_version})" if fa_version not in (_UNKNOWN, None) else "")


def _is_sp_pass(name: str) -> bool:
    return name in _SP_PASSES or "sequence_parallel" in name or "async_tp" in name


def _sequence_parallel(cfg: Any) -> bool:
    """Whether any compilation pass that shards activations across ranks is on."""
    passes = _read(cfg, "compilation_config", "pass_config")
    flags = {k: v for k, v in vars(passes).items() if isinstance(v, bool)} if passes != _UNKNOWN else {}
    return any(v for k, v in flags.items() if _is_sp_pass(k))


def _graphs(cfg: Any, enforce_eager: bool) -> dict[str, Any]:
    """CUDA graphs (mode and captured sizes) and torch.compile's mode; all off when eager."""
    if enforce_eager:
        return {"cuda_graphs": "off", "cuda_graph_sizes": [], "compile_mode": "none (eager)"}
    sizes = _read(cfg, "compilation_config", "cudagraph_capture_sizes")
    return {"cuda_graphs": _text(_read(cfg, "compilation_config", "cudagraph_mode")),
            "cuda_graph_sizes": list(sizes) if isinstance(sizes, list) else [],
            "compile_mode": _text(_read(cfg, "compilation_config", "mode"))}


def _spec_decoding(cfg: Any) -> Any:
    spec_cfg = _read(cfg, "speculative_config")
    return "none" if spec_cfg in (_UNKNOWN, None) else _text(getattr(spec_cfg, "method", spec_cfg))


def _sampler(device: Any) -> str:
    """vLLM's top-k/top-p sampler: FlashInfer's on CUDA unless VLLM_USE_FLASHINFER_SAMPLER=0, else PyTorch's."""
    import os

    if str(device).startswith("cuda") and os.environ.get("VLLM_USE_FLASHINFER_SAMPLER", "1") != "0":
        return "flashinfer (top-k/top-p)"
    return "pytorch (vLLM's TopKTopPSampler)"


def _posture(engine: Any, spec: WorkerSpec, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The settings vLLM resolved at start (`oracle.posture.FIELDS`), read from its `VllmConfig` and, for what
    only the processes that run the model know (device, attention backend, all-reduce, linear kernels), from
    each rank's own report (`ranks`); whatever this vLLM version does not expose is "unknown", never guessed."""
    cfg = getattr(engine, "vllm_config", None)
    device = _text(_read(cfg, "device_config", "device"))
    return {
        "engine": "vllm", "device": device, "dtype": _text(_read(cfg, "model_config", "dtype")).removeprefix("torch."),
        "attention_backend": _attention(cfg, ranks),
        **_graphs(cfg, spec.enforce_eager),
        "async_scheduling": _text(_read(cfg, "scheduler_config", "async_scheduling")),
        "chunked_prefill": _text(_read(cfg, "scheduler_config", "enable_chunked_prefill")),
        "prefix_caching": _text(_read(cfg, "cache_config", "enable_prefix_caching")),
        "spec_decoding": _spec_decoding(cfg),
        "tensor_parallel": _text(_read(cfg, "parallel_config", "tensor_parallel_size")),
        "pipeline_parallel": _text(_read(cfg, "parallel_config", "pipeline_parallel_size")),
        "sequence_parallel": _sequence_parallel(cfg), "all_reduce": _agreed(_per_rank(ranks, "all_reduce")),
        "rank_devices": _per_rank(ranks, "device") or _UNKNOWN,
        "sampler": _sampler(device), "kv_cache_dtype": _text(_read(cfg, "cache_config", "cache_dtype")),
        "quantization": _text(getattr(getattr(cfg, "model_config", None), "quantization", None) or "none"),
        "linear_kernel": _agreed(_per_rank(ranks, "linear_kernel")),
        "env": _environ(_POSTURE_ENV),
    }


def _threads() -> dict[str, Any]:
    import torch

    return {"torch_threads": torch.get_num_threads(), "env": _environ(_THREAD_ENV)}


def _reply(e: BaseException) -> tuple[str, str]:
    if isinstance(e, NotInForce):
        return ("not_in_force", str(e))
    return ("config_error" if isinstance(e, WorkerConfigError) else "error", _report(e))


def _report(e: BaseException) -> str:
    """One line for the parent's error message; the whole traceback goes to the worker log (stderr)."""
    traceback.print_exception(e, file=sys.stderr)
    sys.stderr.flush()
    frames = traceback.extract_tb(e.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(e).__name__}: {e}{where}"


def _serve(conn: Connection, engine: WorkerEngine) -> None:
    while True:
        try:
            msg = conn.recv()
        except EOFError:  # the parent is gone
            return
        op = msg[0]
        if op == "close":
            return
        try:
            if op == "generate":
                result: Any = engine.generate(msg[1], msg[2])
            elif op == "localize":
                result = engine.localize(*msg[1:])
            elif op == "reset_prefix_cache":
                result = engine.reset_prefix_cache()
            else:
                raise ValueError(f"unknown message {op!r}")
        except Exception as e:  # noqa: BLE001 - reported to the parent, which raises EngineError
            conn.send(_reply(e))
            continue
        conn.send(("ok", result))


def main(argv: Sequence[str]) -> int:
    conn = Connection(int(argv[0]))
    try:
        op, spec = conn.recv()
        if op != "start" or not isinstance(spec, WorkerSpec):
            raise ValueError(f"expected ('start', WorkerSpec), got {op!r}")
        engine = WorkerEngine(spec)
        try:
            conn.send(("ready", engine.info))
            _serve(conn, engine)
        finally:
            engine.shutdown()
    except EOFError:
        return 1
    except BaseException as e:  # noqa: BLE001 - whatever stopped the start is the parent's error message
        with contextlib.suppress(OSError):
            conn.send(_reply(e))
        return 1
    return 0


if __name__ == "__main__":
    # Run from the importable module, not `__main__`: the pickled WorkerSpec names that module.
    import os

    from oracle.engines.vllm_worker import main as _main

    code = _main(sys.argv[1:])
    # vLLM's engine is shut down by now; the interpreter's teardown of torch and vLLM (seconds, on the
    # critical path of every close) has nothing left to release that the process's end does not.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
