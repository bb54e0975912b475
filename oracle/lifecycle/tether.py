"""Start a server or worker process that dies with the process that started it, however that one ends.

`popen(argv, ...)` runs `python -m oracle.lifecycle.tether FD KEEP -- ARGV...` (KEEP: the caller's `pass_fds`,
handed on to ARGV): a small process that leads a new
session, starts ARGV in it and waits. It holds the read end of a pipe whose write end only the
starter holds; when the starter dies (exit, crash, SIGKILL) the pipe closes and the tether kills
its whole process group, ARGV and whatever ARGV started. A parent-death signal would fire when the
*thread* that started the process ends, which a watchdog thread does; the pipe does not care.

The tether forwards SIGTERM and SIGINT to ARGV and exits with ARGV's code (128 + N when a signal N
ended it), so the `Popen` it returns behaves as ARGV's own: `proc.pid` is the group's id.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

# Write ends of the pipes, by tether pid: closed when the process is reaped (`release`), else at exit.
_write_ends: dict[int, int] = {}


def python() -> list[str]:
    """The argv that starts another Python the way this one was: the working directory on its path only if
    it is on ours. A console script's path starts with its own folder, so from a checkout the folder
    `kernels/` (imported as `oracle_kernels`) must not become the `kernels` package transformers imports;
    `python -m oracle` from a checkout, without an install, keeps the working directory (3.11's -P)."""
    cwd_first = bool(sys.path) and sys.path[0] in ("", os.getcwd())
    return [sys.executable] if cwd_first or sys.version_info < (3, 11) else [sys.executable, "-P"]


def popen(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """`subprocess.Popen(argv, **kwargs)` tethered to this process; always a new session."""
    read_end, write_end = os.pipe()
    kwargs.pop("start_new_session", None)
    theirs = tuple(kwargs.pop("pass_fds", ()))  # handed on to ARGV by the tether
    keep = ",".join(str(fd) for fd in theirs)
    try:
        proc: subprocess.Popen[bytes] = subprocess.Popen(
            [*python(), "-m", "oracle.lifecycle.tether", str(read_end), keep, "--", *argv],
            pass_fds=(*theirs, read_end), start_new_session=True, **kwargs)
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    _write_ends[proc.pid] = write_end
    return proc


def release(proc: subprocess.Popen[bytes]) -> None:
    """Close the tether's pipe once `proc` has ended (else it closes when this process exits)."""
    fd = _write_ends.pop(proc.pid, None)
    if fd is not None:
        os.close(fd)


def die_with(fd: int, name: str = "oracle-tether") -> None:
    """When the pipe `fd` reads end-of-file (whoever held its other end is gone), SIGKILL this process group."""

    def wait() -> None:
        try:
            while os.read(fd, 1):
                pass
        except OSError:
            pass
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=wait, name=name, daemon=True).start()


def _main(argv: list[str]) -> int:
    fd = int(argv[0])
    keep = tuple(int(x) for x in argv[1].split(",") if x)
    command = argv[3:] if argv[2:3] == ["--"] else argv[2:]

    child = subprocess.Popen(command, pass_fds=keep)

    def forward(signum: int, frame: object) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, forward)
    die_with(fd)
    code = child.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    try:
        sys.exit(_main(sys.argv[1:]))
    except FileNotFoundError as e:
        print(f"oracle: cannot start {Path(str(e.filename)).name}: {e.strerror}", file=sys.stderr)
        sys.exit(127)


def socket_timeouts(fd: int, timeout_s: float) -> None:
    """Bound every blocking send and receive on socket `fd` by `timeout_s`: a worker that stops reading
    mid-message (its buffer full) or stops writing mid-reply makes the call fail with EAGAIN, not hang."""
    whole = int(max(0.0, timeout_s))
    micros = max(int((timeout_s - whole) * 1e6), 0 if whole else 1000)  # a zero timeval would mean "wait forever"
    value = struct.pack("ll", whole, micros)
    sock = socket.socket(fileno=os.dup(fd))  # a second handle on the same socket; the option is the socket's
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    finally:
        sock.close()
