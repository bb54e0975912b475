"""The vLLM worker process: one `vllm.LLMEngine` for one mode, stepped by hand, answering over a socket.

`python -m oracle.engines.vllm_worker FD` is started by `oracle.engines.vllm_engine.VllmEngine`
with the environment of its mode already set (VLLM_BATCH_INVARIANT, OMP_NUM_THREADS, ...), because
vLLM reads those once, at import and engine start, and `torch.library` overrides are process-wide.
FD is one end of a socket pair; messages are pickled tuples (`multiprocessing.connection`):

    parent -> worker: ("start", WorkerSpec) first, then ("generate", requests, max_num_batched_tokens),
                      ("localize", expected RunSpec, actual RunSpec),
                      ("capture_ranks", RunSpec, snapshot_at), ("reset_prefix_cache",), ("close",)
    worker -> parent: ("ready", info) | ("ok", result) | ("error", text) | ("config_error", text)

The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so this module steps it
itself: a request joins when the step counter reaches its `arrival_step`, and the scheduler's
output of every step is recorded as the evidence of what shared each forward pass.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from oracle.engines.contract import Completion, Request, SamplingParams, StepEvidence
from oracle.engines.vllm_posture import agreed, read_posture, threads
from oracle.engines.vllm_tap import Scheduled, SchedulerTap

_AUDIT_SAMPLING = SamplingParams(max_tokens=2, temperature=0.0, logits="none")

# Parts of vLLM's start, timed by wrapping its methods while the engine is built: the part, then the module, class
# and method (one a version lacks is left out). On CUDA vLLM 0.26 runs a dense model on its second model runner
# (vllm/v1/worker/gpu/), older versions and the CPU on the first. They nest: the KV cache's part holds the
# profile run and, on a GPU, the graph capture; torch.compile, where on, runs inside the profile run.
VLLM_START_PARTS: tuple[tuple[str, str, str, str], ...] = (
    ("vllm_load_model", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "load_model"),
    ("vllm_load_model", "vllm.v1.worker.gpu.model_runner", "GPUModelRunner", "load_model"),
    ("vllm_load_model", "vllm.v1.worker.cpu_model_runner", "CPUModelRunner", "load_model"),
    ("vllm_profile_run", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "profile_run"),
    ("vllm_profile_run", "vllm.v1.worker.gpu.model_runner", "GPUModelRunner", "profile_run"),
    ("vllm_graph_capture", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "capture_model"),
    ("vllm_graph_capture", "vllm.v1.worker.gpu.model_runner", "GPUModelRunner", "capture_model"),
    ("vllm_kv_cache_and_warmup", "vllm.v1.engine.core", "EngineCore", "_initialize_kv_caches"),
)
# Modules imported only on the platform they serve (importing them elsewhere may fail or set things up).
_CPU_ONLY, _CUDA_ONLY = ("vllm.v1.worker.cpu_model_runner",), ("vllm.v1.worker.gpu.model_runner",)


def _timed(original: Any, name: str, seconds: dict[str, float], depth: dict[str, int],
           clock: Callable[[], float]) -> Any:
    """`original` that adds its outermost calls' seconds to `seconds[name]`."""

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        outermost = depth.get(name, 0) == 0  # a subclass's method that calls its parent's counts once
        depth[name] = depth.get(name, 0) + 1
        began = clock()
        try:
            return original(*args, **kwargs)
        finally:
            depth[name] -= 1
            if outermost:
                seconds[name] = seconds.get(name, 0.0) + clock() - began

    return timed


@contextlib.contextmanager
def timed_vllm_parts(on_cpu: bool, clock: Callable[[], float] = time.perf_counter) -> Iterator[dict[str, float]]:
    """The seconds of `VLLM_START_PARTS` that run inside the block (vLLM's engine core in this process); the
    methods are vLLM's own again after it, whatever happens. `on_cpu`: vLLM's CPU platform."""
    seconds: dict[str, float] = {}
    depth: dict[str, int] = {}
    patched: list[tuple[type, str, Any]] = []
    try:
        for name, module, class_name, method in VLLM_START_PARTS:
            if module in (_CUDA_ONLY if on_cpu else _CPU_ONLY):
                continue
            try:
                cls = getattr(importlib.import_module(module), class_name)
            except Exception:  # noqa: BLE001 - a version without it: the part is left out
                continue
            original = cls.__dict__.get(method) if isinstance(cls, type) else None
            if not callable(original):
                continue
            setattr(cls, method, _timed(original, name, seconds, depth, clock))
            patched.append((cls, method, original))
        yield seconds
    finally:
        for cls, method, original in reversed(patched):
            setattr(cls, method, original)


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
    fixed_kv_cache: bool = False  # on CUDA, kv_cache_memory_bytes from the config (oracle.engines.vllm_memory)

    @property
    def uses_oracle_kernels(self) -> bool:
        return self.mode == "invariant" and self.invariance == "oracle_kernels"


