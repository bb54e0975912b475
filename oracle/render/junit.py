"""JUnit XML: one testcase per check and target, so CI systems list them as tests.

It agrees with the verdict: a `<failure>` only where a required check failed for that target
(its divergences, or its golden difference); a required check that failed or was vacuous with no
target to blame fails one `all targets` case. Warn- and report-level findings are properties and
`<system-out>`, never failures; a required check in error and an engine error are `<error>`. So
the file has a failure or an error exactly when the exit code is not 0. A target's divergences are
listed as every view lists them (oracle.render.verdict): the shrunk minimal trial first. Every string
is made XML 1.0 safe (see oracle.render.escape), whatever the target names or error text hold.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Literal, TypeAlias
from xml.etree import ElementTree as ET

from oracle.render.escape import xml_text
from oracle.render.findings import golden_lines, localized_line, replay_line, ulp_text
from oracle.render.verdict import minimal_first, shown_verdict
from oracle.report import CheckResult, DivergenceRecord, Report

_MAX_LISTED = 20
_SKIPPED = ("vacuous", "skipped")  # a JUnit <skipped> where they do not block
Outcome: TypeAlias = Literal["failures", "errors", "skipped"] | None  # the count a testcase adds to


def _describe(d: DivergenceRecord) -> str:
    text = (f"trial {d.trial_id} step {d.step} {d.kind}: token {d.expected_token} -> {d.actual_token}, "
            f"logprob {d.expected_logprob!r} -> {d.actual_logprob!r}, ulp {ulp_text(d) or None}, margin {d.reference_margin}")
    if d.shrunk:
        text += " [minimal trial, shrunk]"
    where = localized_line(d)
    return f"{text}; {where}" if where else text


def _el(parent: ET.Element, tag: str, text: str | None = None, **attrs: object) -> ET.Element:
    el = ET.SubElement(parent, tag, {k: xml_text(v) for k, v in attrs.items()})
    if text is not None:
        el.text = xml_text(text)
    return el


def _properties(case: ET.Element, values: dict[str, object]) -> None:
    props = _el(case, "properties")
    for name, value in values.items():
        _el(props, "property", name=name, value=value)


def render_junit(report: Report, report_path: str = "report.json") -> str:
    """`report_path`: where report.json is, for the replay command of each target's first divergence."""
    by_check: dict[str, dict[str, list[DivergenceRecord]]] = defaultdict(lambda: defaultdict(list))
    for d in minimal_first(report.divergences):  # each target's shrunk minimal trial first, never cut
        by_check[d.check][d.target].append(d)
    targets = {str(t) for t in report.environment.get("target_names", [])}
    suites = ET.Element("testsuites", name="oracle")
    for c in report.checks:
        _check_suite(suites, report, c, by_check.get(c.name, {}), targets, report_path)
    if report.error:
        suite = _el(suites, "testsuite", name="oracle.engine", tests=1, failures=0, errors=1, skipped=0)
        case = _el(suite, "testcase", classname="oracle.engine", name="run")
        lines = str(report.error).splitlines()
        _el(case, "error", report.error, message=(lines[0] if lines else "engine error")[:200])
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def _check_suite(suites: ET.Element, report: Report, c: CheckResult, divs_of: Mapping[str, list[DivergenceRecord]],
                 targets: set[str], report_path: str) -> None:
    """A check's testsuite: a testcase per target, and an `all targets` one for a verdict no target explains."""
    suite = _el(suites, "testsuite", name=f"oracle.{c.name}")
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    golden = {str(g.get("target")): g for g in c.evidence.get("differing", [])} if c.name == "golden" else {}
    outcomes = [_target_case(suite, report, c, target, divs_of.get(target, []), target in golden, report_path)
                for target in sorted(targets | set(divs_of) | set(golden))]
    errored = c.verdict == "error" and c.blocks
    if not errored and "failures" not in outcomes and (c.blocks or not outcomes):
        # A verdict with no target to blame: fidelity tolerances, a vacuous schedule, no targets at all.
        outcomes.append(_unblamed_case(suite, c))
    elif c.verdict in _SKIPPED and not c.blocks:
        # A warn-level vacuous check is a note on its suite, not a failure.
        _el(suite, "system-out", f"{c.requirement}: {shown_verdict(c)}: {c.message}")
    counts["tests"] = len(outcomes)
    for outcome in outcomes:
        if outcome is not None:
            counts[outcome] += 1
    for key, value in counts.items():
        suite.set(key, str(value))


def _target_case(suite: ET.Element, report: Report, c: CheckResult, target: str, divs: list[DivergenceRecord],
                 golden: bool, report_path: str) -> Outcome:
    """One target of a check: a failure where a blocking check diverged for it (or its golden digest changed),
    an error where a blocking check errored, else its findings and verdict as output."""
    case = _el(suite, "testcase", classname=f"oracle.{c.name}", name=target)
    _properties(case, {"requirement": c.requirement, "verdict": shown_verdict(c), "divergences": len(divs)})
    detail = "\n".join(_describe(d) for d in divs[:_MAX_LISTED])
    if len(divs) > _MAX_LISTED:
        detail += f"\n... and {len(divs) - _MAX_LISTED} more in report.json"
    command = next((line for line in (replay_line(report, report_path, d) for d in divs) if line), None)
    if command is not None:  # the target's first divergence in a trial, the shrunk one where it has one
        detail += f"\nreplay: {command}"
    if golden:
        detail = "\n".join(ln for ln in golden_lines(c) if f"target {target}:" in ln or "changed since" in ln)
    found = bool(divs) or golden
    outcome: Outcome = None
    if c.verdict == "error" and c.blocks:
        outcome = "errors"
        _el(case, "error", report.error or c.message, message=c.message or "check error")
    elif found and c.blocks:
        outcome = "failures"
        what = f"{len(divs)} divergences" if divs else "differs from the golden file"
        _el(case, "failure", detail, message=f"{c.name}: {target}: {what}")
    elif found:
        # Warn- and report-level findings (or a required check that passed with them): never a failure.
        _el(case, "system-out", f"{c.requirement}-level {c.name} finding ({shown_verdict(c)}):\n{detail}")
        return None
    _el(case, "system-out", f"{c.requirement}: {shown_verdict(c)}: {c.message}")
    return outcome


def _unblamed_case(suite: ET.Element, c: CheckResult) -> Outcome:
    """The `all targets` case: a failure where the check blocks, a skip where it is vacuous or skipped."""
    case = _el(suite, "testcase", classname=f"oracle.{c.name}", name="all targets")
    _properties(case, {"requirement": c.requirement, "verdict": shown_verdict(c)})
    outcome: Outcome = None
    if c.blocks:
        outcome = "failures"
        _el(case, "failure", c.message, message=f"{c.name}: {shown_verdict(c)}: {c.message}")
    elif c.verdict in _SKIPPED:
        outcome = "skipped"
        _el(case, "skipped", message=f"{shown_verdict(c)}: {c.message}")
    _el(case, "system-out", f"{c.requirement}: {shown_verdict(c)}: {c.message}")
    return outcome
