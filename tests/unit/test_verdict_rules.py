"""Every view states a check's verdict and a run's first divergence by the same rules (oracle.render.verdict).

Hand-made Reports, one check each, rendered by the console, summary.md, report.html, junit.xml, the pytest
failure text and the GitHub Action's annotations: the verdict word, the headline, whether the check is a
warning or blocks, and the divergence shown first (the shrunk minimal trial) must agree across them.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from hand_report import divergence, hand_report
from rich.console import Console

from oracle.pytest_plugin.failure import describe_failure
from oracle.render.console import print_summary, style
from oracle.render.github import workflow_commands
from oracle.render.html import render_html
from oracle.render.junit import render_junit
from oracle.render.markdown import render_markdown
from oracle.render.verdict import first_divergence, gate, headline, is_warning, minimal_first, shown_verdict
from oracle.report import CheckResult, DivergenceRecord, Report

PATH = Path("oracle-report/report.json")

# (requirement, verdict, divergent) -> the word every view shows, and what the check means for a gate.
CASES = {
    "required-pass": ("required", "pass", 0, "pass", "pass"),
    "required-fail": ("required", "fail", 2, "fail", "fail"),
    "required-vacuous": ("required", "vacuous", 0, "vacuous", "fail"),
    "required-error": ("required", "error", 0, "error", "fail"),
    "skipped": ("warn", "skipped", 0, "skipped", "skip"),
    "reported": ("report", "pass", 2, "reported", "pass"),
    "report-clean": ("report", "pass", 0, "pass", "pass"),
    "report-vacuous": ("report", "vacuous", 0, "vacuous", "pass"),
    "report-gate-fail": ("report", "fail", 2, "fail", "warn"),
    "warn-fail": ("warn", "fail", 2, "fail", "warn"),
    "warn-vacuous": ("warn", "vacuous", 0, "vacuous", "warn"),
    "warn-error": ("warn", "error", 0, "error", "warn"),
}


def one_check(requirement: str, verdict: str, divergent: int, divs: list[DivergenceRecord] | None = None) -> Report:
    """A complete report of one check, `drift`, whose divergences (when `divergent`) are on two targets."""
    r = hand_report()
    r.checks = [CheckResult(name="drift", requirement=requirement, verdict=verdict,  # type: ignore[arg-type]
                            trials=10, divergent=divergent, message="the check's message")]
    if divs is None:
        divs = [divergence("drift", "random-0", 1, mode="production"),
                divergence("drift", "random-1", 2, mode="production")][:divergent]
    r.divergences = divs
    return r


# --- what each view says -------------------------------------------------------------------------------

def console_text(report: Report, width: int = 140, max_rows: int = 5) -> str:
    buf = io.StringIO()
    print_summary(Console(file=buf, width=width, markup=False, highlight=False, color_system=None), report,
                  str(PATH), max_rows=max_rows)
    return buf.getvalue()


def console_word(report: Report, check: str) -> str:
    row = next(ln for ln in console_text(report).splitlines() if ln.split()[:1] == [check])
    return row.split()[2]


def markdown_word(report: Report, check: str) -> str:
    row = next(ln for ln in render_markdown(report).splitlines() if ln.startswith(f"| {check} | "))
    return row.split(" | ")[2].strip("*").removeprefix("warning: ").lower()


def html_cell(report: Report, check: str) -> tuple[str, str]:
    """The verdict cell's class and text."""
    m = re.search(rf'<tr><td>{check}</td><td>[a-z]+</td><td class="([^"]*)">([^<]*)</td>', render_html(report))
    assert m, check
    return m.group(1), m.group(2)


def junit_words(report: Report, check: str) -> set[str]:
    suite = ET.fromstring(render_junit(report)).find(f"testsuite[@name='oracle.{check}']")
    assert suite is not None
    return {str(p.get("value")) for p in suite.iter("property") if p.get("name") == "verdict"}


def pytest_word(report: Report, c: CheckResult) -> str:
    head = describe_failure(report, PATH, [c]).splitlines()[0]
    m = re.match(rf"oracle: {c.name} (\w+) \(seed", head)
    assert m, head
    return m.group(1)


def annotation_kinds(report: Report) -> list[str]:
    return [line.split(" ", 1)[0].removeprefix("::") for line in workflow_commands(report, PATH, report.exit_code())]


# --- the verdict word --------------------------------------------------------------------------------

@pytest.mark.parametrize("case", list(CASES))
def test_every_view_states_the_same_verdict_word(case: str) -> None:
    requirement, verdict, divergent, word, _ = CASES[case]
    r = one_check(requirement, verdict, divergent)
    c = r.checks[0]
    assert shown_verdict(c) == word
    assert console_word(r, "drift") == word
    assert markdown_word(r, "drift") == word
    assert html_cell(r, "drift")[1].removeprefix("warning: ") == word
    assert junit_words(r, "drift") == {word}
    assert pytest_word(r, c) == word


