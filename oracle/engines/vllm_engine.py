"""The `vllm` engine adapter: vLLM's offline engine in a worker process of its own, one per mode.

vLLM reads `VLLM_BATCH_INVARIANT` once at start and `torch.library` overrides are global to a
process, so each mode gets a fresh worker (`oracle.engines.vllm_worker`) started with that mode's
environment; this process never imports vllm. The worker is a plain child process (not a
`multiprocessing` spawn), so a user's script needs no `__main__` guard, and it talks over a
socket pair with pickled messages. Every wait on it is bounded: a worker that dies or stops
answering becomes `EngineError`, never a hang.

What is compared: token ids, and vLLM's float32 log-probabilities. vLLM returns logprobs, not
logits, so with `sampling.logits: full` each `Completion.logits[i]` is the float32 log-softmax row
over the vocabulary, and `top2` holds the top two logprobs (their difference is the logit margin).

Config (`engine.kind: vllm`): the engine fields dtype, max_num_seqs, max_num_batched_tokens,
enable_chunked_prefill, enable_prefix_caching and num_threads (the worker's OMP_NUM_THREADS), and
`engine.options` typed as `oracle.engine_options.VllmOptions`:

    invariance: "oracle_kernels" | "vllm" | "none"   what invariant mode means (see `INVARIANCE`)
    logprobs: top-k logprobs per step when full rows are not asked for (>= 2, for the margin)
    split_kv: VLLM_CPU_ATTN_SPLIT_KV of the invariant worker (None: vLLM's default; production always has it)
    tensor_parallel_size, pipeline_parallel_size: vLLM's ranks and stages, one process each (docs/tensor-parallel.md)
    engine_args: extra `vllm.EngineArgs` fields; env: extra environment variables of the worker

Invariant mode's `oracle_kernels` reach every process that runs the model through oracle's vLLM plugin
(`oracle.engines.vllm_plugin`, entry point `vllm.general_plugins`), which this adapter turns on for the
invariant worker only (ORACLE_VLLM_KERNELS=1). Each rank reports what it runs when the engine starts; a rank
without the kernels stops the run there (`KernelsNotInForce`), before any trial.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oracle.config import EngineConfig
from oracle.engine_options import VllmOptions
from oracle.engines.contract import Completion, Mode, Request
from oracle.engines.vllm_plugin import ENV as KERNELS_ENV
from oracle.engines.vllm_plugin import PLUGIN_NAME
from oracle.engines.vllm_worker import WorkerSpec
from oracle.errors import ConfigError, EngineError
from oracle.lifecycle import tether

if TYPE_CHECKING:
    from oracle.capture.rules import LocalizedOp
    from oracle.engines.contract import RunSpec

INVARIANCE = {
    "oracle_kernels": "oracle_kernels in every rank (oracle's vLLM plugin: torch.library overrides; linear layers "
                      "moved from oneDNN to aten so the overrides reach them; checked per rank at start)",
    "vllm": "VLLM_BATCH_INVARIANT=1 (vLLM's own batch-invariant kernels)",
    "none": "none (invariant mode runs vLLM's default kernels)",
}
_LOG_TAIL_LINES = 15
_STOP_GRACE_S = 10.0  # a worker asked to close may take this long before it is terminated, then killed


def _invariant_env(options: VllmOptions) -> dict[str, str]:
    """What invariant mode sets for vLLM before the user's `env` (which may override it)."""
    env = {}
    if options.invariance == "vllm":
        env["VLLM_BATCH_INVARIANT"] = "1"
    # An invariant-mode setting: production keeps vLLM's default (split-KV attention, splits chosen from
    # the batch), or it would run the invariant path and could never diverge (negative control vacuous).
    if options.split_kv is not None:
        env["VLLM_CPU_ATTN_SPLIT_KV"] = "1" if options.split_kv else "0"
    return env


