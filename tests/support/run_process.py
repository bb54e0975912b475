"""Helpers for tests that run `oracle run` as a real subprocess."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path


def finish(proc: subprocess.Popen[str], timeout: float = 180) -> str:
    """Wait for the run to end (killing it if it does not) and return its stderr."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError("the run did not end") from None
    return err


def stale_pass(report_dir: Path) -> None:
    """A previous run's passing report in every format, which must not survive as this run's."""
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "report.json").write_text(json.dumps({"complete": True, "exit_code": 0, "error": None}))
    for name in ("summary.md", "junit.xml", "report.html"):
        (report_dir / name).write_text("STALE: passed (exit 0)\n")