@pytest.mark.parametrize("case", list(CASES))
def test_every_view_states_the_same_headline(case: str) -> None:
    requirement, verdict, divergent, _, outcome = CASES[case]
    r = one_check(requirement, verdict, divergent)
    line = headline(r)
    expected = {"fail": "failed (exit 1)", "warn": "passed with warnings (exit 0)"}.get(outcome, "passed (exit 0)")
    assert line == expected
    assert f"oracle checks: {line}" in console_text(r)
    assert render_markdown(r).startswith(f"## oracle: {line}\n")
    assert f"<h1>oracle report: {line}</h1>" in render_html(r)


@pytest.mark.parametrize("case", list(CASES))
def test_warnings_and_blocking_checks_agree_across_views(case: str) -> None:
    """A blocking check is an error annotation, a JUnit failure or error, red in the console, bold in summary.md and
    `blocking` in report.html; a warning is a warning annotation and says `warning:` in summary.md and report.html."""
    requirement, verdict, divergent, _, outcome = CASES[case]
    r = one_check(requirement, verdict, divergent)
    c = r.checks[0]
    assert gate(c) == outcome
    assert annotation_kinds(r) == {"fail": ["error"], "warn": ["warning"]}.get(outcome, [])
    root = ET.fromstring(render_junit(r))
    assert bool(root.findall(".//failure") or root.findall(".//error")) == (outcome == "fail")
    assert (style(c) == "red") == (outcome == "fail")
    cls, text = html_cell(r, "drift")
    assert ("blocking" in cls.split()) == (outcome == "fail")
    assert text.startswith("warning: ") == (outcome == "warn") == is_warning(c)
    cell = next(ln for ln in render_markdown(r).splitlines() if ln.startswith("| drift | ")).split(" | ")[2]
    assert cell.startswith("**") == (outcome == "fail")
    assert cell.startswith("*warning: ") == (outcome == "warn")


def test_a_required_vacuous_check_is_as_loud_as_a_failure() -> None:
    r = one_check("required", "vacuous", 0)
    assert r.exit_code() == 1
    assert "| drift | required | **VACUOUS** |" in render_markdown(r)
    assert html_cell(r, "drift") == ("vacuous blocking", "vacuous")
    assert style(r.checks[0]) == "red"


# --- the first divergence ------------------------------------------------------------------------------

def _trials_in_order(text: str) -> list[int]:
    return [int(t) for t in re.findall(r"trial (\d+)", text)]


def invariance_report(divs: list[DivergenceRecord]) -> Report:
    r = hand_report()
    r.checks = [CheckResult(name="invariance", requirement="required", verdict="fail", trials=10,
                            divergent=len(divs), message="diverged")]
    r.divergences = divs
    return r


FIRST_CASES = {
    # the shrunk minimal trial (9) comes last in the report: every view shows it first
    "shrunk": ([divergence("invariance", "random-0", 3), divergence("invariance", "random-0", 5),
                divergence("invariance", "random-0", 9, batch=2, shrunk=True)], 9),
    # without a shrunk trial: the report's first
    "report order": ([divergence("invariance", "random-0", 5), divergence("invariance", "random-0", 3)], 5),
    # more than JUnit lists (20): the minimal one is never the one cut
    "many": ([divergence("invariance", "random-0", i) for i in range(1, 30)]
             + [divergence("invariance", "random-0", 99, batch=2, shrunk=True)], 99),
}


@pytest.mark.parametrize("case", list(FIRST_CASES))
def test_every_view_shows_the_same_first_divergence(case: str) -> None:
    divs, first = FIRST_CASES[case]
    r = invariance_report(divs)
    d = first_divergence(r, ["invariance"])
    assert d is not None and d.trial_id == first
    assert minimal_first(r.divergences)[0] is d

    table = console_text(r).split("invariant-mode divergences", 1)[1]
    first_row = next(ln for ln in table.splitlines() if ln.strip().startswith("random-0"))
    assert first_row.split()[1].rstrip("*") == str(first)

    md = render_markdown(r)
    md_row = next(ln for ln in md.splitlines() if ln.startswith("| random-0 | "))
    assert md_row.split(" | ")[1].strip("*").split()[0] == str(first)
    assert f"--trial {first}`" in md  # the replay line

    page = render_html(r)
    html_row = page.split("<th>seqs</th></tr>", 1)[1]
    assert re.match(rf"<tr[^>]*><td>invariance</td><td>random-0</td><td>{first}\b", html_row)

    failure = ET.fromstring(render_junit(r)).find(".//failure")
    assert failure is not None and _trials_in_order(failure.text or "")[0] == first

    text = describe_failure(r, PATH)
    assert f"first divergence: check invariance (invariant mode), target random-0, trial {first}," in text
    assert text.splitlines()[-2].endswith(f"--trial {first}")

    (annotation,) = workflow_commands(r, PATH, r.exit_code())
    assert f"first divergence: target random-0, trial {first}," in annotation


def test_first_divergence_is_per_check() -> None:
    """The shrunk trial of another check is not this check's first divergence."""
    r = invariance_report([divergence("invariance", "random-0", 4),
                           divergence("prefill_decode", "random-0", 8, shrunk=True)])
    d = first_divergence(r, ["invariance"])
    assert d is not None and d.trial_id == 4
    assert first_divergence(r, ["drift"]) is None
