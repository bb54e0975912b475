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
        kwargs.update(spec.engine_args)
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
        if spec.uses_oracle_kernels:
            import oracle_kernels

            from oracle.engines.vllm_plugin import not_in_force

            self.info["covered_ops"] = oracle_kernels.covered_ops("cpu")
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
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.sampling_params import RequestOutputKind

        step = added = 0
        while added < len(order) or self.engine.has_unfinished_requests():
            while added < len(order) and requests[order[added]].arrival_step <= step:
                r = requests[order[added]]
                s = r.sampling
                k = -1 if s.logits in ("full", "digest") else self.spec.logprobs
                params = VllmSamplingParams(
                    max_tokens=s.max_tokens, temperature=s.temperature, seed=s.seed if s.temperature > 0 else None,
                    top_p=s.top_p, top_k=s.top_k if s.top_k > 0 else -1, logprobs=k, detokenize=False, ignore_eos=True, output_kind=RequestOutputKind.DELTA,
                    flat_logprobs=True,
                )
                prompt: Any = {"prompt_token_ids": list(r.prompt_token_ids)}  # a TokensPrompt
                rid = self.engine.add_request(r.request_id, prompt, params)
                self.internal_ids[r.request_id] = rid
                out = Completion(r.request_id, [], [], logits=[] if s.logits == "full" else None,
                                 logits_digests=[] if s.logits == "digest" else None, top2=[])
                tracks[rid] = _Track(order[added], out, s.logits)
                added += 1
            if self.engine.has_unfinished_requests():
                outputs = self.engine.step()
                self._record_passes(step, tracks)
                by_external = {t.out.request_id: t for t in tracks.values()}
                for o in outputs:
                    self._record_tokens(by_external[o.request_id], o)
            step += 1
            if step > limit:
                raise RuntimeError(f"no completion after {limit} engine steps (budget {max_num_batched_tokens}, "
                                   f"chunked prefill {self.spec.enable_chunked_prefill})")

    def _record_passes(self, step: int, tracks: dict[str, _Track]) -> None:
        for one in self.tap.take():
            # The pass's shape, from every request the scheduler put in it (ours and vLLM's own).
            passes = list(one.values())
            prefill = sum(p.num_new_tokens for p in passes if p.is_prefill)
            shape: dict[str, Any] = {
                "num_prefill_tokens": prefill, "num_decode_tokens": sum(p.num_new_tokens for p in passes) - prefill,
                "max_query_len": max((p.num_new_tokens for p in passes), default=0),
                "max_kv_len": max((p.num_computed_before + p.num_new_tokens for p in passes), default=0),
                "has_chunked": any(p.is_prefill and not p.completes for p in passes),
            }
            for position, (rid, p) in enumerate(one.items()):
                t = tracks.get(rid)
                if t is None:
                    continue
                if p.is_prefill and t.prefill_passes == 0:
                    t.num_cached_tokens = p.num_computed_before  # a new request starts past its cached prefix
                chunked = p.is_prefill and (t.prefill_passes > 0 or not p.completes)
                t.prefill_passes += p.is_prefill
                t.out.evidence.append(StepEvidence(
                    engine_step=step, num_seqs=p.num_seqs, num_tokens=p.num_tokens, is_prefill=p.is_prefill,
                    chunked=chunked, num_cached_tokens=t.num_cached_tokens,
                    token_index=p.num_output_tokens if p.completes else None, seq_position=position,
                    kv_len=p.num_computed_before + p.num_new_tokens, **shape,
                ))

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


def _vllm_layout(engine: WorkerEngine, forward_pass: int, step: int, kwargs: dict[str, Any],
                 target_rid: str) -> Any:
    """The target's rows in one vLLM forward over flattened `[num_tokens]` inputs.

    The scheduler tap says which positions the target computes in this pass; its rows are the
    run of rows holding those positions (and its token ids); its logits row is its rank among the
    pass's sequences, which vLLM lays out in the order of their rows.
    """
    from oracle.capture.rows import Grid, PassLayout

    if not engine.tap.passes:
        return None
    now = engine.tap.passes[-1]
    me = now.get(target_rid)
    positions_t, ids_t = kwargs.get("positions"), kwargs.get("input_ids")
    if me is None or positions_t is None:
        return None
    positions = [int(p) for p in positions_t.reshape(-1).tolist()]
    ids = [int(i) for i in ids_t.reshape(-1).tolist()] if ids_t is not None else None
    starts: dict[str, list[int]] = {}
    for rid, sched in now.items():
        request = engine.scheduler.requests.get(rid)
        tokens = list(getattr(request, "all_token_ids", [])) or None
        starts[rid] = _rows_of(positions, ids, sched.num_computed_before, sched.num_new_tokens, tokens)
    mine = starts[target_rid]
    if len(mine) != 1:
        return None  # not found, or another sequence holds the same tokens at the same positions
    first, n, c = mine[0], me.num_new_tokens, me.num_computed_before
    grids = [Grid((len(positions),), tuple((first + k,) for k in range(n)), tuple(range(c, c + n)))]
    # Sequences are laid out in the order of the input batch, which is also their block-table row.
    seq_index = sorted(v[0] for v in starts.values() if v).index(first) \
        if all(len(v) == 1 for v in starts.values()) else None
    if me.completes and all(len(v) == 1 for v in starts.values()) and len(now) != len(positions):
        rank = sorted(v[0] for v in starts.values()).index(first)
        grids.append(Grid((len(now),), ((rank,),), (c + n - 1,)))
    prefill = [p for p in now.values() if p.is_prefill]
    evidence = {"num_seqs": me.num_seqs, "num_tokens": me.num_tokens,
                "num_prefill_tokens": sum(p.num_new_tokens for p in prefill),
                "num_decode_tokens": sum(p.num_new_tokens for p in now.values() if not p.is_prefill),
                "target_num_tokens": n, "target_is_prefill": me.is_prefill,
                "target_kv_len": c + n, "enforce_eager": engine.spec.enforce_eager}
    block_size = getattr(getattr(getattr(engine, "engine", None), "vllm_config", None), "cache_config", None)
    return PassLayout(forward_pass, step, tuple(grids), evidence, seq_index=seq_index, kv_len=c + n,
                      block_size=getattr(block_size, "block_size", None))


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