def _ask_for_kernels(env: dict[str, str]) -> None:
    """Ask oracle's vLLM plugin for the kernels in every process of the worker (oracle.engines.vllm_plugin)."""
    env.setdefault(KERNELS_ENV, "1")
    allowed = env.get("VLLM_PLUGINS")
    if allowed is not None and PLUGIN_NAME not in allowed.split(","):
        # An allowlist of vLLM plugins would leave ours out of every rank.
        env["VLLM_PLUGINS"] = ",".join(p for p in (*allowed.split(","), PLUGIN_NAME) if p)


def _option(name: str) -> str:
    return f"engine.options.{name}"


# Triton asked to launch a kernel with no driver for the device: `RuntimeError: 0 active drivers ([]). There
# should only be one.` (vLLM on a CPU under VLLM_BATCH_INVARIANT=1, whose placeholder kernels reach Triton).
_NO_TRITON_DRIVER = re.compile(r"\b0 active drivers\b|active driver", re.IGNORECASE)


def start_failure_reason(text: str) -> str:
    """What a vLLM worker's start failure means where it is known (appended to the error), else ''."""
    if _NO_TRITON_DRIVER.search(text):
        return ("; vLLM's own invariant mode (VLLM_BATCH_INVARIANT=1, engine.options.invariance: vllm) launched a "
                "Triton kernel where Triton has no driver (vLLM on a CPU swaps in placeholder kernels, the class of "
                "vLLM #37546): it cannot run here; use ours instead: `invariance: oracle_kernels` under "
                "engine.options")
    return ""


class KernelsNotInForce(EngineError):
    """Invariant mode claims oracle_kernels but some rank runs default kernels: the run stops before any trial
    is judged (exit 3), never reads as an invariance failure or a pass."""


_PARALLEL = ("tensor_parallel_size", "pipeline_parallel_size")


def parallel_sizes(options: VllmOptions) -> tuple[int, int, dict[str, Any]]:
    """(tensor_parallel_size, pipeline_parallel_size, the other engine_args): the sizes are first-class fields,
    also accepted under `engine_args` (validated the same); set in both places they must agree."""
    args = dict(options.engine_args)
    sizes = []
    for name in _PARALLEL:
        value: Any = getattr(options, name)
        if name in args:
            given = args.pop(name)
            if isinstance(given, bool) or not isinstance(given, int) or given < 1:
                raise ConfigError(f"{_option('engine_args.' + name)}: expected an integer >= 1, got {given!r}")
            if name in options.model_fields_set and given != value:
                raise ConfigError(f"{_option(name)} is {value} but {_option('engine_args.' + name)} is {given}; "
                                  "set it once")
            value = given
        sizes.append(value)
    return sizes[0], sizes[1], args


def check_host_runs(tp: int, pp: int) -> None:
    """A size this host cannot run is a config error naming the field: one GPU per rank on CUDA, one core per
    rank on the CPU (vLLM's CPU build binds each rank's threads to cores of its own)."""
    import torch

    if torch.cuda.is_available():
        have, what = torch.cuda.device_count(), "GPUs"
    else:
        have, what = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1), \
            "CPU cores"
    if tp * pp <= have:
        return
    name = "tensor_parallel_size" if tp > have or pp == 1 else "pipeline_parallel_size"
    raise ConfigError(f"{_option(name)}: tensor_parallel_size {tp} x pipeline_parallel_size {pp} needs "
                      f"{tp * pp} {what}, one per rank; this host has {have}")