class WorkerConfigError(Exception):
    """A setting vLLM rejected that the user chose (reported as a ConfigError by the parent)."""


class NotInForce(Exception):
    """Invariant mode's kernels are not in force in some rank (reported as KernelsNotInForce by the parent)."""


@dataclass
class _Track:
    """Per request of one generate call."""

    index: int
    out: Completion
    want: str  # "full" | "digest" | "none"
    prefill_passes: int = 0
    num_cached_tokens: int = 0

    def record_pass(self, step: int, seq_position: int, p: Scheduled, shape: dict[str, Any]) -> None:
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


def _pass_shape(passes: list[Scheduled]) -> dict[str, Any]:
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

    def __init__(self, spec: WorkerSpec, import_s: float | None = None) -> None:
        """`import_s`: how long vLLM's import took where it was done before (`main`, as the process started)."""
        began = time.perf_counter()
        import vllm
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        imported = time.perf_counter()

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
        if spec.fixed_kv_cache and "kv_cache_memory_bytes" not in kwargs:
            size = _fixed_kv_cache(spec, args)
            if size is not None:
                args.kv_cache_memory_bytes = size
                if "gpu_memory_utilization" not in spec.engine_args:
                    # With the cache given vLLM reads the share only to check the free memory as it starts, and the
                    # other engine may hold more than half of the GPU by then (set here too where the parent, with no
                    # GPU seen through NVML, left vLLM's default).
                    from oracle.engines.vllm_memory import FIXED_KV_GPU_MEMORY_UTILIZATION

                    args.gpu_memory_utilization = FIXED_KV_GPU_MEMORY_UTILIZATION
        fixed_kv = getattr(args, "kv_cache_memory_bytes", None)
        # Invariant mode's kernels come from oracle's vLLM plugin (oracle.engines.vllm_plugin), which vLLM runs
        # in this process and in every rank it starts; the environment (ORACLE_VLLM_KERNELS) asks for them.
        from vllm.platforms import current_platform

        with timed_vllm_parts(current_platform.is_cpu()) as vllm_parts:
            self.engine = LLMEngine.from_engine_args(args)
        built = time.perf_counter()
        # Where the start went (TimesItsStart, oracle.engines.contract): vLLM's import, its engine and parts of
        # that (`VLLM_START_PARTS`), and what this worker reads after (ranks, posture, the kernels' audit).
        start: dict[str, float] = {"import_vllm": (imported - began) + (import_s or 0.0), "vllm_engine": built - imported,
                                   **vllm_parts}
        client: Any = self.engine.engine_core  # an InprocClient with VLLM_ENABLE_V1_MULTIPROCESSING=0
        core = client.engine_core
        self.scheduler = core.scheduler
        self.tap = SchedulerTap(self.scheduler)
        self._sampled: list[tuple[str, list[int], Any]] = []  # this step's (vLLM's id, new tokens, logprobs)
        processor = self.engine.output_processor
        processor.process_outputs = self._read_core_outputs(processor.process_outputs)
        self.internal_ids: dict[str, str] = {}  # the caller's request id -> vLLM's
        self.vocab_size = int(self.engine.model_config.get_vocab_size())
        self.info: dict[str, Any] = {
            "engine_version": vllm.__version__, "vocab_size": self.vocab_size,
            "max_model_len": int(self.engine.model_config.max_model_len),
        }
        if fixed_kv is not None:  # given, or sized from the config (start_together): vLLM did not measure it
            self.info["kv_cache_memory_bytes"] = fixed_kv if isinstance(fixed_kv, int) else str(fixed_kv)
        self.info.update(threads())
        ranks = self._ranks()
        self.info["ranks"] = ranks
        self.info["linear_kernel"] = agreed([r["linear_kernel"] for r in ranks])
        if any("ops" in r for r in ranks):
            self.info["ops"] = ranks[0].get("ops")  # rank 0's, as a single-process engine reports them
        self.info["posture"] = read_posture(self.engine, spec.enforce_eager, ranks)
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
        start["worker_reads"] = time.perf_counter() - built
        self.info["start_seconds"] = {k: round(v, 3) for k, v in start.items()}

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
        """Stop the rank processes vLLM started (tensor or pipeline parallel > 1) now, rather than at interpreter
        exit, where nothing told them to go (a TP 2 worker then outlived the parent's grace period and was
        terminated). With one rank there are none: vLLM's engine lives in this process, whose end (`os._exit`,
        right after) releases all it holds, so its shutdown (1.1-1.7 s on the 2-core CPU) is not waited for."""
        if self.spec.tensor_parallel_size * self.spec.pipeline_parallel_size == 1:
            return
        with contextlib.suppress(Exception):
            self.engine.engine_core.shutdown()

    def reset_prefix_cache(self) -> bool:
        return bool(self.engine.reset_prefix_cache())

    def localize(self, expected: Any, actual: Any, repro_dir: str | None = None) -> dict[str, Any]:
        """Localize here: both runs captured per op, the op confirmed alone, the finding as JSON, or None. At TP 1
        in this process (`oracle.capture.localize_with`, `repro_dir` written); at TP > 1 in every rank
        (`oracle.engines.vllm_ranks`, no repro/).

        Only meaningful with `enforce_eager`: CUDA graphs and torch.compile run ops no dispatch mode sees.
        The answer: `op` (the finding as JSON, or None) and `seconds` (where the call's time went, at TP 1).
        """
        from pathlib import Path

        from oracle.capture import localize_with
        from oracle.engines.vllm_capture import in_process
        from oracle.timings import PhaseClock

        clock = PhaseClock()
        if self.spec.tensor_parallel_size > 1:
            from oracle.engines.vllm_ranks import localize_in_ranks

            found = localize_in_ranks(self, expected, actual)
        else:
            with in_process(self) as capture:
                found = localize_with(capture, expected, actual, eager=self.spec.enforce_eager,
                                      repro_dir=Path(repro_dir) if repro_dir else None, imports=("vllm",),
                                      clock=clock)
        return {"op": found.to_json() if found is not None else None, "seconds": clock.seconds}

    def capture_ranks(self, spec: Any, snapshot_at: Any = None) -> bytes:
        """`spec` captured in every rank (at TP 1 in this process), rank order: each rank's calls, passes and the
        target's completion, and the inputs of the call `snapshot_at` names where it asks for them. Pickled here
        by value: the connection's pickler would hand tensors over as shared-memory handles."""
        import pickle

        from oracle.capture.rows import RowCapture
        from oracle.engines.vllm_capture import in_process, targeting
        from oracle.engines.vllm_ranks import capture_all

        if self.spec.tensor_parallel_size > 1:
            with targeting(self) as state:
                captured, answers = capture_all(self, state, spec, snapshot_at)
            return pickle.dumps([{"calls": c.calls, "passes": c.passes, "completion": c.completion,
                                  "snapshot": a["snapshot"]} for c, a in zip(captured, answers, strict=True)])
        rows = RowCapture(snapshot_at=snapshot_at)
        with in_process(self) as capture:
            completion = capture(spec, rows)
        return pickle.dumps([{"calls": tuple(rows.calls), "passes": tuple(rows.passes), "completion": completion,
                              "snapshot": rows.snapshot.plain() if rows.snapshot is not None else None}])

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
        self._sampled = []
        try:
            self._run(requests, order, tracks, limit, max_num_batched_tokens)
        except BaseException:
            # Leave the engine empty for the next call, whatever stopped this one.
            self.engine.abort_request(list(tracks), internal=True)  # vLLM's own ids (it suffixes the caller's)
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
        """One engine step: the passes it ran recorded as evidence, the tokens it sampled as output (read from
        vLLM's engine core outputs, `_read_core_outputs`; the request outputs vLLM builds from them are not read)."""
        self.engine.step()
        self._record_passes(step, tracks)
        sampled, self._sampled = self._sampled, []
        for rid, token_ids, lp in sampled:
            t = tracks.get(rid)
            if t is None:
                raise RuntimeError(f"vLLM returned tokens for request {rid!r}, which this call did not add")
            self._record_tokens(t, token_ids, lp)

    def _read_core_outputs(self, process: Callable[..., Any]) -> Callable[..., Any]:
        """`process` (vLLM's `OutputProcessor.process_outputs`), first keeping each engine core output's new tokens
        and logprob arrays for `_step`, then handing vLLM the outputs without their logprobs.

        vLLM's output processor turns every logprob row into Python lists (`tolist`), each row as wide as the
        widest request of the step asked for: one target asking for the whole vocabulary made every filler's row
        vocabulary-wide, about half of a CPU trial's time at 128 fillers. The arrays are read here as they are;
        the numbers are the same ones the lists held. The tokens are read before vLLM's processor would trim any
        past a stop string: the worker's requests have none (`ignore_eos`, exactly `max_tokens`).
        """

        def read(outputs: list[Any], *args: Any, **kwargs: Any) -> Any:
            for o in outputs:
                if o.new_token_ids:
                    self._sampled.append((o.request_id, list(o.new_token_ids), o.new_logprobs))
                o.new_logprobs = None
            return process(outputs, *args, **kwargs)

        return read

    def _record_passes(self, step: int, tracks: dict[str, _Track]) -> None:
        for one in self.tap.take():
            shape = _pass_shape(list(one.values()))
            for position, (rid, p) in enumerate(one.items()):
                t = tracks.get(rid)
                if t is not None:
                    t.record_pass(step, position, p, shape)

    def _record_tokens(self, t: _Track, token_ids: list[int], lp: Any) -> None:
        """`token_ids`, this step's new tokens of one request, and `lp`, vLLM's `LogprobsLists` for them (a row per
        token: the sampled token's logprob first, then the top ones, as wide as the step's widest request)."""
        if lp is None:
            raise RuntimeError(f"request {t.out.request_id}: vLLM returned no logprobs for tokens {token_ids}")
        # A request that asked for k logprobs keeps the first k + 1 of its row, as vLLM's own lists do.
        width = None if t.want in ("full", "digest") else self.spec.logprobs + 1
        for j, token in enumerate(token_ids):
            ids = np.asarray(lp.logprob_token_ids[j][:width], dtype=np.int64)
            vals = np.asarray(lp.logprobs[j][:width], dtype=np.float32)  # float32 already; exact
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