def _agreed(values: list[Any]) -> Any:
    """One value where every rank agrees, else each rank's value in rank order ("rank 0: x; rank 1: y")."""
    if not values:
        return "unknown"
    if all(v == values[0] for v in values):
        return values[0]
    return "; ".join(f"rank {i}: {v}" for i, v in enumerate(values))


def _posture(engine: Any, spec: WorkerSpec, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The settings vLLM resolved at start (`oracle.posture.FIELDS`), read from its `VllmConfig` and, for what
    only the processes that run the model know (device, attention backend, all-reduce, linear kernels), from
    each rank's own report (`ranks`); whatever this vLLM version does not expose is "unknown", never guessed."""
    import os

    unknown = "unknown"
    cfg = getattr(engine, "vllm_config", None)

    def read(obj: Any, *path: str) -> Any:
        for name in path:
            obj = getattr(obj, name, None)
            if obj is None:
                return unknown
        return obj

    def text(value: Any) -> Any:
        return value if isinstance(value, (bool, int, float, str)) else str(value)

    device = text(read(cfg, "device_config", "device"))
    # The ranks' attention layers (at TP > 1 this process holds none); one value where the ranks agree.
    attention = _agreed([r.get("attention_backend", unknown) for r in ranks])
    fa_version = read(cfg, "attention_config", "flash_attn_version")
    if "FLASH_ATTN" in attention:
        with contextlib.suppress(Exception):
            from vllm.v1.attention.backends.fa_utils import get_flash_attn_version

            fa_version = get_flash_attn_version() if fa_version == unknown else fa_version
        attention += f" (FA{fa_version})" if fa_version not in (unknown, None) else ""
    passes = read(cfg, "compilation_config", "pass_config")
    pass_flags = {k: v for k, v in vars(passes).items() if isinstance(v, bool)} if passes != unknown else {}
    sp = any(v for k, v in pass_flags.items() if k in ("enable_sp", "enable_sequence_parallelism")
             or "sequence_parallel" in k or "async_tp" in k or k == "fuse_gemm_comms")
    tp = read(cfg, "parallel_config", "tensor_parallel_size")
    spec_cfg = read(cfg, "speculative_config")
    sampler = "pytorch (vLLM's TopKTopPSampler)"
    if str(device).startswith("cuda"):
        sampler = "flashinfer (top-k/top-p)" if os.environ.get("VLLM_USE_FLASHINFER_SAMPLER", "1") != "0" \
            else "pytorch (vLLM's TopKTopPSampler)"
    keys = ("VLLM_BATCH_INVARIANT", "VLLM_ATTENTION_BACKEND", "VLLM_FLASH_ATTN_VERSION", "VLLM_USE_FLASHINFER_SAMPLER",
            "VLLM_CPU_ATTN_SPLIT_KV", "CUBLAS_WORKSPACE_CONFIG", "NCCL_ALGO", "NCCL_PROTO", "OMP_NUM_THREADS")
    return {
        "engine": "vllm", "device": device, "dtype": text(read(cfg, "model_config", "dtype")).removeprefix("torch."),
        "attention_backend": attention,
        "cuda_graphs": "off" if spec.enforce_eager else text(read(cfg, "compilation_config", "cudagraph_mode")),
        "cuda_graph_sizes": list(read(cfg, "compilation_config", "cudagraph_capture_sizes") or [])
        if not spec.enforce_eager and isinstance(read(cfg, "compilation_config", "cudagraph_capture_sizes"), list)
        else [],
        "compile_mode": "none (eager)" if spec.enforce_eager else text(read(cfg, "compilation_config", "mode")),
        "async_scheduling": text(read(cfg, "scheduler_config", "async_scheduling")),
        "chunked_prefill": text(read(cfg, "scheduler_config", "enable_chunked_prefill")),
        "prefix_caching": text(read(cfg, "cache_config", "enable_prefix_caching")),
        "spec_decoding": "none" if spec_cfg in (unknown, None) else text(getattr(spec_cfg, "method", spec_cfg)),
        "tensor_parallel": text(tp), "pipeline_parallel": text(read(cfg, "parallel_config", "pipeline_parallel_size")),
        "sequence_parallel": sp, "all_reduce": _agreed([r.get("all_reduce", unknown) for r in ranks]),
        "rank_devices": [r.get("device", unknown) for r in ranks] or unknown,
        "sampler": sampler, "kv_cache_dtype": text(read(cfg, "cache_config", "cache_dtype")),
        "quantization": text(getattr(getattr(cfg, "model_config", None), "quantization", None) or "none"),
        "linear_kernel": _agreed([r.get("linear_kernel", unknown) for r in ranks]),
        "env": {k: os.environ[k] for k in keys if k in os.environ},
    }


def _threads() -> dict[str, Any]:
    import os

    import torch

    keys = ("OMP_NUM_THREADS", "VLLM_CPU_ATTN_SPLIT_KV", "VLLM_BATCH_INVARIANT", "VLLM_CPU_OMP_THREADS_BIND")
    return {"torch_threads": torch.get_num_threads(), "env": {k: os.environ[k] for k in keys if k in os.environ}}


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
    from oracle.engines.vllm_worker import main as _main

    sys.exit(_main(sys.argv[1:]))
