"""One writer owns a run's report folder (oracle.render.files.ReportWriter): each state written once, the
run's child adopts the started report its parent wrote, a final report is never overwritten by a late
"stopped" one, and nothing is written outside the run's own folder."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
from run_process import stale_pass

import oracle.report
from oracle.config import parse_config
from oracle.lifecycle.run_guard import RunGuard, replace_stale_report
from oracle.lifecycle.signals import Interrupted
from oracle.render.files import STARTED, ReportWriter, write_formats
from oracle.report import Report
from oracle.runner import run


def _config(model: Path, report_dir: Path) -> dict[str, Any]:
    return {"model": str(model), "engine": {"kind": "fake_engine:FakeEngine"},
            "prompts": {"random": {"count": 2, "min_len": 2, "max_len": 4}}, "sampling": {"max_tokens": 3},
            "schedule": {"trials": 4, "seed": 3}, "report_dir": str(report_dir)}


@pytest.fixture
def report_writes(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every report.json written, as its JSON, in order."""
    writes: list[dict[str, Any]] = []
    real = oracle.report.write_atomic

    def counting(path: Path, text: str) -> None:
        if path.name == "report.json":
            writes.append(json.loads(text))
        real(path, text)

    monkeypatch.setattr(oracle.report, "write_atomic", counting)
    return writes


def test_the_runs_child_adopts_the_started_report_and_writes_once(fake_model: Path, tmp_path: Path,
                                                                 report_writes: list[dict[str, Any]]) -> None:
    """The parent of `oracle run` writes "started"; its child writes the final report only (it wrote
    "started" a second time before)."""
    folder = tmp_path / "report"
    config = parse_config(_config(fake_model, folder))
    with RunGuard(config, folder, None, announce=False) as parent:
        pass
    assert [w["error"] for w in report_writes] == [STARTED]
    with RunGuard(config, folder, parent.seed, announce=False, adopt=True) as child:
        report = run(config, seed=child.seed, writer=child.writer, views=[write_formats])
    assert len(report_writes) == 2 and report_writes[-1]["complete"] is True
    assert json.loads((folder / "report.json").read_text())["seed"] == report.seed
    assert (folder / "summary.md").is_file()


def test_a_stopped_report_never_replaces_a_final_one(tmp_path: Path) -> None:
    """The guard's writer (the parent, or the child's guard after the runner) stops with an error only
    while the folder holds what it last wrote: the runner's final report stands."""
    guard = ReportWriter(tmp_path)
    guard.started(Report(oracle_version="x", seed=1, config={}, config_digest="0" * 64, environment={}))
    done = Report(oracle_version="x", seed=1, config={}, config_digest="0" * 64, environment={})
    done.complete = True
    ReportWriter(tmp_path).final(done)  # another writer: the run's child
    late = Report(oracle_version="x", seed=1, config={}, config_digest="0" * 64, environment={})
    assert guard.stopped(late, Interrupted(signal.SIGTERM)) is False
    assert json.loads((tmp_path / "report.json").read_text())["complete"] is True
    assert guard.untouched() is False


def test_a_config_that_cannot_be_read_replaces_the_default_folders_pass(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose config cannot be read would have written the default folder: an earlier pass there is
    replaced (a CI step reading the folder afterwards must not publish it as this run's)."""
    monkeypatch.chdir(tmp_path)
    stale_pass(tmp_path / "oracle-report")
    e = Interrupted(signal.SIGTERM)
    replace_stale_report(tmp_path / "missing.yaml", None, e)
    assert json.loads((tmp_path / "oracle-report" / "report.json").read_text())["exit_code"] == 143
    assert e.report_dir == "oracle-report"  # type: ignore[attr-defined]
    # A config whose YAML names its folder: that folder is the run's own, and its stale pass is replaced.
    named = tmp_path / "named.yaml"
    named.write_text("report_dir: mine\nmodel: 3\n")
    stale_pass(tmp_path / "mine")
    replace_stale_report(named, None, e)
    assert json.loads((tmp_path / "mine" / "report.json").read_text())["exit_code"] == 143


def test_the_runners_final_report_stands_when_the_guard_stops(fake_model: Path, tmp_path: Path) -> None:
    """A signal that ends the run after the runner wrote its partial report (with what completed): the
    guard sharing the runner's writer leaves that report as it is."""
    folder = tmp_path / "report"
    config = parse_config(_config(fake_model, folder))
    with pytest.raises(Interrupted), RunGuard(config, folder, None, announce=False) as guard:
        run(config, seed=guard.seed, writer=guard.writer)
        raise Interrupted(signal.SIGTERM)
    report = json.loads((folder / "report.json").read_text())
    assert report["complete"] is True and any(c["name"] == "invariance" for c in report["checks"])
