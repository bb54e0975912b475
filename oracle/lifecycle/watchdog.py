"""Calls into an engine with a deadline, and with every way out of it turned into an `EngineError`.

An engine runs in this process (native, transformers, a user's `package.module:Class`), so a
hang or a `sys.exit()` inside it would otherwise hang or end the run with no report. `call` runs
the function in a daemon thread and waits at most `timeout_s`; the main thread stays free to take
SIGINT/SIGTERM while it waits. A call that does not return in time is abandoned (its thread keeps
running until the process exits) and the run stops with exit 3, with a message naming the phase.

Every phase that drives an engine has a deadline from the config (`engine.timeout_s`, plus an
engine's own start timeout where it has one, see `start_timeout`):

| phase | deadline |
| --- | --- |
| start: the constructor (model load, worker handshake, server start and first probe) | `start_timeout(cfg)` |
| references, trials, repeats, recheck, shrink, prefill/decode, prefix cache: each generate call | `engine.timeout_s` |
| describe, reset_prefix_cache | `engine.timeout_s` |
| capture (one captured run, its warm-up run included) | `engine.timeout_s` per run |
| localize (in a run, and `oracle localize`): both captured runs and the confirmation | 3 x `engine.timeout_s` |
| close | `engine.timeout_s`; at most 30 s once a call was abandoned |

`engine.timeout_s: null` turns the watchdog off (the engines' own timeouts still apply).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from oracle.engines.contract import (
    Capabilities,
    Capturable,
    Completion,
    Engine,
    LocalizesInWorker,
    Mode,
    Request,
    ResetsPrefixCache,
    RunSpec,
    capabilities,
    localize_parts,
    run_generate,
    start_parts,
)
from oracle.errors import EngineError, OracleError, engine_error
from oracle.lifecycle.exit_trap import ENGINE_THREAD

if TYPE_CHECKING:
    from oracle.capture.rows import RowCapture
    from oracle.capture.rules import LocalizedOp
    from oracle.config import EngineConfig
    from oracle.engines.kinds import EngineKind

T = TypeVar("T")
CLOSE_AFTER_ABANDON_S = 30.0  # close() after an engine call was abandoned (a hang, a signal)
LOCALIZE_CALLS = 3  # localize runs both sides captured and confirms: up to three calls' worth of time
# Beyond an engine's own start timeout (a vLLM worker's or a started server's): stopping what it
# started after that timeout (a worker's stop takes up to 20 s) and its first probe.
START_GRACE_S = 60.0


def start_timeout(cfg: EngineConfig, row: EngineKind | None = None) -> tuple[float | None, str]:
    """The deadline of an engine's start (its constructor: model load, worker handshake, server start,
    first probe), and the fields it comes from.

    `engine.timeout_s`, plus the engine's own start timeout and a grace where it starts something
    that has one (a vLLM worker's `start_timeout_s`, a server started by `command`:
    `startup_timeout_s`), so that the engine's own, more precise error comes first. The first probe
    of a running server (`base_url`) gets `engine.timeout_s`. None when `engine.timeout_s` is null. `row`: the
    kind's, resolved by the plan (else looked up, a `module:Class` not imported: it has no start timeout).
    """
    if cfg.timeout_s is None:
        return None, "engine.timeout_s"
    if row is None:
        from oracle.engines.kinds import known_row

        row = known_row(cfg.kind)
    own = row.own_start_timeout(cfg) if row is not None else None
    if own is None:
        return cfg.timeout_s, "engine.timeout_s"
    name, seconds = own
    return cfg.timeout_s + seconds + START_GRACE_S, f"engine.timeout_s + engine.options.{name} + {START_GRACE_S:g} s"


def _as_engine_error(what: str, e: BaseException) -> OracleError:
    # A failure in generate reads the same guarded or not (oracle.execute.generate words it the same way).
    return engine_error(e, "" if what == "generate" else what)


class Worker:
    """One daemon thread that runs calls one at a time, so an engine sees the same thread every call
    (torch's OpenMP pool is per calling thread). After a call times out the thread is abandoned
    and the next call gets a new one."""

    def __init__(self) -> None:
        self.abandoned = False  # a call was left running (timed out or interrupted)
        self._thread: threading.Thread | None = None
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], list[Any], list[BaseException], threading.Event]] = (
            queue.SimpleQueue())

    def _loop(self) -> None:
        while True:
            fn, result, error, done = self._jobs.get()
            try:
                result.append(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                error.append(e)
            finally:
                done.set()

    def call(self, fn: Callable[[], T], timeout_s: float, what: str, during: str = "",
             limit: str = "engine.timeout_s") -> T:
        """`fn()` on this worker's thread, at most `timeout_s`; `during` names the phase in a timeout's
        message, `limit` the config field the deadline comes from."""
        if self._thread is None or not self._thread.is_alive():
            self._jobs = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._loop, name=ENGINE_THREAD, daemon=True)
            self._thread.start()
        result: list[T] = []
        error: list[BaseException] = []
        done = threading.Event()
        self._jobs.put((fn, result, error, done))
        try:
            finished = done.wait(timeout_s)
        except BaseException:
            self._thread = None  # interrupted while the call runs: never hand this thread more work
            self.abandoned = True
            raise
        if not finished:
            self._thread = None
            self.abandoned = True
            where = f" during {during}" if during else ""
            raise EngineError(f"engine {what} did not return within {timeout_s:g} s ({limit}){where}; "
                              "the run stopped there (raise the limit if the engine is only slow)")
        if error:
            failure = error[0]
            if isinstance(failure, KeyboardInterrupt):
                raise EngineError(f"engine raised KeyboardInterrupt in {what}") from failure
            raise _as_engine_error(what, failure) from failure
        return result[0]


def call(fn: Callable[[], T], timeout_s: float | None, what: str, worker: Worker | None = None,
         during: str = "", limit: str = "engine.timeout_s") -> T:
    """`fn()`, or EngineError when it raises, calls sys.exit() or runs past `timeout_s` seconds.

    With a deadline `fn` runs on `worker` (a fresh one when None); `timeout_s` None or 0 calls `fn`
    in this thread (exceptions still converted). KeyboardInterrupt (SIGINT/SIGTERM in this thread)
    propagates unchanged. `during` and `limit` word a timeout's message (the phase, the field).
    """
    if not timeout_s:
        try:
            return fn()
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - SystemExit and any engine failure become exit 3
            raise _as_engine_error(what, e) from e
    return (worker or Worker()).call(fn, timeout_s, what, during, limit)


class GuardedEngine:
    """An engine whose every call goes through `call` with the config's `engine.timeout_s`.

    It implements the whole contract (`oracle.engines.contract`): the required members, and each
    optional capability as a typed method or property that runs on the watchdog's thread under its
    limit. `capabilities` is what the wrapped engine declares, read once here; a capability it does
    not declare raises EngineError when called (ask `capabilities` first). Two capabilities stay
    with the engine itself: `localize_layout`, which the engine's own capture calls on the engine's
    thread (through the watchdog it would wait for itself), and forward-pass timing, which `oracle
    bench` reads from engines it drives without the watchdog.

    A generate call that runs past the limit names the phase it was in (the references, a trial,
    shrinking, ...), as its caller told it in `phase` (`oracle.execute.generate` does, before each call). `close()` never raises: a
    failure or a hang there is a note in the engine's description (the dict `describe()` last
    returned, which the report's environment holds) and in `close_error`.
    """

    def __init__(self, engine: Engine, timeout_s: float | None, worker: Worker | None = None) -> None:
        self.engine = engine
        self.timeout_s = timeout_s
        self.mode: Mode = engine.mode
        self.capabilities: Capabilities = capabilities(engine)
        self.close_error: str | None = None
        self._described: dict[str, Any] | None = None
        self._worker = worker or Worker()  # the thread that built the engine, when given
        self.phase = "a generate call"  # what the next generate call is for, as the caller says

    def _during(self, what: str) -> str:
        return f"the {self.mode} engine's {what}"

    def generate(self, requests: Sequence[Request], max_num_batched_tokens: int | None = None) -> list[Completion]:
        during = self._during(self.phase)
        return call(lambda: run_generate(self.engine, requests, max_num_batched_tokens), self.timeout_s, "generate",
                    self._worker, during)

    def describe(self) -> dict[str, Any]:
        described = call(self.engine.describe, self._cleanup_timeout(), "describe", self._worker,
                         self._during("describe()"))
        if not isinstance(described, dict):
            raise EngineError(f"engine describe() returned {type(described).__name__}, not a dict")
        self._described = described
        return described

    # --- optional capabilities (oracle.engines.contract), as the wrapped engine declares them ---

    @property
    def stop_at_eos(self) -> bool:
        """StopsAtEos: completions may end at EOS."""
        return self.capabilities.stop_at_eos

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """StopsAtEos: what a completion shorter than max_tokens must end with."""
        return self.capabilities.eos_token_ids

    @property
    def start_seconds(self) -> dict[str, float]:
        """TimesItsStart: the parts of the engine's start it measured (empty where it declares none, or its
        answer is not a mapping of names to finite numbers of seconds)."""
        return start_parts(self.engine) if self.capabilities.start_timing else {}

    @property
    def localize_seconds(self) -> dict[str, float]:
        """TimesItsLocalize: the parts of the engine's last localize call (empty where it declares none)."""
        return localize_parts(self.engine) if self.capabilities.localize_timing else {}

    @property
    def op_packages(self) -> tuple[str, ...]:
        """DeclaresOpPackages: modules a repro imports for the engine's custom ops."""
        return self.capabilities.op_packages

    def reset_prefix_cache(self) -> None:
        """ResetsPrefixCache, under `engine.timeout_s`."""
        engine = self.engine
        if not (self.capabilities.reset_prefix_cache and isinstance(engine, ResetsPrefixCache)):
            raise self._undeclared("reset_prefix_cache", "ResetsPrefixCache")
        call(engine.reset_prefix_cache, self.timeout_s, "reset_prefix_cache", self._worker,
             self._during("reset_prefix_cache()"))

    def capture(self, run: RunSpec, rows: RowCapture) -> Completion:
        """Capturable, on the watchdog's thread: `engine.timeout_s` per run (the warm-up one included)."""
        engine = self.engine
        if not (self.capabilities.capture and isinstance(engine, Capturable)):
            raise self._undeclared("capture", "Capturable")
        return self.guarded(lambda _: engine.capture(run, rows), "capture", calls=2 if run.warm_with else 1)

    def localize(self, expected: RunSpec, actual: RunSpec, repro_dir: Path | None = None) -> LocalizedOp | None:
        """LocalizesInWorker, allowed LOCALIZE_CALLS x `engine.timeout_s` (both runs and the confirmation)."""
        engine = self.engine
        if not (self.capabilities.localize and isinstance(engine, LocalizesInWorker)):
            raise self._undeclared("localize", "LocalizesInWorker")
        return self.guarded(lambda _: engine.localize(expected, actual, repro_dir), "localize", calls=LOCALIZE_CALLS)

    def _undeclared(self, method: str, protocol: str) -> EngineError:
        return EngineError(f"the {self.mode} engine has no {method}() (oracle.engines.contract.{protocol}); "
                           "ask its capabilities first")

    def guarded(self, fn: Callable[[Engine], T], what: str, calls: int = 1) -> T:
        """`fn(inner engine)` on the watchdog's thread, allowed `calls` times the per-call limit: for work
        that must drive the engine itself in one thread (per-op capture installs thread-local modes)."""
        if self._worker.abandoned:  # the abandoned call may still be driving the engine: never beside it
            raise EngineError(f"engine {what} not started: an earlier call on the {self.mode} engine was abandoned "
                              "and may still be running")
        timeout = None if self.timeout_s is None else self.timeout_s * calls
        limit = "engine.timeout_s" if calls == 1 else f"{calls} x engine.timeout_s"
        return call(lambda: fn(self.engine), timeout, what, self._worker, self._during(what), limit)

    def _cleanup_timeout(self) -> float | None:
        """After an abandoned call (a hang, a signal) the run is stopping: do not wait long for the rest."""
        if self._worker.abandoned:
            return min(self.timeout_s or CLOSE_AFTER_ABANDON_S, CLOSE_AFTER_ABANDON_S)
        return self.timeout_s

    def close(self) -> None:
        try:
            call(self.engine.close, self._cleanup_timeout(), "close", self._worker, self._during("close()"))
        except OracleError as e:
            self.close_error = str(e)
            if self._described is not None:
                self._described["close_error"] = str(e)


