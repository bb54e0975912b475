"""Every phase that can block ends in a report and exit 3 naming the phase, never runs until the CI timeout.

Engines here block forever (`hang_engine.HangEngine` waits on an Event, a stub server trickles bytes
for ever) and deadlines are tiny, so no result depends on how fast the machine is. Runs go through a
real `oracle` subprocess; its `communicate` limit only turns a hang of the code under test into a
failure instead of a stuck test session.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from oracle.config import EngineConfig
from oracle.lifecycle.watchdog import START_GRACE_S, start_timeout

SUPPORT = Path(__file__).resolve().parents[1] / "support"
HANG_GUARD_S = 120  # only ever reached when a hang is not bounded (the bug these tests catch)


def _config(tmp_path: Path, model: Path, engine: dict[str, Any], **extra: Any) -> Path:
    cfg: dict[str, Any] = {
        "model": str(model),
        "engine": {"timeout_s": 0.2, **engine},
        "prompts": {"random": {"count": 2, "min_len": 2, "max_len": 4}},
        "sampling": {"max_tokens": 3},
        "schedule": {"trials": 6, "seed": 3, "batch_size": [2, 4], "repeat_trials": 1},
        "report_dir": str(tmp_path / "report"),
        **extra,
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _oracle(*args: str) -> tuple[int, str]:
    """`python -m oracle ARGS`: exit code and stderr; fails the test (and kills it) if it never ends."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")]),
           "CI": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "oracle", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=HANG_GUARD_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"oracle {' '.join(args)} hung") from None
    return proc.returncode, err


def _hang(tmp_path: Path, model: Path, hang_on: str, **options: Any) -> tuple[int, str, dict[str, Any]]:
    engine = {"kind": "hang_engine:HangEngine", "options": {"hang_on": hang_on, **options}}
    code, err = _oracle("run", str(_config(tmp_path, model, engine)))
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    return code, err, report


def _engine_error(code: int, err: str, report: dict[str, Any], *phrases: str) -> None:
    assert code == 3, err
    assert "Traceback" not in err
    assert report["complete"] is False and report["exit_code"] == 3, report["error"]
    for phrase in phrases:
        assert phrase in report["error"] and phrase in err, (phrase, report["error"])


def test_a_constructor_that_never_returns_stops_the_run_naming_the_start(fake_model: Path, tmp_path: Path) -> None:
    code, err, report = _hang(tmp_path, fake_model, "init")
    _engine_error(code, err, report, "engine start did not return within 0.2 s (engine.timeout_s)",
                  "the invariant engine's start")


def test_a_hang_in_the_second_modes_start_keeps_the_first_modes_results(fake_model: Path, tmp_path: Path) -> None:
    code, err, report = _hang(tmp_path, fake_model, "init", hang_mode="production")
    _engine_error(code, err, report, "the production engine's start")
    inv = next(c for c in report["checks"] if c["name"] == "invariance")
    assert inv["trials"] == 6  # the invariant mode ran before the production engine hung


@pytest.mark.parametrize(("hang_on", "phase"), [
    ("solo-", "the invariant engine's references (request solo-"),
    ("trial", "the invariant engine's trial "),
    ("describe", "the invariant engine's describe()"),
])
def test_a_hang_in_a_phase_names_the_phase(fake_model: Path, tmp_path: Path, hang_on: str, phase: str) -> None:
    code, err, report = _hang(tmp_path, fake_model, hang_on)
    _engine_error(code, err, report, "did not return within 0.2 s (engine.timeout_s)", phase)


def test_a_hang_while_shrinking_names_the_shrink(fake_model: Path, tmp_path: Path) -> None:
    # Every batched trial diverges in invariant mode, so the first failing one is shrunk.
    code, err, report = _hang(tmp_path, fake_model, "shrink", diverge_from_batch=2)
    _engine_error(code, err, report, "the invariant engine's shrinking (trial ")


def test_a_hang_in_the_prefill_decode_check_names_it(fake_model: Path, tmp_path: Path) -> None:
    code, err, report = _hang(tmp_path, fake_model, "prefill-")
    _engine_error(code, err, report, "the invariant engine's prefill/decode check")


def test_a_hang_in_localize_during_a_run_is_a_note_and_the_verdict_stands(fake_model: Path, tmp_path: Path) -> None:
    code, err, report = _hang(tmp_path, fake_model, "capture", diverge_from_batch=2)
    assert code == 1 and report["exit_code"] == 1, err  # invariance failed; localize's hang did not hide it
    notes = json.dumps(report)
    assert "engine localize did not return within 0.6 s (3 x engine.timeout_s)" in notes
    assert "the invariant engine's localize" in notes


def test_a_hang_in_close_is_bounded_and_reported(fake_model: Path, tmp_path: Path) -> None:
    code, err, report = _hang(tmp_path, fake_model, "close")
    assert code == 0 == report["exit_code"] and report["complete"] is True, err
    close_error = report["environment"]["engines"]["invariant"]["close_error"]
    assert "engine close did not return within 0.2 s" in close_error and "close()" in close_error


