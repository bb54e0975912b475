"""A server the `openai` engine starts itself (`engine.options.command`): in a session of its own, tethered to this
process, on loopback only, its output in a temporary log; every wait has a deadline and every stop a SIGKILL after
a grace."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

from oracle.errors import ConfigError, EngineError
from oracle.lifecycle import tether

HOST = "127.0.0.1"
_LOG_TAIL_LINES = 15
_STOP_GRACE_S = 5.0


def listening_hosts(port: int) -> list[str] | None:
    """The addresses of the sockets listening on TCP `port` (Linux's /proc/net/tcp{,6}); None elsewhere."""
    hosts: list[str] = []
    readable = False
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            parts = line.split()
            if len(parts) < 4 or parts[3] != "0A":  # 0A: LISTEN
                continue
            addr_hex, _, port_hex = parts[1].partition(":")
            if int(port_hex, 16) != port:
                continue
            raw = bytes.fromhex(addr_hex)
            # the kernel prints each 32-bit word of the address in host (little-endian) order
            packed = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            hosts.append(str(ipaddress.ip_address(packed)))
    return hosts if readable else None


def _is_loopback(host: str) -> bool:
    address = ipaddress.ip_address(host)
    mapped = getattr(address, "ipv4_mapped", None)
    return bool(address.is_loopback or (mapped is not None and mapped.is_loopback))


def substitute(item: str, subs: dict[str, str]) -> str:
    for key, value in subs.items():
        item = item.replace(key, value)
    return item


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class Server:
    """A server process this engine started, in a session of its own; every wait has a deadline.

    Its output goes to a temporary log, removed when the server is stopped (or the engine dropped):
    errors carry the log's last lines, so nothing is left in the temp folder.
    """

    def __init__(self, proc: subprocess.Popen[bytes], log_path: Path) -> None:
        self.proc, self.log_path = proc, log_path
        # Kill the server (and remove its log) if the engine is dropped without close(), or at interpreter exit.
        self._finalizer = weakref.finalize(self, _kill, proc, log_path)

    @classmethod
    def start(cls, argv: list[str], env: dict[str, str], base_url: str, timeout_s: float, httpx: Any) -> Server:
        fd, log_name = tempfile.mkstemp(prefix="oracle-server-", suffix=".log")
        try:
            with os.fdopen(fd, "wb") as log:
                # Tethered: the server dies with this process however it ends (SIGKILL included).
                proc = tether.popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(log_name)
            raise EngineError(f"engine.options.command: cannot start {argv[0]!r}: {e}") from e
        server = cls(proc, Path(log_name))
        try:
            server._wait_ready(base_url, timeout_s, httpx)
        except BaseException:
            server.stop()
            raise
        return server

    def _wait_ready(self, base_url: str, timeout_s: float, httpx: Any) -> None:
        deadline = time.monotonic() + timeout_s
        paths = ["/health", "/v1/models"]
        while True:
            if self.proc.poll() is not None:
                raise EngineError(f"the server exited with code {self.proc.returncode} while starting"
                                  f"{self.log_tail()}")
            if time.monotonic() > deadline:
                raise EngineError(f"server at {base_url} not ready within {timeout_s:g} s "
                                  f"(engine.options.startup_timeout_s){self.log_tail()}")
            for path in list(paths):
                try:
                    r = httpx.get(base_url + path, timeout=2.0)
                except httpx.HTTPError:
                    break  # not listening yet
                if r.status_code == 200:
                    return
                if r.status_code == 404 and len(paths) > 1:
                    paths.remove(path)  # no /health: fall back to /v1/models
            time.sleep(0.25)

    def check_loopback(self, port: int) -> None:
        """ConfigError when the server listens on `port` at an address other than loopback (0.0.0.0)."""
        hosts = listening_hosts(port)
        exposed = [h for h in hosts or () if not _is_loopback(h)]
        if exposed:
            raise ConfigError(f"engine.options.command: the server listens on {exposed[0]} port {port}, not only "
                              f"on {HOST}; oracle starts servers on loopback only: bind it to {{host}}")

    def exit_code(self, wait_s: float = 0.0) -> int | None:
        """The server's exit code once it has exited (waiting up to `wait_s`), else None."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.proc.wait(timeout=wait_s) if wait_s > 0 else self.proc.poll()
        return None

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise EngineError(f"the server exited with code {self.proc.returncode}{self.log_tail()}")

    def log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        tail = "\n".join(lines[-_LOG_TAIL_LINES:])
        return f", last lines of its output:\n{tail}" if tail else " (it printed nothing)"

    def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL it if it has not exited after a few seconds."""
        if self.proc.poll() is None:
            _signal_group(self.proc, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=_STOP_GRACE_S)
        self._finalizer()  # SIGKILLs the group (children too), reaps, removes the log


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    # The server's tether leads its own session, so the group id is its PID (the server is in the group).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _kill(proc: subprocess.Popen[bytes], log_path: Path) -> None:
    _signal_group(proc, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    tether.release(proc)
    with contextlib.suppress(OSError):
        log_path.unlink()
