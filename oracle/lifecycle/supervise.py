"""`oracle run` as two processes: a light parent that owns the exit code, and the run in a child.

Whatever the run's process does (an engine or a `preload` module calling `os._exit(0)`, a segfault,
an abort while torch is imported, the kernel's OOM killer), the parent reads report.json when the
child is gone and exits with the code the report gives; when the child left no final report, the
parent writes one saying how the child ended, and exits 3 (or 130/143 when the parent was signalled).
The report and the exit code always agree, whichever came first.

The parent imports neither torch nor an engine. It forwards SIGINT and SIGTERM to the child (which
writes its partial report) and tethers the child to itself through a pipe: when the parent dies,
even by SIGKILL, the pipe closes and the child kills its own process group, and every server or
worker the child started is tethered to the child the same way (`oracle.lifecycle.tether`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from oracle.lifecycle import signals
from oracle.lifecycle.tether import die_with, python

if TYPE_CHECKING:  # the report and its views are imported where used: every `oracle` command imports this module
    from oracle.config import Config
    from oracle.report import Report

# Set in the child's environment: the file descriptor of the pipe whose other end the parent holds.
PARENT_FD_ENV = "ORACLE_RUN_PARENT_FD"
# Set in the child's environment: the file descriptor of a pipe the parent writes the config it resolved to
# (oracle.config.config_handoff), so the child runs that config, parsed once, whatever the file holds by then.
CONFIG_FD_ENV = "ORACLE_RUN_CONFIG_FD"


# The child's code when its parent gave up before handing it the run (the parent reports why, not this code).
EXIT_GAVE_UP = 2

_watching: list[int] = []


def is_child() -> bool:
    """This process is the run's child (it never supervises another)."""
    return bool(_watching) or PARENT_FD_ENV in os.environ


def watch_parent() -> None:
    """In the child: when the parent's end of the pipe closes (it died), kill this process group.

    The variable is taken out of the environment, so processes the child starts do not inherit it."""
    fd = int(os.environ.pop(PARENT_FD_ENV))
    _watching.append(fd)
    die_with(fd, "oracle-parent-watch")


def warm_up() -> None:
    """In the child, before it reads the config: import torch while the parent reads the config and writes the
    started report. Signals are held from here until `warmed()` (inside the run's guard, which writes the report
    a signal stops the run with); torch missing is left to the run's own import, where it is reported."""
    signals.hold()
    with contextlib.suppress(ImportError):
        import torch  # noqa: F401


def warmed() -> None:
    """The run's guard is up: a signal held since `warm_up` stops the run now."""
    signals.release()


def inherited_run() -> tuple[Config, int] | None:
    """In the child: the config the parent resolved and the run's seed, read from its pipe; None in any other
    process. A pipe closed with nothing sent: the parent gave up before the run (a config it refused, a signal)
    and says why itself; this process ends without a word or a file.

    The variable is taken out of the environment, so processes the child starts do not inherit it."""
    fd = os.environ.pop(CONFIG_FD_ENV, None)
    if fd is None:
        return None
    from oracle.config import config_from_handoff

    with os.fdopen(int(fd), "rb") as pipe:
        blob = pipe.read()
    if not blob:
        os._exit(EXIT_GAVE_UP)
    seed, _, config = blob.partition(b"\n")
    return config_from_handoff(config), int(seed)


def _send(fd: int, blob: bytes) -> None:
    """Write `blob` to the child's config pipe and close it; a child that is gone no longer needs it."""
    try:
        view = memoryview(blob)
        while view:
            view = view[os.write(fd, view):]
    except BrokenPipeError:
        pass  # the child ended before reading it: its report, or its absence, says how
    finally:
        os.close(fd)