CLOSE_LATE_S = 30.0  # how long the run waits for an abandoned engine's close


def build_engine(cfg: EngineConfig, model_dir: Path, mode: Mode, *, worker: Worker | None = None,
                 row: EngineKind | None = None) -> Engine:
    """Build the engine `cfg.kind` for `mode` under the start deadline; EngineError naming the phase when
    it does not finish in time (or raises, or calls sys.exit()).

    The constructor runs on `worker`'s thread (a fresh one when None). An engine whose start was
    abandoned and that finishes starting later is closed at once, so a server or worker it started
    does not outlive the run's error. `row`: the kind's, resolved by the plan (else resolved in the
    constructor's thread, after the preloads).
    """
    from oracle.engines import construct_engine

    timeout, limit = start_timeout(cfg, row)
    lock = threading.Lock()
    given_up = False
    built: list[Engine] = []

    def construct() -> Engine:
        nonlocal given_up
        engine = construct_engine(cfg, model_dir, mode, row)
        with lock:  # finished and abandoned exclude each other: exactly one side closes a late engine
            late = given_up
            built.append(engine)
        if late:
            _close_quietly(engine)
        return engine

    if row is None:
        from oracle.engines.kinds import known_row

        row = known_row(cfg.kind)  # a module:Class is imported in the constructor's thread, after the preloads
    work = row.start_work if row is not None else f"{cfg.kind}'s constructor"
    try:
        return call(construct, timeout, "start", worker, f"the {mode} engine's start ({work})", limit)
    except BaseException:
        with lock:
            given_up = True
            late_engines = list(built)
        for engine in late_engines:  # finished in the instant the deadline passed: nobody else will close it
            _close_quietly(engine)
        raise


def _close_quietly(engine: Engine) -> None:
    """Close an engine the run gave up on, in a thread of its own for at most CLOSE_LATE_S: the run is
    already stopping with an error, and the server or worker it started must not outlive it."""
    def close() -> None:
        with contextlib.suppress(BaseException):
            engine.close()

    closer = threading.Thread(target=close, name="oracle-late-close", daemon=True)
    closer.start()
    closer.join(CLOSE_LATE_S)


def start_engine(cfg: EngineConfig, model_dir: Path, mode: Mode, row: EngineKind | None = None) -> GuardedEngine:
    """build_engine under the start deadline (`start_timeout`), with sys.exit() and stray exceptions while
    starting turned into EngineError, wrapped so that every later call has the watchdog. The engine
    is built on the thread that then runs its calls. `row`: the kind's, resolved by the plan."""
    worker = Worker()
    engine = build_engine(cfg, model_dir, mode, worker=worker, row=row)
    return GuardedEngine(engine, cfg.timeout_s, worker)