class VllmEngine:
    """Implements `oracle.engines.contract.Engine` over a vLLM worker process, with the optional
    capabilities ResetsPrefixCache and LocalizesInWorker.

    Configured by `config`: engine.dtype, max_num_seqs, max_num_batched_tokens, enable_chunked_prefill,
    enable_prefix_caching, num_threads (the worker's OMP_NUM_THREADS) and `VllmOptions` (the config's
    defaults when None).
    """

    def __init__(self, model: Path | str, mode: Mode, config: EngineConfig | None = None) -> None:
        config = config or EngineConfig.of("vllm")
        options = config.options_as(VllmOptions)
        model_dir = Path(model)
        if not (model_dir / "config.json").is_file():
            raise ConfigError(f"vllm engine: {model_dir} holds no config.json (an HF-format checkpoint directory)")
        self.mode: Mode = mode
        tp, pp, engine_args = parallel_sizes(options)
        check_host_runs(tp, pp)
        self.spec = WorkerSpec(
            model=str(model_dir), mode=mode, invariance=options.invariance, dtype=config.dtype,
            max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
            enable_chunked_prefill=config.enable_chunked_prefill, enable_prefix_caching=config.enable_prefix_caching,
            logprobs=options.logprobs, enforce_eager=options.enforce_eager, max_model_len=options.max_model_len,
            seed=options.seed, audit=options.audit, engine_args=engine_args,
            tensor_parallel_size=tp, pipeline_parallel_size=pp, fixed_kv_cache=options.start_together,
        )
        self.timeout_s = options.timeout_s
        self.start_timeout_s = options.start_timeout_s
        self.env = self._worker_env(mode, options, config.num_threads)
        self._worker: _Worker | None = None
        # A compiled engine localizes in an eager twin (`localize`): kept for the localizations that follow, the
        # compiled worker parked meanwhile and started again only when a request needs it (`_live`).
        self._twin: _Worker | None = None
        self._closed = False
        self.localize_seconds: dict[str, float] = {}  # TimesItsLocalize: the last localize call's parts
        # On a GPU a compiled engine's eager twin gets its vLLM import done while the engine runs (`_Spares`), where
        # each KV cache is given: no vLLM start on the GPU then measures memory that another process's import might
        # touch. (Production's start, which waits for invariant's engine where vLLM measures, is not spawned ahead:
        # not shown on a GPU that an import leaves vLLM's memory profiling in another process alone.)
        fixed_kv = options.start_together or "kv_cache_memory_bytes" in engine_args
        self._twin_ahead = not options.enforce_eager and fixed_kv and _sees_a_gpu()
        self._worker = _Worker.start(self.spec, self.env, self.start_timeout_s)
        self._info = self._worker.info  # what the worker found at start; describe() works after close()
        if self._twin_ahead:
            _SPARES.spawn(self.env)

    @staticmethod
    def _worker_env(mode: Mode, options: VllmOptions, threads: int | None) -> dict[str, str]:
        env = dict(os.environ)
        for name in ("VLLM_BATCH_INVARIANT", "VLLM_ENABLE_V1_MULTIPROCESSING", KERNELS_ENV):
            env.pop(name, None)  # the mode decides these, not the caller's shell
        env.update({
            # In-process engine core: starts in seconds, and this worker can step it itself.
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_CPU_KVCACHE_SPACE": str(options.kv_cache_space_gib),
            "VLLM_LOGGING_LEVEL": options.log_level,
            "TOKENIZERS_PARALLELISM": "false",
        })
        if threads is not None:
            env["OMP_NUM_THREADS"] = str(threads)
        if mode == "invariant":
            env.update(_invariant_env(options))
        env.update({str(k): str(v) for k, v in options.env.items()})
        if mode == "invariant" and options.invariance == "oracle_kernels":
            _ask_for_kernels(env)
        return env

    @property
    def start_seconds(self) -> dict[str, float]:
        """TimesItsStart: where the first worker's start went (oracle.engines.vllm_worker): `import_vllm`,
        `vllm_engine` and, of that, `vllm_load_model`, `vllm_kv_cache_and_warmup` (with `vllm_profile_run` and
        `vllm_graph_capture` inside it), then `worker_reads`."""
        return dict(self._info.get("start_seconds", {}))

    def describe(self) -> dict[str, Any]:
        s = self.spec
        info = self._info
        out: dict[str, Any] = {
            "engine": "vllm",
            "engine_version": info.get("engine_version"),
            # The device the worker's vLLM resolved (cpu or cuda), not assumed.
            "device": info.get("posture", {}).get("device", "unknown"),
            "dtype": s.dtype,
            "invariance_mechanism": INVARIANCE[s.invariance] if self.mode == "invariant" else
            "none (vLLM's default kernels)",
            "logits": "float32 logprob rows (vLLM returns log-softmax, not raw logits)",
            "max_num_seqs": s.max_num_seqs,
            "max_num_batched_tokens": s.max_num_batched_tokens,
            "enable_chunked_prefill": s.enable_chunked_prefill,
            "enable_prefix_caching": s.enable_prefix_caching,
            "enforce_eager": s.enforce_eager,
            "tensor_parallel_size": s.tensor_parallel_size,
            "pipeline_parallel_size": s.pipeline_parallel_size,
            "budget_per_call": "scheduler max_num_scheduled_tokens, up to max_num_batched_tokens",
            "linear_kernel": info.get("linear_kernel"),
            "torch_threads": info.get("torch_threads"),
            "worker_env": info.get("env", {}),
        }
        if "gpu_memory_utilization" in s.engine_args:  # set by the user, or halved beside the other mode's engine
            out["gpu_memory_utilization"] = s.engine_args["gpu_memory_utilization"]
        if "kv_cache_memory_bytes" in info:  # a KV cache of a given size, not measured from the free memory
            out["kv_cache_memory_bytes"] = info["kv_cache_memory_bytes"]
        if "posture" in info:
            out["posture"] = {**info["posture"], "engine_version": info.get("engine_version"),
                              "invariance_mechanism": out["invariance_mechanism"]}
        if "covered_ops" in info:
            out["covered_ops"] = info["covered_ops"]
        if "coverage" in info:  # what runs each class of ops in invariant mode, as the ranks read it
            out["coverage"] = info["coverage"]
        if "ops" in info:
            out["ops"] = info["ops"]
        if "ranks" in info:  # each rank's own account: device, kernels registered, linear kernels, all-reduce, ops
            out["ranks"] = [{k: v for k, v in r.items() if k != "linear_counts"} for r in info["ranks"]]
        return out

    def generate(self, requests: Sequence[Request], max_num_batched_tokens: int | None = None) -> list[Completion]:
        """Run the requests in the worker; each joins at engine step `arrival_step`."""
        if max_num_batched_tokens is not None and max_num_batched_tokens > self.spec.max_num_batched_tokens:
            # The worker's buffers are sized for the engine's budget; a larger one needs a restart.
            raise ConfigError(
                f"schedule.max_num_batched_tokens: a trial asks for {max_num_batched_tokens} tokens per pass but the vllm "
                f"engine was built for {self.spec.max_num_batched_tokens}; raise "
                f"{_option('max_num_batched_tokens')} to at least the schedule's maximum")
        if not self.spec.enable_chunked_prefill:
            limit = max_num_batched_tokens or self.spec.max_num_batched_tokens
            long = next((r for r in requests if len(r.prompt_token_ids) > limit), None)
            if long is not None:
                raise ConfigError(
                    f"{_option('enable_chunked_prefill')}: request {long.request_id} has a "
                    f"{len(long.prompt_token_ids)}-token prompt, over the {limit}-token budget; enable "
                    "chunked prefill or raise the budget")
        if len({r.request_id for r in requests}) != len(requests):
            raise ConfigError("vllm engine: request ids within one generate call must be unique")
        result = self._live().call(("generate", list(requests), max_num_batched_tokens), self.timeout_s)
        return list(result)

    def localize(self, expected: RunSpec, actual: RunSpec, repro_dir: Path | None = None) -> LocalizedOp | None:
        """Localize in the worker (oracle.capture): both runs captured per op, the op confirmed alone there,
        `repro_dir` written there.

        CUDA graphs and torch.compile hide ops from capture, so an engine built without
        `enforce_eager` localizes in a second, eager worker (`eager_twin`): the compiled one is stopped
        to leave it the device, the twin is kept for the localizations that follow (a run localizes its
        shrunk trial and its first failing one back to back), and the compiled worker starts again only
        when a request needs it, the twin stopped first. The result says it was eager and whether the
        eager rerun still diverged.
        """
        from oracle.capture.rules import LocalizedOp

        self.localize_seconds = {}
        stages = self.spec.pipeline_parallel_size
        if stages > 1:
            # Each rank captures its own passes, but a pipeline stage holds only some layers and hands its
            # activations on: the rule across stages is not built. Said, never silently nothing.
            return LocalizedOp(
                # The narrowest bound known is the whole model; -1: no forward pass was captured.
                module="model", op=f"not captured across the {stages} pipeline stages", layer=None, forward_pass=-1,
                engine_step=None, positions=(), shape=(), ulp=None, max_abs_diff=None, inputs_equal=None,
                status="inconclusive", eager=self.spec.enforce_eager,
                note=f"not localized: the model runs in {stages} pipeline stages (pipeline_parallel_size {stages}) "
                     "and the vllm engine captures every tensor-parallel rank, not across stages; replay the "
                     "trial at pipeline_parallel_size 1 to localize it")
        msg = ("localize", expected, actual, str(repro_dir) if repro_dir is not None else None)
        if self.spec.enforce_eager:
            return self._found(self._live().call(msg, self.timeout_s))
        t0 = time.perf_counter()
        started = self._twin is None
        twin = self._eager_twin()
        if started:
            self.localize_seconds["eager_twin_start"] = time.perf_counter() - t0
        try:
            found = twin.call(msg, self.timeout_s)
        except EngineError:
            if twin.proc.poll() is not None:  # died, or killed as stuck: the next localization starts another
                self._stop_twin()
            raise  # else the twin answered with an error and stays for the next
        except BaseException:
            self._stop_twin()  # interrupted mid-call: its reply may still be on the way
            raise
        return self._found(found)

    def _found(self, answer: dict[str, Any]) -> LocalizedOp | None:
        """The worker's localize answer: the finding, its parts added to `localize_seconds`."""
        from oracle.capture.rules import LocalizedOp

        self.localize_seconds.update(answer.get("seconds") or {})
        op = answer.get("op")
        return LocalizedOp.from_json(op) if op is not None else None

    def _eager_twin(self) -> _Worker:
        """The eager twin, started now (the compiled worker stopped first) unless it is running."""
        if self._closed:
            raise EngineError("vllm engine is closed")
        if self._twin is None:
            worker, self._worker = self._worker, None
            if worker is not None:
                worker.stop()
            self._twin = _Worker.start(eager_twin(self.spec), self.env, self.start_timeout_s)
        return self._twin

    def _stop_twin(self) -> None:
        twin, self._twin = self._twin, None
        if twin is not None:
            twin.stop()

    def capture_ranks(self, run: RunSpec, snapshot_at: Any = None) -> list[dict[str, Any]]:
        """`run` captured in every rank, in the worker (`CapturesRanks`, oracle.engines.contract)."""
        if not self.spec.enforce_eager:
            raise EngineError("vllm engine: capturing every rank needs enforce_eager (CUDA graphs and "
                              "torch.compile run ops no capture sees)")
        import pickle

        return list(pickle.loads(self._live().call(("capture_ranks", run, snapshot_at), self.timeout_s)))

    def reset_prefix_cache(self) -> None:
        """Forget every cached block (the next requests run cold)."""
        if not self._live().call(("reset_prefix_cache",), self.timeout_s):
            raise EngineError("vllm worker: reset_prefix_cache refused (requests still running)")

    def close(self) -> None:
        self._closed = True
        self._stop_twin()
        spare = _SPARES.take(self.env) if self._twin_ahead else None
        if spare is not None:  # the twin's, spawned ahead and not needed
            spare.stop()
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop()

    def _live(self) -> _Worker:
        """The engine's own worker; started again (the eager twin stopped first) if a localization parked it."""
        if self._closed:
            raise EngineError("vllm engine is closed")
        if self._worker is None:
            self._stop_twin()
            self._worker = _Worker.start(self.spec, self.env, self.start_timeout_s)
        return self._worker