def _fixed_kv_cache(spec: WorkerSpec, args: Any) -> int | None:
    """On CUDA: the KV cache this engine takes beside another one on the GPU (oracle.engines.vllm_memory), for the
    max_model_len vLLM derives; None elsewhere (vLLM's CPU cache is `kv_cache_space_gib` already)."""
    from pathlib import Path

    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return None
    from oracle.engines.vllm_memory import fixed_kv_cache_bytes
    from oracle.models.memory import gpu_total

    total = gpu_total()  # through NVML: no CUDA context in this process before vLLM makes its own
    if total is None:
        import torch

        total = int(torch.cuda.mem_get_info()[1])
    max_len: int | None = spec.max_model_len
    with contextlib.suppress(Exception):  # vLLM raises its own error for the config when it builds the engine
        max_len = int(args.create_model_config().max_model_len)  # what vLLM will serve, rope scaling and all
    # vLLM's own max_num_seqs: an engine_args value wins over the config's, and the cache is for what vLLM runs.
    return fixed_kv_cache_bytes(Path(spec.model), str(args.dtype), int(args.max_num_seqs or spec.max_num_seqs),
                                max_len, total, spec.tensor_parallel_size, int(getattr(args, "block_size", None) or 16))


def _mode_args(spec: WorkerSpec) -> dict[str, Any]:
    """The user's engine_args, with what invariant mode's oracle_kernels need of vLLM on CUDA where left unset
    (oracle.engines.vllm_coverage.oracle_kernels_args)."""
    if not spec.uses_oracle_kernels:
        return dict(spec.engine_args)
    from vllm.platforms import current_platform

    from oracle.engines.vllm_coverage import oracle_kernels_args

    if not current_platform.is_cuda():
        return dict(spec.engine_args)
    return oracle_kernels_args(spec.engine_args, spec.enforce_eager, spec.max_num_seqs)


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
            elif op == "capture_ranks":
                result = engine.capture_ranks(*msg[1:])
            elif op == "reset_prefix_cache":
                result = engine.reset_prefix_cache()
            else:
                raise ValueError(f"unknown message {op!r}")
        except Exception as e:  # noqa: BLE001 - reported to the parent, which raises EngineError
            conn.send(_reply(e))
            continue
        conn.send(("ok", result))


def _import_vllm() -> BaseException | None:
    """vLLM's modules the engine needs, imported before the worker is told what to build (a worker spawned ahead
    has this done while it waits); what stopped the import, to answer the start with."""
    try:
        import vllm  # noqa: F401
        from vllm import EngineArgs  # noqa: F401
        from vllm.v1.engine.llm_engine import LLMEngine  # noqa: F401
    except BaseException as e:  # noqa: BLE001 - the start's answer says it
        return e
    return None


def main(argv: Sequence[str]) -> int:
    conn = Connection(int(argv[0]))
    began = time.perf_counter()
    failed = _import_vllm()
    import_s = time.perf_counter() - began
    try:
        op, spec = conn.recv()
        if op != "start" or not isinstance(spec, WorkerSpec):
            raise ValueError(f"expected ('start', WorkerSpec), got {op!r}")
        if failed is not None:
            raise failed
        engine = WorkerEngine(spec, import_s=import_s)
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
