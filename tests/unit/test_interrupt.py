"""Ctrl-C during a run: exit 130 and a partial report with what completed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

SUPPORT = Path(__file__).resolve().parents[1] / "support"


def test_ctrl_c_writes_partial_report(fake_model: Path, tmp_path: Path) -> None:
    cfg = {
        "model": str(fake_model),
        "engine": {"kind": "fake_engine:FakeEngine", "options": {"sleep_s": 0.05}},
        "prompts": {"random": {"count": 2, "min_len": 2, "max_len": 4}},
        "sampling": {"max_tokens": 3},
        "schedule": {"trials": 200, "seed": 1, "batch_size": [1, 8]},
        "report_dir": str(tmp_path / "report"),
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")]),
           "CI": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "oracle", "run", str(path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:  # the invariant phase has started: trials are running
        if line.startswith("invariant:"):
            break
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["complete"] is False and report["error"] == "interrupted"
    inv = next(c for c in report["checks"] if c["name"] == "invariance")
    assert 0 < inv["trials"] < 200
