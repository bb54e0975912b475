"""report.json validates against its schema; JUnit, Markdown and HTML are written beside it."""

from __future__ import annotations

import json
import shutil
import subprocess
from importlib import resources
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from conftest import write_fake_checkpoint

from oracle.config import parse_config
from oracle.render.files import write_formats
from oracle.runner import run

jsonschema = pytest.importorskip("jsonschema")


@pytest.fixture(scope="module")
def failing_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("formats")
    model = write_fake_checkpoint(tmp / "m")
    cfg = {
        "model": str(model),
        "engine": {"kind": "fake_engine:FakeEngine", "options": {"diverge_from_batch": 4, "diverge_step": 1}},
        "prompts": {"random": {"count": 3, "min_len": 2, "max_len": 5}},
        "sampling": {"max_tokens": 4},
        "schedule": {"trials": 15, "seed": 3, "batch_size": [1, 9], "repeat_trials": 2, "max_shrink_runs": 20},
        "report_dir": str(tmp / "report"),
    }
    run(parse_config(cfg), views=[write_formats])
    return tmp / "report"


def _schema() -> dict:  # type: ignore[type-arg]
    return json.loads((resources.files("oracle") / "report.schema.json").read_text())


def test_report_validates_against_schema(failing_report: Path) -> None:
    data = json.loads((failing_report / "report.json").read_text())
    jsonschema.validate(data, _schema())
    assert data["divergences"], "the planted fault must produce divergences to validate"


def test_schema_rejects_a_broken_report(failing_report: Path) -> None:
    data = json.loads((failing_report / "report.json").read_text())
    data["checks"][0]["verdict"] = "maybe"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, _schema())


def test_junit_has_a_testcase_per_check_and_target(failing_report: Path) -> None:
    root = ET.parse(failing_report / "junit.xml").getroot()
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    inv = suites["oracle.invariance"]
    cases = inv.findall("testcase")
    assert len(cases) == 3  # one per target
    assert int(inv.get("failures", "0")) >= 1 and inv.find("testcase/failure") is not None


def test_markdown_summary(failing_report: Path) -> None:
    md = (failing_report / "summary.md").read_text()
    assert md.startswith("## oracle: failed (exit 1)")
    assert "| invariance | required | **FAIL** |" in md
    assert "oracle replay" in md


def test_html_is_self_contained_with_plots(failing_report: Path) -> None:
    page = (failing_report / "report.html").read_text()
    # one section of plots per check that diverged: rate by batch size, first step, ULP buckets
    assert 'id="plots-invariance"' in page and page.count('<figure class="plot">') >= 3
    assert page.count("<rect class=\"bar\"") >= 3
    assert "<script" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium not installed (.ci/run installs Debian's chromium)")
def test_html_renders_in_headless_chromium(failing_report: Path, tmp_path: Path) -> None:
    """Chromium loads the page and its DOM (after layout) still holds the plots' bars."""
    assert CHROMIUM is not None
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0", "--dump-dom",
           (failing_report / "report.html").as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count('class="bar"') >= 3 and "oracle report" in proc.stdout
    console_errors = [ln for ln in proc.stderr.splitlines() if "CONSOLE" in ln and "error" in ln.lower()]
    assert not console_errors, console_errors
    shot = tmp_path / "shot.png"
    subprocess.run([*cmd[:-2], f"--screenshot={shot}", "--window-size=1200,1600",
                    (failing_report / "report.html").as_uri()], capture_output=True, timeout=120)
    assert shot.is_file() and shot.stat().st_size > 10_000


def test_committed_schema_is_the_report_models_schema() -> None:
    from oracle.report import report_schema

    assert _schema() == json.loads(json.dumps(report_schema())), "run `python -m oracle.report` to regenerate it"
