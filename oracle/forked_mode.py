"""One mode's whole execution in a fork of the run's process, while the other mode runs here.

Where an engine lives in this process and invariant mode is this process's `torch.library` overrides (native),
the two modes cannot share the process at once, but they need not wait for each other either: the run's
process forks before any engine starts, and the fork runs production's `ModeExecution` on its own engine while
invariant mode runs here, each on its own cores (the row's `forks_beside`: the native engine on a CPU with
`engine.num_threads` set, and cores for both). The fork shares no engine, no cache and no kernel state with this
process: it starts from the process as it was before invariant mode's engine, as a sequential run's production
mode would have found it but for what invariant mode left behind. Its result comes back pickled through a pipe,
with the progress it reported, which the run's observer hears once invariant mode is done, in the order of a
sequential run, so the report and the console's lines are the same but for the timings.

A fault ends as it would have in a sequential run: what production raised is raised once invariant mode is done
(its partial result kept); a fork that ends without a result is an EngineError naming production mode; a fault
in invariant mode kills the fork, whose result a sequential run would never have had. `ORACLE_OVERLAP=0` turns
it off, as it does `oracle.overlap`.

Timings: production's phases are its own; `overlap_s` is how much of its run went on while invariant mode ran,
`production_wait_s` what of it the run still waited for.
"""

from __future__ import annotations

import contextlib
import copyreg
import io
import os
import pickle
import signal
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from oracle.errors import EngineError
from oracle.observer import Observer, Recorded, replay

if TYPE_CHECKING:
    from oracle.engines.contract import Engine, Mode
    from oracle.execute import ModeExecution
    from oracle.mode_result import ModeResult
    from oracle.plan import Plan

# Beside the model's weights: room for the KV caches, activations and what else the run holds.
WEIGHTS_SHARE_OF_RAM = 0.25  # both modes' weights at once take at most a quarter of the RAM available


def forks(plan: Plan, modes: list[Mode]) -> bool:
    """Whether production mode runs in a fork while invariant mode runs here: both modes, a row that allows it
    for this config, both copies of the weights in RAM, not turned off (`ORACLE_OVERLAP=0`), and a production
    mode that localizes nothing (`oracle.overlap.production_localizes`)."""
    from oracle.overlap import production_localizes, turned_off

    return (modes == ["invariant", "production"] and not production_localizes(plan) and not turned_off()
            and plan.engine.forks_beside(plan.config.engine) and weights_fit_twice(plan.model_dir))


def weights_fit_twice(model_dir: Path) -> bool:
    """Both modes' copies of the checkpoint's weights fit in the RAM available with room to spare
    (`WEIGHTS_SHARE_OF_RAM`); a sequential run holds one engine at a time."""
    from oracle.models import memory

    available = memory.ram_available()
    weights = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    return available is not None and 2 * weights <= WEIGHTS_SHARE_OF_RAM * available.bytes


def _read_only(items: dict[Any, Any]) -> MappingProxyType[Any, Any]:
    return MappingProxyType(items)


def _dumps(obj: object) -> bytes:
    """pickle, with a ModeResult's read-only mappings (MappingProxyType) carried as themselves."""
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = {**copyreg.dispatch_table, MappingProxyType: lambda m: (_read_only, (dict(m),))}
    pickler.dump(obj)
    return buf.getvalue()


def _portable(error: BaseException | None) -> BaseException | None:
    """`error` if it survives the pipe as itself, else the engine error it would be reported as."""
    if error is None:
        return None
    with contextlib.suppress(Exception):
        back = pickle.loads(pickle.dumps(error))
        if type(back) is type(error) and str(back) == str(error):
            return error
    from oracle.errors import engine_error

    return EngineError(str(engine_error(error)))


class ForkedMode:
    """`execution` run in a fork of this process: `start()` forks, `join()` waits for its result, replays its
    progress to `observer` and returns the result with what it raised; `cancel()` ends a fork nobody joined."""

    def __init__(self, execution: ModeExecution, observer: Observer) -> None:
        self.execution, self.observer = execution, observer
        self.pid: int | None = None
        self.run_s = 0.0  # the mode's own run in the fork
        self.wait_s = 0.0  # what of it the run waited for
        self._read = -1

    def first(self, build: Callable[[Mode], Engine]) -> Callable[[Mode], Engine]:
        """Invariant mode's builder, as it is: the fork started before it."""
        return build

    def start(self) -> None:
        for stream in (sys.stdout, sys.stderr):  # nothing buffered here is written twice
            with contextlib.suppress(Exception):
                stream.flush()
        read, write = os.pipe()
        with warnings.catch_warnings():
            # Python 3.12+ warns of a fork beside other threads (the parent watch, a host's): the fork runs
            # only the mode's own code, which takes none of their locks.
            warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the fork: run the mode, send its result, end; never return into the run's stack
            code = 70
            try:
                os.close(read)
                code = self._child(write)
            finally:
                os._exit(code)
        os.close(write)
        self.pid, self._read = pid, read

    def _child(self, write: int) -> int:
        from oracle.lifecycle.exit_trap import trapped

        for signum in (signal.SIGINT, signal.SIGTERM):  # the run's process stops this one
            signal.signal(signum, signal.SIG_DFL)
        recorder = Recorded()
        self.execution.observer = recorder
        error: BaseException | None = None
        try:
            with trapped():  # an engine's os._exit is an error here too, as in the run's process
                self.execution.run()
        except BaseException as e:  # noqa: BLE001 - handed to the run's process, raised there
            error = e
        try:
            blob = _dumps((self.execution.result(), self.execution.seconds, recorder.calls, _portable(error)))
        except Exception as e:  # noqa: BLE001 - something in the result does not pickle: the run says so
            blob = _dumps((None, self.execution.seconds, recorder.calls,
                           EngineError(f"{self.execution.mode} mode's results could not be sent from its process: "
                                       f"{type(e).__name__}: {e}")))
        with os.fdopen(write, "wb") as pipe:
            pipe.write(blob)
        return 0

    def join(self) -> tuple[ModeResult | None, float, BaseException | None]:
        """The fork's result, the seconds it ran the mode and what it raised (None: it completed), once it is
        done; its progress told to the observer first. A fork that ended without a result gives no result and
        an EngineError naming production mode."""
        assert self.pid is not None
        t0 = time.perf_counter()
        with os.fdopen(self._read, "rb") as pipe:
            self._read = -1
            blob = pipe.read()
        _, status = os.waitpid(self.pid, 0)
        self.pid = None
        self.wait_s = time.perf_counter() - t0
        if not blob:
            return None, 0.0, EngineError(f"{self.execution.mode} mode's process (a fork of the run's) "
                                          f"{_ended(status)} before it sent its results")
        result, seconds, calls, error = pickle.loads(blob)
        self.run_s = seconds
        replay(calls, self.observer)
        return result, seconds, error

    def cancel(self) -> None:
        """End the fork if nobody joined it (invariant mode failed or the run was stopped)."""
        if self._read >= 0:
            os.close(self._read)
            self._read = -1
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self.pid = None

    def timings(self) -> dict[str, float]:
        """The report's overlap timings (see the module's docstring)."""
        return {"overlap_s": round(max(0.0, self.run_s - self.wait_s), 3),
                f"{self.execution.mode}_wait_s": round(self.wait_s, 3)}


def _ended(status: int) -> str:
    if os.WIFSIGNALED(status):
        try:
            name = signal.Signals(os.WTERMSIG(status)).name
        except ValueError:
            name = f"signal {os.WTERMSIG(status)}"
        return f"was killed by {name}"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"