def test_oracle_localize_of_a_hanging_engine_is_exit_3_naming_localize(fake_model: Path, tmp_path: Path) -> None:
    engine = {"kind": "hang_engine:HangEngine", "options": {"hang_on": "capture", "diverge_from_batch": 2}}
    config = _config(tmp_path, fake_model, engine, checks={"invariance": {"localize": "off"}})
    code, err = _oracle("run", str(config))
    assert code == 1, err
    report_path = tmp_path / "report" / "report.json"
    failing = json.loads(report_path.read_text())["divergences"][0]["trial_id"]
    code, err = _oracle("localize", str(report_path), "--trial", str(failing), "--trust-report")  # a custom engine
    assert code == 3, err
    assert "engine localize did not return within 0.6 s (3 x engine.timeout_s)" in err
    assert "the invariant engine's localize" in err and "Traceback" not in err


def test_oracle_localize_of_an_engine_that_never_starts_is_exit_3(fake_model: Path, tmp_path: Path) -> None:
    engine = {"kind": "hang_engine:HangEngine", "options": {"diverge_from_batch": 2}}
    config = _config(tmp_path, fake_model, engine, checks={"invariance": {"localize": "off"}})
    assert _oracle("run", str(config))[0] == 1
    report_path = tmp_path / "report" / "report.json"
    report = json.loads(report_path.read_text())
    report["config"]["engine"]["options"]["hang_on"] = "init"  # the engine now hangs while starting
    report_path.write_text(json.dumps(report))
    trial = str(report["divergences"][0]["trial_id"])
    code, err = _oracle("localize", str(report_path), "--trial", trial, "--trust-report")
    assert code == 3, err
    assert "engine start did not return within 0.2 s" in err and "the invariant engine's start" in err


@pytest.fixture
def trickling_server() -> Iterator[str]:
    """An HTTP server that answers every request with a 200 whose body never ends: one byte at a time,
    each well within any read timeout, so a client without an overall deadline waits for ever."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000000\r\n\r\n")
                while not stop.wait(0.05):
                    conn.sendall(b" ")
            except OSError:
                return  # the client went away

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    listener.close()


def test_the_first_probe_of_a_slow_server_is_bounded(fake_model: Path, tmp_path: Path, trickling_server: str,
                                                     ) -> None:
    pytest.importorskip("httpx")
    engine = {"kind": "openai", "options": {"base_url": {"invariant": trickling_server,
                                                         "production": trickling_server},
                                            "request_timeout_s": 5, "max_retries": 0}}
    code, err = _oracle("run", str(_config(tmp_path, fake_model, engine)))
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    _engine_error(code, err, report, "engine start did not return within 0.2 s (engine.timeout_s)",
                  "the invariant engine's start (server start and first probe)")


@pytest.mark.parametrize(("kind", "options", "expected"), [
    ("native", {}, (0.5, "engine.timeout_s")),
    ("pkg.mod:Engine", {"start_timeout_s": 9}, (0.5, "engine.timeout_s")),
    ("vllm", {}, (0.5 + 300 + START_GRACE_S, "engine.timeout_s + engine.options.start_timeout_s")),
    ("vllm", {"start_timeout_s": 20}, (0.5 + 20 + START_GRACE_S, "engine.options.start_timeout_s")),
    ("openai", {"base_url": "http://127.0.0.1:1"}, (0.5, "engine.timeout_s")),
    ("openai", {"command": ["serve", "{host}"], "startup_timeout_s": 7},
     (0.5 + 7 + START_GRACE_S, "engine.options.startup_timeout_s")),
])
def test_the_start_deadline_adds_an_engines_own_start_timeout(kind: str, options: dict[str, Any],
                                                              expected: tuple[float, str]) -> None:
    timeout, limit = start_timeout(EngineConfig(kind=kind, options=options, timeout_s=0.5))
    assert timeout == expected[0] and expected[1] in limit


def test_no_watchdog_means_no_start_deadline() -> None:
    assert start_timeout(EngineConfig(kind="vllm", timeout_s=None))[0] is None


def _within_guard(fn: Any) -> Any:
    """fn() in a thread; a failure, not a stuck session, if it never returns (the bug under test)."""
    out: list[Any] = []

    def target() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            out.append(e)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    assert out, "the call hung"
    return out[0]


@pytest.fixture
def silent_worker(tmp_path: Path) -> Iterator[Any]:
    """A vLLM engine's worker handle on a live process that never reads its socket nor answers."""
    from multiprocessing.connection import Connection

    from oracle.engines.vllm_engine import _Worker

    ours, theirs = socket.socketpair()
    proc = subprocess.Popen([sys.executable, "-c", "import threading; threading.Event().wait()"],
                            stdin=subprocess.DEVNULL)
    worker = _Worker(proc, Connection(ours.detach()), tmp_path / "worker.log")
    yield worker
    proc.kill()
    proc.wait()
    theirs.close()


def test_a_vllm_worker_that_stops_reading_is_killed_not_waited_on(silent_worker: Any) -> None:
    from oracle.errors import EngineError

    big = ("generate", b"x" * (64 << 20))  # far beyond the socket's buffer: the send itself would block
    error = _within_guard(lambda: silent_worker.call(big, 0.2))
    assert isinstance(error, EngineError), error
    assert "vllm worker: generate: the worker did not take the request within 0.2 s; killed it" in str(error)
    assert silent_worker.proc.wait() != 0


def test_a_vllm_worker_that_never_answers_is_killed(silent_worker: Any) -> None:
    from oracle.errors import EngineError

    error = _within_guard(lambda: silent_worker.call(("reset_prefix_cache",), 0.2))
    assert isinstance(error, EngineError) and "no answer to reset_prefix_cache within 0.2 s; killed it" in str(error)
    _within_guard(silent_worker.stop)  # stopping a killed worker neither blocks nor raises