class _Worker:
    """A running worker process and its end of the socket pair; every wait has a deadline."""

    def __init__(self, proc: subprocess.Popen[bytes], conn: Connection, log_path: Path) -> None:
        self.proc, self.conn, self.log_path = proc, conn, log_path
        self.info: dict[str, Any] = {}
        self.keep_log = False
        # Kill the process if the engine is dropped without close(), or at interpreter exit.
        self._finalizer = weakref.finalize(self, _kill, proc, conn)

    @classmethod
    def start(cls, spec: WorkerSpec, env: dict[str, str], timeout_s: float) -> _Worker:
        """A worker for `spec`, started: one spawned ahead for this environment (`_Spares`) where there is one,
        else spawned now; it imports vLLM as it starts, before it is told what to build."""
        worker = _SPARES.take(env) or cls.spawn(env)
        try:
            worker.send(("start", spec), timeout_s)
            worker.info = worker.wait(timeout_s, "start", expect="ready")
        except BaseException:
            worker.stop()
            raise
        return worker

    @classmethod
    def spawn(cls, env: dict[str, str]) -> _Worker:
        """The worker's process, started in `env`: it imports vLLM, then waits for its ("start", spec)."""
        ours, theirs = socket.socketpair()
        fd, log_name = tempfile.mkstemp(prefix="oracle-vllm-", suffix=".log")
        try:
            with os.fdopen(fd, "wb") as log:
                # Tethered: the worker (and vLLM's engine-core processes) die with this process.
                proc = tether.popen(
                    [*tether.python(), "-m", "oracle.engines.vllm_worker", str(theirs.fileno())],
                    env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    pass_fds=(theirs.fileno(),),
                )
        except OSError as e:
            ours.close()
            raise EngineError(f"vllm worker failed to start: {e}") from e
        finally:
            theirs.close()
        return cls(proc, Connection(ours.detach()), Path(log_name))

    def send(self, msg: tuple[Any, ...], timeout_s: float) -> None:
        """Send `msg`; a worker that does not take it within `timeout_s` (alive but not reading) is killed."""
        with contextlib.suppress(OSError):
            tether.socket_timeouts(self.conn.fileno(), timeout_s)
        try:
            self.conn.send(msg)
        except BlockingIOError as e:
            raise self._stuck(f"{msg[0]}: the worker did not take the request", timeout_s) from e
        except OSError as e:
            raise self._dead(f"{msg[0]}: cannot send ({e})") from e

    def call(self, msg: tuple[Any, ...], timeout_s: float) -> Any:
        self.send(msg, timeout_s)
        return self.wait(timeout_s, str(msg[0]))

    def wait(self, timeout_s: float, what: str, expect: str = "ok") -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._stuck(f"no answer to {what}", timeout_s)
            reply = self._receive(left, timeout_s, what)
            if reply is None:
                if self.proc.poll() is not None:
                    raise self._dead(what)
                continue
            kind, payload = reply
            if kind == expect:
                return payload
            raise self._refusal(kind, payload, what)

    def _receive(self, left: float, timeout_s: float, what: str) -> Any:
        """The worker's next reply, or None when none began within a second (or what is `left`)."""
        try:
            if not self.conn.poll(min(left, 1.0)):
                return None
            # A reply has begun: the rest of it must come within what is left.
            with contextlib.suppress(OSError):
                tether.socket_timeouts(self.conn.fileno(), max(left, 1.0))
            return self.conn.recv()
        except BlockingIOError as e:
            raise self._stuck(f"{what}: the reply stopped half-way", timeout_s) from e
        except (EOFError, OSError) as e:
            raise self._dead(what) from e

    def _refusal(self, kind: str, payload: Any, what: str) -> Exception:
        """The error a reply other than the one expected stands for."""
        if kind == "not_in_force":
            self.keep_log = True
            return KernelsNotInForce(f"vllm worker: invariant mode's oracle_kernels are not in force, so no "
                                     f"trial was run: {payload}")
        if kind == "config_error":
            return ConfigError(f"{_option('engine_args')}: vLLM rejected it: {payload}")
        if kind == "error":
            self.keep_log = True
            why = start_failure_reason(str(payload)) if what == "start" else ""
            return EngineError(f"vllm worker: {what} failed: {payload}{why}; traceback in {self.log_path}")
        return EngineError(f"vllm worker: unexpected reply {kind!r} to {what}")

    def _stuck(self, what: str, timeout_s: float) -> EngineError:
        """Kill a worker that is alive but stopped answering; the error names what it stopped at."""
        _kill(self.proc, self.conn)
        return EngineError(f"vllm worker: {what} within {timeout_s:g} s; killed it{self._log_tail()}")

    def _dead(self, what: str) -> EngineError:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        tail = self._log_tail()
        why = start_failure_reason(tail) if what == "start" else ""
        return EngineError(f"vllm worker died during {what} (exit code {self.proc.returncode}){why}{tail}")

    def _log_tail(self) -> str:
        self.keep_log = True
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        tail = "\n".join(lines[-_LOG_TAIL_LINES:])
        return f"\n--- worker log {self.log_path} (last {_LOG_TAIL_LINES} lines) ---\n{tail}" if tail else ""

    def stop(self) -> None:
        """Ask the worker to exit; terminate, then kill, if it does not within a few seconds. Never blocks
        longer than that (a worker that no longer reads its socket cannot hold up the send) and never raises."""
        with contextlib.suppress(OSError, ValueError):
            tether.socket_timeouts(self.conn.fileno(), 1.0)
            self.conn.send(("close",))
        try:
            self.proc.wait(timeout=_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=5)
        self._finalizer()
        if self.proc.returncode == 0 and not self.keep_log:
            with contextlib.suppress(OSError):
                self.log_path.unlink()


