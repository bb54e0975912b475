"""JUnit XML: one testcase per check and target, so CI systems list them as tests."""

from __future__ import annotations

from collections import defaultdict
from xml.etree import ElementTree as ET

from oracle.report import DivergenceRecord, Report


def _describe(d: DivergenceRecord) -> str:
    return (f"trial {d.trial_id} step {d.step} {d.kind}: token {d.expected_token} -> {d.actual_token}, "
            f"logprob {d.expected_logprob!r} -> {d.actual_logprob!r}, ulp {d.ulp}, margin {d.reference_margin}")


def render_junit(report: Report) -> str:
    by_check: dict[str, dict[str, list[DivergenceRecord]]] = defaultdict(lambda: defaultdict(list))
    for d in report.divergences:
        by_check[d.check][d.target].append(d)
    targets = sorted({str(t) for t in report.environment.get("target_names", [])})
    suites = ET.Element("testsuites", name="oracle")
    for c in report.checks:
        suite = ET.SubElement(suites, "testsuite", name=f"oracle.{c.name}")
        names = targets or sorted(by_check[c.name]) or ["all"]
        failures = errors = skipped = 0
        for target in names:
            case = ET.SubElement(suite, "testcase", classname=f"oracle.{c.name}", name=target)
            divs = by_check[c.name].get(target, [])
            if c.verdict == "error":
                errors += 1
                ET.SubElement(case, "error", message=c.message).text = report.error or c.message
            elif divs and c.requirement not in ("report",):
                failures += 1
                ET.SubElement(case, "failure", message=f"{len(divs)} divergences").text = "\n".join(
                    _describe(d) for d in divs[:20])
            elif c.verdict == "vacuous":
                skipped += 1
                ET.SubElement(case, "skipped", message=f"vacuous: {c.message}")
            elif c.verdict == "fail" and not divs:
                failures += 1
                ET.SubElement(case, "failure", message=c.message).text = c.message
            ET.SubElement(case, "system-out").text = f"{c.requirement}: {c.verdict}: {c.message}"
        suite.set("tests", str(len(names)))
        suite.set("failures", str(failures))
        suite.set("errors", str(errors))
        suite.set("skipped", str(skipped))
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
