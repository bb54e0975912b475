"""The report's views agree with the verdict and show user strings as data.

JUnit fails exactly the targets of required checks that diverged; warn- and report-level findings
are not failures; report-only checks that found divergences say `reported`; the headline says
`passed with warnings`; golden failures name target, step, tokens and what changed; every format
survives hostile target names and error text; the console fits 80 columns.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import pytest
from conftest import write_fake_checkpoint
from hand_report import HOSTILE, check_with, hand_report
from rich.console import Console

from oracle.config import parse_config
from oracle.render.console import ConsoleObserver, print_summary
from oracle.render.files import write_formats
from oracle.render.html import render_html
from oracle.render.junit import render_junit
from oracle.render.markdown import render_markdown
from oracle.report import Report
from oracle.runner import run


def replace(model: Any, **changes: Any) -> Any:
    return model.model_copy(update=changes)


def _failures(xml: str) -> set[tuple[str, str]]:
    root = ET.fromstring(xml)
    return {(str(case.get("classname")).removeprefix("oracle."), str(case.get("name")))
            for case in root.iter("testcase") if case.find("failure") is not None}


def _passing_with_warnings() -> Report:
    """Required checks pass; prefill_decode (warn) fails; drift (report) found divergences."""
    r = hand_report()
    r.checks = [c if c.name not in ("invariance", "golden") else
                check_with(c, verdict="pass", divergent=0, message="fine") for c in r.checks]
    r.divergences = [d for d in r.divergences if d.check not in ("invariance",)]
    return r


# --- JUnit -------------------------------------------------------------------------------------------

def test_junit_failures_are_the_required_divergences_of_a_real_run(tmp_path: Path) -> None:
    cfg = {
        "model": str(write_fake_checkpoint(tmp_path / "m")),
        "engine": {"kind": "fake_engine:FakeEngine", "options": {"diverge_from_batch": 3, "diverge_step": 1}},
        "prompts": {"random": {"count": 3, "min_len": 2, "max_len": 5}},
        "sampling": {"max_tokens": 4},
        "schedule": {"trials": 12, "seed": 5, "batch_size": [1, 6], "repeat_trials": 2, "max_shrink_runs": 10},
        "checks": {"repeatability": "warn"},
        "report_dir": str(tmp_path / "report"),
    }
    run(parse_config(cfg), views=[write_formats])
    data = json.loads((tmp_path / "report" / "report.json").read_text())
    blocking = {c["name"] for c in data["checks"] if c["requirement"] == "required" and c["verdict"] == "fail"}
    expected = {(d["check"], d["target"]) for d in data["divergences"] if d["check"] in blocking}
    assert expected, "the planted fault must make a required check diverge"
    assert _failures((tmp_path / "report" / "junit.xml").read_text()) == expected


def test_junit_warn_and_report_findings_are_not_failures() -> None:
    r = hand_report()
    found = _failures(render_junit(r))
    # invariance (required) on two targets and golden (required) on one; prefill_decode (warn) and drift
    # (report) diverged too, but only as properties and system-out.
    assert found == {("invariance", "random-0"), ("invariance", HOSTILE_AS_XML), ("golden", "random-1")}
    root = ET.fromstring(render_junit(r))
    prefill = root.find("testsuite[@name='oracle.prefill_decode']")
    assert prefill is not None and prefill.get("failures") == "0"
    outs = " ".join(x.text or "" for x in prefill.iter("system-out"))
    assert "warn-level prefill_decode finding" in outs
    drift = root.find("testsuite[@name='oracle.drift']")
    assert drift is not None and drift.get("failures") == "0"
    verdicts = {p.get("value") for p in drift.iter("property") if p.get("name") == "verdict"}
    assert verdicts == {"reported"}


def test_junit_of_a_passing_run_has_no_failure() -> None:
    xml = render_junit(_passing_with_warnings())
    assert _failures(xml) == set() and "<error" not in xml


def test_junit_engine_error_is_an_error_and_well_formed() -> None:
    r = hand_report(error="worker died: \x1b[1mboom\x00 <stack> & \ud83d")
    root = ET.fromstring(render_junit(r))
    engine = root.find("testsuite[@name='oracle.engine']")
    assert engine is not None and engine.get("errors") == "1"
    err = engine.find("testcase/error")
    assert err is not None and "boom" in (err.text or "") and "\x1b" not in (err.text or "")


def _variants() -> list[Report]:
    failing, passing, broken = hand_report(), _passing_with_warnings(), hand_report(error="engine died")
    vacuous = _passing_with_warnings()  # a required check vacuous with nothing to blame: exit 1
    vacuous.checks = [check_with(c, verdict="vacuous") if c.name == "repeatability" else c for c in vacuous.checks]
    warn_error = _passing_with_warnings()  # a warn-level check in error: exit 0
    warn_error.checks = [check_with(c, verdict="error") if c.name == "prefill_decode" else c for c in warn_error.checks]
    return [failing, passing, broken, vacuous, warn_error]


@pytest.mark.parametrize("report", _variants(), ids=["failing", "passing", "engine-error", "vacuous", "warn-error"])
def test_junit_has_a_failure_or_error_exactly_when_the_exit_code_is_not_0(report: Report) -> None:
    root = ET.fromstring(render_junit(report))
    bad = sum(int(s.get("failures", "0")) + int(s.get("errors", "0")) for s in root.iter("testsuite"))
    assert bad == len(root.findall(".//failure")) + len(root.findall(".//error"))
    assert (bad > 0) == (report.exit_code() != 0), report.exit_code()


HOSTILE_AS_XML = "evil\\x1b[31mRED\\x07\\x00<b>bold</b>`code`|cell\\ud800\\x0c&amp;"


def test_junit_is_well_formed_for_any_target_name() -> None:
    xml = render_junit(hand_report())
    xml.encode("utf-8")  # writable: no lone surrogate left
    root = ET.fromstring(xml)
    names = {c.get("name") for c in root.iter("testcase")}
    assert HOSTILE_AS_XML in names and HOSTILE not in names


# --- headline, reported, golden -----------------------------------------------------------------------

def test_report_only_divergences_show_reported_and_warnings_in_the_headline() -> None:
    r = _passing_with_warnings()
    assert r.exit_code() == 0
    md = render_markdown(r)
    assert md.startswith("## oracle: passed with warnings (exit 0)")
    assert "| drift | report | *reported* |" in md and "| prefill_decode | warn | *warning: fail* |" in md
    page = render_html(r)
    assert "oracle report: passed with warnings (exit 0)" in page and '<td class="reported">reported</td>' in page
    out = _console(r, 140)
    assert "passed with warnings (exit 0)" in out
    drift_row = next(ln for ln in out.splitlines() if ln.strip().startswith("drift"))
    assert "reported" in drift_row and " pass " not in drift_row


def test_a_clean_run_just_passes() -> None:
    r = _passing_with_warnings()
    r.checks = [check_with(c, verdict="pass", divergent=0) for c in r.checks]
    r.divergences = []
    assert render_markdown(r).startswith("## oracle: passed (exit 0)")


def test_golden_failure_names_target_step_tokens_and_what_changed() -> None:
    r = hand_report()
    md = render_markdown(r)
    line = "golden: target random-1: step 2: token 7 -> 9"
    assert line in md
    assert "torch: 2.11.0 -> 2.13.0" in md and "config digest: aaaaaaaaaaaa -> bbbbbbbbbbbb" in md
    out = _console(r, 140)
    assert "golden: target random-1: step 2: token 7 -> 9" in out
    assert "config digest: aaaaaaaaaaaa -> bbbbbbbbbbbb" in out


# --- escaping -----------------------------------------------------------------------------------------

def test_markdown_escapes_html_backticks_and_control_bytes() -> None:
    md = render_markdown(hand_report(error="bad `rm -rf` <img src=x onerror=alert(1)>\x1b[2J"))
    assert "<b>" not in md and "<img" not in md and "\x1b" not in md and "\x00" not in md
    assert "&lt;b>bold&lt;/b>" in md and "\\`code\\`" in md and "\\`rm -rf\\`" in md
    # every table row still has its cells: the | in the name is escaped
    row = next(ln for ln in md.splitlines() if ln.startswith("| evil"))
    assert len(re.findall(r"(?<!\\)\|", row)) == 11


def test_console_strips_control_and_escape_bytes() -> None:
    out = _console(hand_report(error="died \x1b]0;title\x07 \x9b31m"), 140)
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out and "\x00" not in out
    assert "evil\\x1b[31mRED" in out


def test_html_escapes_user_strings() -> None:
    page = render_html(hand_report())
    assert "<b>bold" not in page and "\x1b" not in page and "&lt;b&gt;bold" in page
    page.encode("utf-8")


# --- console ------------------------------------------------------------------------------------------

def _console(report: Report, width: int, max_rows: int = 5) -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=width, markup=False, highlight=False, color_system=None)
    print_summary(console, report, "oracle-report/report.json", max_rows=max_rows)
    return buf.getvalue()


def test_console_fits_80_columns_and_counts_cut_rows() -> None:
    out = _console(hand_report(), 80, max_rows=2)
    # A command to paste (replay) is one line at any width (test_replay_lines); every other line fits.
    assert max(len(ln) for ln in out.splitlines() if "oracle replay" not in ln) <= 80
    assert "... and 2 more in report.json" in out  # 4 invariant-mode divergences, 2 shown
    for word in ("invariance", "required", "fail", "reported", "2.13.0"):
        assert word in out


def test_console_highlights_the_shrunk_minimal_trial_first() -> None:
    out = _console(hand_report(), 80, max_rows=1)
    assert "minimal failing trial (shrunk): trial 7, batch 2" in out
    assert re.search(r"^\s*random-0\s+7\*", out, re.M), out


def test_console_names_the_first_diverging_op() -> None:
    out = _console(hand_report(), 140)
    assert "first diverging op: model.layers.1.mlp.down_proj (aten::mm), layer 1, pass 3" in out


def test_heartbeat_lines_without_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    buf = io.StringIO()
    obs = ConsoleObserver(Console(file=buf, width=80), heartbeat_every=3, heartbeat_s=None)
    obs.phase("invariant", 10)
    for i in range(10):
        obs.advance(i // 4)
    obs.done()
    lines = buf.getvalue().splitlines()
    assert lines == ["invariant: 10 engine runs", "invariant: 3/10 engine runs, 0 divergent",
                     "invariant: 6/10 engine runs, 1 divergent", "invariant: 9/10 engine runs, 2 divergent",
                     "invariant: done 10/10"]


# --- HTML plots, localized op, coverage ---------------------------------------------------------------

def test_html_plots_per_check_with_axes_counts_and_empty_buckets() -> None:
    page = render_html(hand_report())
    for check in ("invariance", "prefill_decode", "drift"):
        assert f'id="plots-{check}"' in page
    assert page.count('class="axis-label"') == 2 * page.count('<svg xmlns')
    assert "batch size (requests in the trial)" in page and "trials diverged (%)" in page
    # drift ULPs 40 and 1000: buckets 2^5 .. 2^9, the three between them empty but shown
    drift = page[page.index('id="plots-drift"'):]
    drift = drift[:drift.index("</section>")]
    ulp = drift[drift.index("ULP distance of the first divergent logprob"):]
    ticks = re.findall(r'class="tick"[^>]*>([^<]*)<', ulp)
    assert ticks == ["2^5", "2^6", "2^7", "2^8", "2^9"]
    counts = re.findall(r'class="count"[^>]*>([^<]*)<', ulp)
    assert counts == ["1", "0", "0", "0", "1"]
    # rate by batch: counts per bar, and bars placed on a numeric axis (batch 1, 3, 5, 9)
    rate = drift[:drift.index("first-divergence step")]
    assert re.findall(r'class="count"[^>]*>([^<]*)<', rate) == ["0/1", "1/2", "0/1", "1/2"]
    xs = [float(x) + float(w) / 2 for x, w in re.findall(r'<rect class="bar" x="([\d.]+)" y="[\d.]+" width="([\d.]+)"',
                                                          rate)]
    gap = (xs[1] - xs[0]) / 2
    assert xs[2] - xs[1] == pytest.approx(2 * gap, abs=0.2) and xs[3] - xs[2] == pytest.approx(4 * gap, abs=0.2)


def test_html_localized_op_coverage_and_minimal_row() -> None:
    page = render_html(hand_report())
    assert "<th>first diverging op</th>" in page and "model.layers.1.mlp.down_proj (aten::mm)" in page
    assert "<h2>Coverage</h2>" in page and "<td>chunked_prefill</td><td>5</td>" in page
    assert '<tr class="minimal">' in page and "(minimal, shrunk)" in page


def test_markdown_localized_op_and_coverage() -> None:
    md = render_markdown(hand_report())
    assert "first diverging op |" in md and "model.layers.1.mlp.down_proj (aten::mm), layer 1, pass 3" in md
    assert "### coverage" in md and "| chunked\\_prefill | 5 |" not in md and "| chunked_prefill | 5 |" in md
    assert "**7 (minimal, shrunk)**" in md


def test_views_without_localized_op_or_coverage() -> None:
    r = hand_report(with_extras=False)
    md, page = render_markdown(r), render_html(r)
    assert "first diverging op" not in md and "coverage" not in md
    assert "first diverging op" not in page and "Coverage" not in page
    assert "first diverging op" not in _console(r, 140)


def test_markdown_keeps_a_greater_than_sign_readable_and_never_opens_a_quote() -> None:
    from oracle.render.escape import markdown_text

    assert markdown_text("target KV length > 64 in a shared pass") == "target KV length > 64 in a shared pass"
    assert markdown_text("> quoted") == "\\> quoted"  # at the start of a line it would open a blockquote
    assert markdown_text("a < b & c") == "a &lt; b &amp; c"


def test_coverage_counts_numbers_by_value_and_one_sequence_in_the_singular(fake_model: Path, tmp_path: Path) -> None:
    from oracle.config import parse_config
    from oracle.runner import run

    cfg = {"model": str(fake_model), "engine": {"kind": "fake_engine:FakeEngine"},
           "prompts": {"random": {"count": 2, "min_len": 2, "max_len": 5}}, "sampling": {"max_tokens": 3},
           "schedule": {"trials": 4, "seed": 3, "batch_size": [2, 2], "repeat_trials": 1},
           "checks": {"prefill_decode": "off", "prefix_cache": "off"}}
    coverage = run(parse_config(cfg), report_dir=tmp_path / "r").coverage
    assert coverage.get("shared with 1 sequence", 0) > 0 and "shared with 1 sequences" not in coverage
    kv = [k for k in coverage if k.startswith("target KV length >")]
    bounds = [int(k.split("> ")[1].split()[0]) for k in kv]
    for i in range(len(kv) - 1):
        if coverage[kv[i]] == coverage[kv[i + 1]]:  # equal counts: by the number's value, 64 before 512
            assert bounds[i] < bounds[i + 1], kv
    assert len(kv) >= 4


def test_html_environment_shows_engines_and_posture_as_tables_not_reprs() -> None:
    from oracle.render.html import render_html

    r = hand_report()
    r.environment["engines"] = {"invariant": {"engine": "native", "kernels": ["mm", "bmm"], "threads": 1},
                                "production": {"engine": "native", "note": None}}
    page = render_html(r)
    env = page[page.index("<h2>Environment</h2>"):]
    assert "{'" not in env and "{&#x27;" not in env and "[&#x27;" not in env  # no Python dict or list repr
    assert "<th>invariant</th>" in env and "<th>kernels</th><td>mm, bmm</td>" in env