def _sees_a_gpu() -> bool:
    """Whether NVML sees a GPU here (vLLM's worker then runs on it)."""
    from oracle.models import memory

    return memory.gpus_free() is not None


class _Spares:
    """Worker processes spawned ahead, one per environment: vLLM imported, waiting for a start.

    A start that must wait (the eager twin, for the compiled worker to stop) has its import done meanwhile. A spare
    nobody takes dies with this process (tethered, and killed at exit like any worker)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: dict[tuple[tuple[str, str], ...], _Worker] = {}

    def spawn(self, env: dict[str, str]) -> None:
        key = tuple(sorted(env.items()))
        with self._lock:
            if key in self._ready and self._ready[key].proc.poll() is None:
                return
        try:
            worker = _Worker.spawn(env)
        except EngineError:
            return  # the start itself will say why
        with self._lock:
            old, self._ready[key] = self._ready.get(key), worker
        if old is not None:
            old.stop()

    def take(self, env: dict[str, str]) -> _Worker | None:
        """The spare for `env`, if one is alive (a dead one is cleared: the start spawns anew and says why)."""
        with self._lock:
            worker = self._ready.pop(tuple(sorted(env.items())), None)
        if worker is not None and worker.proc.poll() is not None:
            worker.stop()
            return None
        return worker

    def clear(self) -> None:
        with self._lock:
            workers, self._ready = list(self._ready.values()), {}
        for worker in workers:
            worker.stop()


_SPARES = _Spares()


def _kill(proc: subprocess.Popen[bytes], conn: Connection) -> None:
    # The whole group: the tether, the worker and the processes vLLM started (the tether leads it).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if proc.poll() is None:  # a process that leads no group of its own
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    tether.release(proc)
    conn.close()


def eager_twin(spec: WorkerSpec) -> WorkerSpec:
    """The worker spec to localize a compiled engine in: eager, with the custom ops the compiled one runs.

    Compiled (Inductor) vLLM turns its custom ops off (`custom_ops: ["none"]`: RMSNorm, rotary and
    the rest run their torch code, which `VLLM_BATCH_INVARIANT` covers); an eager engine turns them
    on, and their CUDA kernels are other kernels (vLLM's `fused_add_rms_norm` picks its block size by
    the number of tokens). The eager twin keeps the compiled choice unless the config set one.
    """
    args = dict(spec.engine_args)
    compilation = dict(args.get("compilation_config") or {})
    custom = list(compilation.get("custom_ops") or [])
    if not any(c in ("all", "none") for c in custom):
        compilation["custom_ops"] = ["none", *custom]
        args["compilation_config"] = compilation
    return replace(spec, enforce_eager=True, audit=False, engine_args=args)
