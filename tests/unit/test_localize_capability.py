"""`oracle localize` on an engine without a capture capability is not an engine error: exit 2, naming the
capability to add; and the run's own note says the same."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import write_fake_checkpoint

from oracle.cli import main
from oracle.config import parse_config
from oracle.render.files import write_formats
from oracle.runner import run


def test_localize_on_an_engine_that_cannot_capture_says_how_to_add_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    cfg = {"model": str(write_fake_checkpoint(tmp_path / "m")),
           "engine": {"kind": "fake_engine:FakeEngine", "options": {"diverge_from_batch": 2}},
           "prompts": {"random": {"count": 2, "min_len": 2, "max_len": 5}}, "sampling": {"max_tokens": 4},
           "schedule": {"trials": 6, "seed": 3, "batch_size": [2, 8], "repeat_trials": 1, "shrink": False},
           "checks": {"prefill_decode": "off", "prefix_cache": "off"}}
    report = run(parse_config(cfg), report_dir=out, views=[write_formats])
    assert report.exit_code() == 1
    notes = report.check("invariance").evidence["localize_notes"]
    assert any("the fake engine declares" in note and "capture(run, rows)" in note for note in notes), notes
    trial = next(d.trial_id for d in report.divergences if d.trial_id is not None)
    capsys.readouterr()
    code = main(["localize", str(out / "report.json"), "--trial", str(trial), "--trust-report"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "fake_engine:FakeEngine declares no way to capture its ops" in err
    assert "capture(run, rows)" in err and "LocalizesInWorker" in err and len(err.splitlines()) == 1
