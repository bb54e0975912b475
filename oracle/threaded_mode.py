"""Production mode's whole execution on a thread of this process while invariant mode runs on the main thread,
for engine kinds whose engines live in processes of their own (the row's `starts_apart`: vLLM's worker, a server
per mode).

Each mode's engine is its own process, so the two modes share no process, cache or kernel state: this process
only sends them requests and compares what comes back. Production's engine starts at once where the row allows
it (`starts_together`: vLLM on a CPU), else once invariant mode's engine is up (vLLM reads the free GPU memory
while it starts); then production runs its references, trials and repeats while invariant mode runs its own.
What production reports is kept and told to the run's observer once invariant mode is done, so the report and
the console's lines are a sequential run's but for the timings.

A fault ends as it would have in a sequential run: what production raised is raised once invariant mode is done
(its partial result kept); a fault in invariant mode stops production at its next step (its engine is closed, now
or once its start ends), whose result a sequential run would never have had. `ORACLE_OVERLAP=0` turns it off.

Timings: production's phases are its own; `overlap_s` is how much of its run went on while invariant mode ran,
`production_wait_s` what of it the run still waited for.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from oracle.engines.contract import Engine, Mode
from oracle.observer import Observer, Recorded, replay

if TYPE_CHECKING:
    from oracle.execute import ModeExecution
    from oracle.mode_result import ModeResult


class Stopped(BaseException):
    """The mode run beside another was stopped: the other failed or the run was interrupted."""


class _Stoppable(Recorded):
    """Recorded; every call raises Stopped once the run stopped the mode (its next step ends it, engine closed)."""

    def __init__(self) -> None:
        super().__init__()
        self.stop = False

    def note(self, name: str, *args: Any) -> None:
        if self.stop:
            raise Stopped(f"{name} after the run stopped this mode")
        super().note(name, *args)


class ThreadedMode:
    """`execution` run on a thread of its own: `first(build)` wraps the other mode's builder (it says when that
    engine is up), `start()` starts the thread, `join()` waits for it, tells `observer` its progress and returns
    its result with what it raised; `cancel()` stops a mode nobody joined at its next step."""

    def __init__(self, execution: ModeExecution, observer: Observer, wait_for_first: bool) -> None:
        self.execution, self.observer = execution, observer
        self.run_s = 0.0  # the mode's own run
        self.wait_s = 0.0  # what of it the run waited for
        self._recorder = _Stoppable()
        self._up = threading.Event()  # the first mode's engine is up (or its start ended)
        if not wait_for_first:
            self._up.set()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._gate_s = 0.0
        own = execution.build

        def build(mode: Mode) -> Engine:
            t0 = time.perf_counter()
            while not self._up.wait(0.1):
                if self._recorder.stop:
                    break
            self._gate_s = time.perf_counter() - t0  # not its own start: taken out of it in join()
            if self._recorder.stop:
                raise Stopped("the run stopped before this mode's engine started")
            return own(mode)

        execution.build = build
        execution.observer = self._recorder

    def first(self, build: Callable[[Mode], Engine]) -> Callable[[Mode], Engine]:
        def started(mode: Mode) -> Engine:
            try:
                return build(mode)
            except BaseException:
                self._recorder.stop = True  # the run stops here: production's engine is never started
                raise
            finally:
                self._up.set()

        return started

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"oracle-{self.execution.mode}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.execution.run()
        except BaseException as e:  # noqa: BLE001 - raised on the run's thread by join()
            self._error = e

    def join(self) -> tuple[ModeResult | None, float, BaseException | None]:
        """The mode's result, its seconds and what it raised (None: it completed), once it is done; its progress
        told to the observer first."""
        assert self._thread is not None
        t0 = time.perf_counter()
        while self._thread.is_alive():  # short waits: this thread stays free to take SIGINT/SIGTERM
            self._thread.join(0.1)
        self.wait_s = time.perf_counter() - t0
        self.run_s = self.execution.seconds
        clock = self.execution.clock.seconds
        if "engine_start" in clock:
            clock["engine_start"] = max(0.0, clock["engine_start"] - self._gate_s)
        replay(self._recorder.calls, self.observer)
        return self.execution.result(), self.execution.seconds, self._error

    def cancel(self) -> None:
        """Stop the mode at its next step unless it was joined; its engine is closed as it ends (not waited for)."""
        if self._thread is not None and self._thread.is_alive():
            self._recorder.stop = True
            self._up.set()

    def timings(self) -> dict[str, float]:
        """The report's overlap timings (see the module's docstring)."""
        return {"overlap_s": round(max(0.0, self.run_s - self.wait_s), 3),
                f"{self.execution.mode}_wait_s": round(self.wait_s, 3)}
