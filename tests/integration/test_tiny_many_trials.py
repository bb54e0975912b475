"""No false alarms at volume: 1,000 trials of the tiny config, every one bitwise equal to its solo run."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from oracle.config import parse_config
from oracle.runner import run

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"


@pytest.mark.slow
def test_1000_trials_of_the_tiny_config_have_no_invariance_failure(model_cache: Path, tmp_path: Path) -> None:
    data = yaml.safe_load(CONFIG.read_text())
    data["schedule"].update(trials=1000, seed=20261203, repeat_trials=0)
    # Only invariance is asked here; the other checks have their own tests.
    data["checks"] = {"invariance": "required", "repeatability": "off", "fidelity": "off", "drift": "off",
                      "negative_control": "off", "prefill_decode": "off", "prefix_cache": "off"}
    report = run(parse_config(data), report_dir=tmp_path / "report")
    inv = report.check("invariance")
    assert inv is not None and inv.verdict == "pass", inv
    assert report.environment["trials"] == len(report.schedule) == 1000
    assert inv.trials == 1000 and inv.divergent == 0  # 1,000 distinct trials, all judged
    assert "production" not in report.environment["engines"]  # no check asked for it
    assert not [d for d in report.divergences if d.check == "invariance"]
    assert report.complete and report.exit_code() == 0
