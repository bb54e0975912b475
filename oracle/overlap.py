"""Two modes' engines at once: the second mode's engine starts while the first mode runs.

The modes are independent until the judge reads them, so where the engine lives in processes of its own
(the kind's row says: `EngineKind.starts_apart`; vLLM's worker, a server each mode starts) production's
engine is started on a thread of its own as soon as invariant mode's engine is up, and is handed to
production's execution when invariant mode is done. The modes never share a process, a cache or an engine:
each is built by its own call, for its own mode. Where the row allows it (`starts_together`: vLLM on a CPU)
both starts run at once; else the second waits for the first engine to be up, because vLLM reads the free
GPU memory while it starts and two starts would each count the other's allocations as their own.
Everything else runs in the order of a sequential run, so the report is the same but for its timings.

A fault ends as it would have in a sequential run: a second start that fails is raised when production's
execution takes its engine (after invariant mode completed, as a sequential run would have met it); a fault
in invariant mode stops the run and the second engine, started or starting, is closed. `ORACLE_OVERLAP=0`
turns it off.

Timings (`timings`): `{mode}_engine_start_s` stays the engine's own start; `overlap_s` is how much of the
second start ran while the first mode ran, `{mode}_start_wait_s` what of it the run still waited for.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from oracle.engines.contract import Engine, Mode

if TYPE_CHECKING:
    from oracle.plan import Plan

ENV = "ORACLE_OVERLAP"  # "0": start each mode's engine after the previous one closed


def turned_off() -> bool:
    """`ORACLE_OVERLAP=0` (or false, no, off): every mode after the one before, as a sequential run."""
    return os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off")


def production_localizes(plan: Plan) -> bool:
    """Production mode may localize drift (oracle.execute: drift localized, unsharded). Such a mode does not run
    beside invariant mode (oracle.forked_mode, oracle.threaded_mode): the run's one `repro/` is the first localized
    op's, which only the order of a sequential run tells."""
    drift = plan.config.checks.drift
    return drift.requirement != "off" and drift.localize != "off" and plan.shard is None


def overlaps(plan: Plan, modes: list[Mode]) -> bool:
    """Whether this run starts the second mode's engine while the first runs: two modes, a kind whose engines
    live apart, and not turned off."""
    if turned_off():
        return False
    return len(modes) == 2 and plan.engine.starts_apart(plan.config.engine)


class EarlyStart:
    """The second mode's engine, started on a thread of its own once the first mode's engine is up.

    `first(build)` is the first mode's builder that sets the second start off when it returns; `take` is the
    second mode's builder: it waits for the engine started early and hands it over, or raises what its start
    raised. `close()` closes an engine nobody took (the first mode failed), now or when its start ends."""

    def __init__(self, build: Callable[[Mode], Engine], second: Mode) -> None:
        self.build, self.second = build, second
        self.start_s = 0.0  # the second engine's own start
        self.wait_s = 0.0  # what of it the run waited for
        self._engine: Engine | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    def first(self, build: Callable[[Mode], Engine]) -> Callable[[Mode], Engine]:
        def started(mode: Mode) -> Engine:
            engine = build(mode)
            self._begin()
            return engine

        return started

    def begin(self) -> None:
        """Start the second engine now (both starts at once)."""
        self._begin()

    def _begin(self) -> None:
        if self._thread is not None:  # the first mode's second engine (cross_instance) starts nothing more
            return
        self._thread = threading.Thread(target=self._start, name=f"oracle-start-{self.second}", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        t0 = time.perf_counter()
        engine: Engine | None = None
        try:
            engine = self.build(self.second)
        except BaseException as e:  # noqa: BLE001 - handed to the execution that takes the engine
            self._error = e
        self.start_s = time.perf_counter() - t0
        with self._lock:
            self._engine = engine
            late = self._closed
        if late and engine is not None:
            _close_quietly(engine)

    def take(self, mode: Mode) -> Engine:
        """The second mode's builder: the engine started early (started now if the first mode started none)."""
        if self._thread is None:
            self._begin()
        assert self._thread is not None
        t0 = time.perf_counter()
        while self._thread.is_alive():  # short waits: the main thread stays free to take SIGINT/SIGTERM
            self._thread.join(0.1)
        self.wait_s = time.perf_counter() - t0
        if self._error is not None:
            raise self._error
        with self._lock:
            engine, self._engine = self._engine, None
        assert engine is not None
        return engine

    @property
    def overlap_s(self) -> float:
        return max(0.0, self.start_s - self.wait_s)

    def close(self) -> None:
        """Close the second engine if nobody took it (now, or when its start ends)."""
        with self._lock:
            self._closed = True
            engine, self._engine = self._engine, None
        if engine is not None:
            _close_quietly(engine)

    def timings(self) -> dict[str, float]:
        """The report's overlap timings (see the module's docstring)."""
        if self._thread is None:
            return {}
        return {"overlap_s": round(self.overlap_s, 3), f"{self.second}_start_wait_s": round(self.wait_s, 3)}


def _close_quietly(engine: Engine) -> None:
    with contextlib.suppress(Exception):  # the run is already stopping with its own error
        engine.close()
