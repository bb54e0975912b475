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

from collections import Counter, defaultdict
from collections.abc import Mapping
from typing import Literal, TypeAlias
from xml.etree import ElementTree as ET

from oracle.render.escape import xml_text
from oracle.render.findings import golden_lines, localized_line, replay_line, ulp_text
from oracle.render.verdict import error_label, minimal_first, shown_verdict
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
        _el(case, "error", report.error, message=(lines[0] if lines else error_label(report.exit_code()))[:200])
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def _check_suite(suites: ET.Element, report: Report, c: CheckResult, divs_of: Mapping[str, list[DivergenceRecord]],
                 targets: set[str], report_path: str) -> None:
    """A check's testsuite: a testcase per target, and an `all targets` one for a verdict no target explains."""
    suite = _el(suites, "testsuite", name=f"oracle.{c.name}")
    props: dict[str, object] = {}
    if c.strength is not None:  # what a pass rules out, as numbers a CI dashboard can read
        props.update({f"strength.{k}": v for k, v in c.strength.model_dump(mode="json").items()})
    if c.name == "invariance":  # the matched hazards it is gated on, with their evidence class
        props.update(_hazard_properties(report))
    if props:
        _properties(suite, props)
    golden = _golden_targets(c)
    outcomes = [_target_case(suite, report, c, target, divs_of.get(target, []), target in golden, report_path)
                for target in sorted(targets | set(divs_of) | golden)]
    errored = c.verdict == "error" and c.blocks
    if not errored and "failures" not in outcomes and (c.blocks or not outcomes):
        # A verdict with no target to blame: fidelity tolerances, a vacuous schedule, no targets at all.
        outcomes.append(_unblamed_case(suite, c))
    elif c.verdict in _SKIPPED and not c.blocks:
        # A warn-level vacuous check is a note on its suite, not a failure.
        _el(suite, "system-out", f"{c.requirement}: {shown_verdict(c)}: {c.message}")
    _set_counts(suite, outcomes)


def _hazard_properties(report: Report) -> dict[str, object]:
    """`hazard.ID.evidence` (verified, failed, not verified) and `hazard.ID.why` per matched hazard."""
    hazards = report.posture.hazards if report.posture is not None else []
    return {k: v for h in hazards for k, v in ((f"hazard.{h.id}.evidence", h.evidence), (f"hazard.{h.id}.why", h.why))}


def _golden_targets(c: CheckResult) -> set[str]:
    """The targets a golden check found different (none for any other check)."""
    if c.name != "golden":
        return set()
    return {str(g.get("target")) for g in c.evidence.get("differing", [])}


def _set_counts(suite: ET.Element, outcomes: list[Outcome]) -> None:
    counts = Counter(o for o in outcomes if o is not None)
    suite.set("tests", str(len(outcomes)))
    for key in ("failures", "errors", "skipped"):
        suite.set(key, str(counts[key]))


def _detail(report: Report, c: CheckResult, target: str, divs: list[DivergenceRecord], golden: bool,
            report_path: str) -> str:
    """What a target's case says it found: its golden differences, or its divergences and the replay command."""
    if golden:
        return "\n".join(ln for ln in golden_lines(c) if f"target {target}:" in ln or "changed since" in ln)
    detail = "\n".join(_describe(d) for d in divs[:_MAX_LISTED])
    if len(divs) > _MAX_LISTED:
        detail += f"\n... and {len(divs) - _MAX_LISTED} more in report.json"
    # The target's first divergence in a trial, the shrunk one where it has one.
    command = _first_replay(report, report_path, divs)
    return detail if command is None else f"{detail}\nreplay: {command}"


def _first_replay(report: Report, report_path: str, divs: list[DivergenceRecord]) -> str | None:
    return next((line for line in (replay_line(report, report_path, d) for d in divs) if line), None)


def _target_case(suite: ET.Element, report: Report, c: CheckResult, target: str, divs: list[DivergenceRecord],
                 golden: bool, report_path: str) -> Outcome:
    """One target of a check: a failure where a blocking check diverged for it (or its golden digest changed),
    an error where a blocking check errored, else its findings and verdict as output."""
    case = _el(suite, "testcase", classname=f"oracle.{c.name}", name=target)
    _properties(case, {"requirement": c.requirement, "verdict": shown_verdict(c), "divergences": len(divs)})
    detail = _detail(report, c, target, divs, golden, report_path)
    found = bool(divs) or golden
    if found and not c.blocks:
        # Warn- and report-level findings (or a required check that passed with them): never a failure.
        _el(case, "system-out", f"{c.requirement}-level {c.name} finding ({shown_verdict(c)}):\n{detail}")
        return None
    outcome = _blocked(case, report, c, target, len(divs), found, detail)
    _el(case, "system-out", f"{c.requirement}: {shown_verdict(c)}: {c.message}")
    return outcome


def _blocked(case: ET.Element, report: Report, c: CheckResult, target: str, divergences: int, found: bool,
             detail: str) -> Outcome:
    """A blocking check's error, or its failure for a target it found something for; None otherwise."""
    if not c.blocks:
        return None
    if c.verdict == "error":
        _el(case, "error", report.error or c.message, message=c.message or "check error")
        return "errors"
    if not found:
        return None
    what = f"{divergences} divergences" if divergences else "differs from the golden file"
    _el(case, "failure", detail, message=f"{c.name}: {target}: {what}")
    return "failures"


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
