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
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from oracle.lifecycle.tether import die_with, python

if TYPE_CHECKING:  # the report and its views are imported where used: every `oracle` command imports this module
    from oracle.config import Config
    from oracle.report import Report

# Set in the child's environment: the file descriptor of the pipe whose other end the parent holds.
PARENT_FD_ENV = "ORACLE_RUN_PARENT_FD"
# Set in the child's environment: the file descriptor of a pipe the parent writes the config it resolved to
# (oracle.config.config_handoff), so the child runs that config, parsed once, whatever the file holds by then.
CONFIG_FD_ENV = "ORACLE_RUN_CONFIG_FD"


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


def inherited_config() -> Config | None:
    """In the child: the config the parent resolved, read from its pipe; None in any other process.

    The variable is taken out of the environment, so processes the child starts do not inherit it."""
    fd = os.environ.pop(CONFIG_FD_ENV, None)
    if fd is None:
        return None
    from oracle.config import config_from_handoff

    with os.fdopen(int(fd), "rb") as pipe:
        blob = pipe.read()
    return config_from_handoff(blob)


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


def run_child(argv: list[str], started: Report, report_dir: Path, config: Config) -> int:
    """Run `oracle ARGV` in a child (its own process group, tethered to us); the exit code its report gives.

    `started` is the report the parent wrote before starting the child; it is rewritten with how the
    child ended when the child wrote no final report. `config` is the config the parent resolved: the child
    reads it from a pipe (`inherited_config`) rather than the file again.
    """
    from oracle.config import config_handoff

    read_end, write_end = os.pipe()
    config_read, config_write = os.pipe()
    env = {**os.environ, PARENT_FD_ENV: str(read_end), CONFIG_FD_ENV: str(config_read)}
    signalled: list[int] = []
    procs: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, frame: object) -> None:
        if not signalled:
            signalled.append(signum)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        blob = config_handoff(config)  # before the child exists: a config that cannot be sent starts none
        # The child leads its own group, so a Ctrl-C at the terminal reaches it once, through us.
        # (preexec_fn rather than 3.11's process_group=0; the parent runs no threads.)
        proc = subprocess.Popen([*python(), "-m", "oracle", *argv], env=env, pass_fds=(read_end, config_read),
                                preexec_fn=os.setpgrp)
        procs.append(proc)
        os.close(read_end)
        os.close(config_read)
        config_read = -1
        # After the start (a config larger than the pipe's buffer is read as it is written), on this thread.
        config_write, sending = -1, config_write
        _send(sending, blob)
        if signalled:  # arrived between the handler and the child's start
            proc.send_signal(signalled[0])
        returncode = proc.wait()
        os.close(write_end)
        # Still under `forward` (a late signal is only noted): the code returned is the report's.
        return _settle(report_dir, started, returncode, signalled)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        with contextlib.suppress(OSError):
            os.close(write_end)
        for fd in (config_read, config_write):  # -1 once closed: a closed number may be another file's by now
            if fd >= 0:
                os.close(fd)


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
