"""SIGINT and SIGTERM during `oracle run` (a real subprocess): exit 130/143 and a partial report in every format.

Signals are sent once the output shows how far the run got, never after a fixed sleep.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from run_process import finish, stale_pass

SUPPORT = Path(__file__).resolve().parents[1] / "support"


def _start(tmp_path: Path, model: Path, timeout_s: float | None = None, **options: Any) -> subprocess.Popen[str]:
    engine: dict[str, Any] = {"kind": "fake_engine:FakeEngine",
                              "options": {"sleep_s": 0.02, "announce": True, **options}}
    if timeout_s is not None:
        engine["timeout_s"] = timeout_s
    cfg = {
        "model": str(model),
        "engine": engine,
        "prompts": {"random": {"count": 2, "min_len": 2, "max_len": 4}},
        "sampling": {"max_tokens": 3},
        "schedule": {"trials": 200, "seed": 1, "batch_size": [1, 8]},
        "report_dir": str(tmp_path / "report"),
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")]),
           "CI": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "oracle", "run", str(path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(proc: subprocess.Popen[str], needle: str) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        if needle in line:
            return
    proc.kill()
    raise AssertionError(f"the run ended before printing {needle!r}: {proc.communicate()[1]}")



def _formats(report_dir: Path) -> dict[str, str]:
    return {name: (report_dir / name).read_text() for name in ("summary.md", "junit.xml", "report.html")}



@pytest.mark.parametrize(("sig", "code", "name"), [(signal.SIGINT, 130, "SIGINT"), (signal.SIGTERM, 143, "SIGTERM")])
def test_signal_mid_run_writes_partial_report(fake_model: Path, tmp_path: Path, sig: int, code: int,
                                              name: str) -> None:
    proc = _start(tmp_path, fake_model)
    _wait_for(proc, "fake engine: invariant call 20")  # solo runs done, trials under way
    proc.send_signal(sig)
    err = finish(proc)
    assert proc.returncode == code, err
    assert f"interrupted ({name})" in err and "Traceback" not in err
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["complete"] is False and report["error"] == f"interrupted ({name})"
    assert report["exit_code"] == code
    inv = next(c for c in report["checks"] if c["name"] == "invariance")
    assert 0 < inv["trials"] < 200  # what completed is judged
    for text in _formats(tmp_path / "report").values():
        assert "partial report" in text and f"interrupted ({name})" in text


def test_sigterm_in_the_first_moment_still_writes_a_report(fake_model: Path, tmp_path: Path) -> None:
    stale_pass(tmp_path / "report")
    proc = _start(tmp_path, fake_model)
    _wait_for(proc, "oracle: writing the report to")  # the first line the run prints
    proc.send_signal(signal.SIGTERM)
    err = finish(proc)
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["complete"] is False and report["exit_code"] == 143, (report["error"], err)
    # The child may not have armed its handlers yet: then the parent says how it ended.
    assert report["error"].startswith("interrupted (SIGTERM)")
    for text in _formats(tmp_path / "report").values():
        assert "STALE" not in text and "partial report" in text


def test_os_exit_in_an_engine_never_leaves_a_pass(fake_model: Path, tmp_path: Path) -> None:
    """os._exit(0) in the engine's thread is an engine error: the process exits 3, never 0, and the report
    (the run's own, with what completed) names the call."""
    stale_pass(tmp_path / "report")
    proc = _start(tmp_path, fake_model, fault_after_calls=3, fault="os_exit")
    err = finish(proc)
    assert proc.returncode == 3, err
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["complete"] is False and report["exit_code"] == 3
    assert "os._exit(0)" in report["error"]
    for text in _formats(tmp_path / "report").values():
        assert "STALE" not in text and "partial report" in text


def test_hanging_engine_hits_the_watchdog(fake_model: Path, tmp_path: Path) -> None:
    """A generate() that never returns: engine.timeout_s stops the run with exit 3 and a partial report."""
    proc = _start(tmp_path, fake_model, timeout_s=0.5, fault_after_calls=5, fault="hang")
    err = finish(proc)
    assert proc.returncode == 3, err
    assert "engine.timeout_s" in err and "Traceback" not in err
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["complete"] is False and report["exit_code"] == 3 and "engine.timeout_s" in report["error"]
    assert "partial report" in (tmp_path / "report" / "summary.md").read_text()


@pytest.mark.parametrize("when", ["reading the arguments", "importing the config's modules"])
def test_signal_before_the_run_is_guarded_replaces_a_stale_pass(fake_model: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    """A SIGTERM in the first instants of `oracle run` (before the config is read): exit 143 and the
    earlier run's pass is replaced by a report that says this one was interrupted."""
    import builtins

    from oracle import cli

    report_dir = tmp_path / "report"
    stale_pass(report_dir)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"model": str(fake_model), "engine": {"kind": "fake_engine:FakeEngine"},
                                    "report_dir": str(report_dir)}))
    if when == "reading the arguments":
        parser = cli._parser

        class Signalling:
            def parse_args(self, argv: list[str] | None) -> Any:
                os.kill(os.getpid(), signal.SIGTERM)  # delivered here, in the main thread
                return parser().parse_args(argv)

        monkeypatch.setattr(cli, "_parser", Signalling)
    else:
        real_import = builtins.__import__
        sent: list[bool] = []

        whole: list[str] = []

        def signalling_import(name: str, *a: Any, **k: Any) -> Any:
            if name == "oracle.config" and not sent:
                sent.append(True)
                os.kill(os.getpid(), signal.SIGTERM)  # arrives while `oracle run` imports its modules
                module = real_import(name, *a, **k)
                whole.append(name)  # held until here: a module is never cut in half by the signal
                return module
            return real_import(name, *a, **k)

        monkeypatch.setattr(builtins, "__import__", signalling_import)
    code = cli.main(["run", str(path)])
    assert code == 143
    if when != "reading the arguments":
        assert whole == ["oracle.config"]
    report = json.loads((report_dir / "report.json").read_text())
    assert report["complete"] is False and report["exit_code"] == 143, report
    assert "SIGTERM" in report["error"]
