"""Replay commands in the console and summary.md name the real report.json (no placeholder), with
--trust-report where the config loads code (a custom engine here)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from conftest import write_fake_checkpoint
from rich.console import Console

from oracle.config import parse_config
from oracle.render.console import print_summary
from oracle.render.files import write_formats
from oracle.report import Report
from oracle.runner import run


@pytest.fixture(scope="module")
def failing(tmp_path_factory: pytest.TempPathFactory) -> tuple[Report, Path]:
    tmp = tmp_path_factory.mktemp("replay-lines")
    out = tmp / "my reports" / "run1"
    cfg = {
        "model": str(write_fake_checkpoint(tmp / "m")),
        "engine": {"kind": "fake_engine:FakeEngine", "options": {"diverge_from_batch": 4}},
        "prompts": {"random": {"count": 3, "min_len": 2, "max_len": 5}},
        "sampling": {"max_tokens": 4},
        "schedule": {"trials": 12, "seed": 3, "batch_size": [1, 9], "repeat_trials": 1, "max_shrink_runs": 10},
        "checks": {"prefill_decode": "off", "prefix_cache": "off"},
    }
    report = run(parse_config(cfg), report_dir=out, views=[write_formats])
    assert report.exit_code() == 1
    return report, out


def test_summary_md_names_the_real_report(failing: tuple[Report, Path]) -> None:
    _, out = failing
    md = (out / "summary.md").read_text()
    assert "REPORT_DIR" not in md and "REPORT.json" not in md
    assert f"oracle replay {out / 'report.json'} --trial " in md
    assert "--trust-report" in md  # the config names a custom engine


def test_console_names_the_real_report(failing: tuple[Report, Path]) -> None:
    report, out = failing
    buf = io.StringIO()
    console = Console(file=buf, width=400, markup=False, highlight=False, color_system=None)
    print_summary(console, report, str(out / "report.json"))
    text = buf.getvalue()
    assert "REPORT.json" not in text
    assert f"replay: oracle replay {out / 'report.json'} --trial " in text and "--trust-report" in text
