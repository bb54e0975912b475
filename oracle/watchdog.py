"""Calls into an engine with a deadline, and with every way out of it turned into an `EngineError`.

An engine runs in this process (native, transformers, a user's `package.module:Class`), so a
hang or a `sys.exit()` inside it would otherwise hang or end the run with no report. `call` runs
the function in a daemon thread and waits at most `timeout_s`; the main thread stays free to take
SIGINT/SIGTERM while it waits. A call that does not return in time is abandoned (its thread keeps
running until the process exits) and the run stops with exit 3.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from oracle.errors import EngineError, OracleError

if TYPE_CHECKING:
    from oracle.config import EngineConfig
    from oracle.engines.base import Completion, Mode, Request

T = TypeVar("T")


def _as_engine_error(what: str, e: BaseException) -> OracleError:
    if isinstance(e, OracleError):
        return e
    if isinstance(e, SystemExit):
        return EngineError(f"engine called sys.exit({e.code!r}) in {what}")
    return EngineError(f"engine raised {type(e).__name__} in {what}: {e}")


def call(fn: Callable[[], T], timeout_s: float | None, what: str) -> T:
    """`fn()`, or EngineError when it raises, calls sys.exit() or runs past `timeout_s` seconds.

    `timeout_s` None or 0 calls `fn` in this thread (no deadline; exceptions still converted).
    KeyboardInterrupt (SIGINT/SIGTERM in this thread) propagates unchanged.
    """
    if not timeout_s:
        try:
            return fn()
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - SystemExit and any engine failure become exit 3
            raise _as_engine_error(what, e) from e
    result: list[T] = []
    error: list[BaseException] = []
    done = threading.Event()

    def target() -> None:
        try:
            result.append(fn())
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            error.append(e)
        finally:
            done.set()

    thread = threading.Thread(target=target, name=f"oracle-engine-{what}", daemon=True)
    thread.start()
    if not done.wait(timeout_s):
        raise EngineError(f"engine {what} did not return within {timeout_s:g} s (engine.timeout_s)")
    if error:
        failure = error[0]
        if isinstance(failure, KeyboardInterrupt):
            raise EngineError(f"engine raised KeyboardInterrupt in {what}") from failure
        raise _as_engine_error(what, failure) from failure
    return result[0]


class GuardedEngine:
    """An engine whose every call goes through `call` with the config's `engine.timeout_s`.

    `close()` never raises: a failure or a hang there is a note in the engine's description (the
    dict `describe()` last returned, which the report's environment holds) and in `close_error`.
    """

    def __init__(self, engine: Any, timeout_s: float | None) -> None:
        self.engine = engine
        self.timeout_s = timeout_s
        self.mode = engine.mode
        self.close_error: str | None = None
        self._described: dict[str, Any] | None = None

    def generate(self, requests: Sequence[Request], max_num_batched_tokens: int | None = None) -> list[Completion]:
        if max_num_batched_tokens is None:
            return call(lambda: self.engine.generate(requests), self.timeout_s, "generate")
        return call(lambda: self.engine.generate(requests, max_num_batched_tokens), self.timeout_s, "generate")

    def describe(self) -> dict[str, Any]:
        described = call(self.engine.describe, self.timeout_s, "describe")
        if not isinstance(described, dict):
            raise EngineError(f"engine describe() returned {type(described).__name__}, not a dict")
        self._described = described
        return described

    def close(self) -> None:
        try:
            call(self.engine.close, self.timeout_s, "close")
        except OracleError as e:
            self.close_error = str(e)
            if self._described is not None:
                self._described["close_error"] = str(e)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.engine, name)
        if not callable(attr):
            return attr
        return lambda *a, **k: call(lambda: attr(*a, **k), self.timeout_s, name)


def start_engine(cfg: EngineConfig, model_dir: Path, mode: Mode) -> GuardedEngine:
    """build_engine, with sys.exit() and stray exceptions while starting turned into EngineError,
    wrapped so that every later call has the watchdog."""
    from oracle.engines import build_engine

    engine = call(lambda: build_engine(cfg, model_dir, mode), None, "start")
    return GuardedEngine(engine, cfg.timeout_s)