def exit_child(code: int) -> NoReturn:
    """End the run's child once `oracle run` returned (its report written): exit handlers run and output
    is flushed, as on a normal exit, but the interpreter's teardown is skipped. Tearing down torch's
    modules and the run's objects took about 0.25 s of every `oracle run` on 2 CPU cores, and the
    parent reads the report, not this process's state."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def _ended(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


def _final(path: Path) -> Report | None:
    """The report the child finished (complete, or stopped with its own error), else None."""
    from oracle.render.files import STARTED
    from oracle.report import load_report

    try:
        report = load_report(path)
    except Exception:  # missing, half-written by something else, unreadable: not a final report
        return None
    if report.complete or (report.error is not None and report.error != STARTED):
        return report
    return None


class Child:
    """`oracle ARGV` in a child (its own process group, tethered to us), started as soon as the command line is
    read: it imports torch (`warm_up`) while this process reads the config and writes the started report, then
    runs the config `run_child` sends it. `abandon()` ends a child that was sent nothing (the parent gave up)."""

    def __init__(self, argv: list[str]) -> None:
        read_end, self.write_end = os.pipe()
        config_read, self.config_write = os.pipe()
        env = {**os.environ, PARENT_FD_ENV: str(read_end), CONFIG_FD_ENV: str(config_read)}
        try:
            # The child leads its own group, so a Ctrl-C at the terminal reaches it once, through us.
            # (preexec_fn rather than 3.11's process_group=0; the parent runs no threads.)
            self.proc = subprocess.Popen([*python(), "-m", "oracle", *argv], env=env,
                                         pass_fds=(read_end, config_read), preexec_fn=os.setpgrp)
        except BaseException:
            self._close()
            raise
        finally:
            os.close(read_end)
            os.close(config_read)

    def send(self, blob: bytes) -> None:
        """Hand the child its run (once); it reads it after its warm-up, as it is written."""
        sending, self.config_write = self.config_write, -1
        _send(sending, blob)

    def _close(self) -> None:
        for name in ("write_end", "config_write"):  # -1 once closed: a closed number may be another file's by now
            fd = getattr(self, name)
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, name, -1)

    def abandon(self) -> None:
        """End the child unless it was sent its run; close our ends of its pipes."""
        if self.config_write >= 0 and self.proc.poll() is None:  # sent nothing: it has started nothing yet
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._close()


def supervised(args: Any, resolve: Callable[[Any], Config]) -> int:
    """`oracle run` in the parent: the child started at once, the config resolved (`resolve(args)`) and the
    started report written meanwhile, then the run handed to the child; the exit code its report gives."""
    child = Child(sys.argv[1:] if args.argv is None else list(args.argv))
    try:
        # Held until whole: the handler that replaces an earlier run's report imports them again.
        with signals.deferred():
            import oracle.config  # noqa: F401 - resolve's
            from oracle.lifecycle.run_guard import RunGuard
        config = resolve(args)
        report_dir = args.report_dir or Path(config.report_dir)
        blame = "--report-dir" if args.report_dir else None
        with RunGuard(config, report_dir, args.seed, blame=blame) as guard:
            return run_child(child, guard.report, report_dir, config, guard.seed)
    finally:
        child.abandon()


def run_child(child: Child, started: Report, report_dir: Path, config: Config, seed: int) -> int:
    """Hand `child` its run and wait for it; the exit code its report gives.

    `started` is the report the parent wrote; it is rewritten with how the child ended when the child wrote no
    final report. `config` is the config the parent resolved and `seed` the run's: the child reads both from a
    pipe (`inherited_run`) rather than the file again.
    """
    from oracle.config import config_handoff

    signalled: list[int] = []
    proc = child.proc

    def forward(signum: int, frame: object) -> None:
        if not signalled:
            signalled.append(signum)
        if proc.poll() is None:
            proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        child.send(f"{seed}\n".encode() + config_handoff(config))  # read as it is written, on this thread
        returncode = proc.wait()
        child._close()
        # Still under `forward` (a late signal is only noted): the code returned is the report's.
        return _settle(report_dir, started, returncode, signalled)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _settle(report_dir: Path, started: Report, returncode: int, signalled: list[int]) -> int:
    """The child is gone: its final report's code, or the started report rewritten with how it ended."""
    from oracle.render.files import ReportWriter
    from oracle.report import EXIT_ENGINE

    report = _final(report_dir / "report.json")
    if report is not None:
        from oracle.lifecycle import signals

        signals.settle()  # the code returned is the report's: a signal from now on cannot change it
        return report.exit_code()
    if signalled:
        code = 128 + signalled[0]
        message = (f"interrupted ({signal.Signals(signalled[0]).name}); the run's process "
                   f"{_ended(returncode)} before writing its report")
    else:
        code = EXIT_ENGINE
        message = (f"the run's process {_ended(returncode)} before writing its report "
                   "(an engine or a preload module ended it)")
    ReportWriter(report_dir).ended(started, message, code)
    print(f"oracle: error: {started.error} (partial report in {report_dir})", file=sys.stderr)
    return code
