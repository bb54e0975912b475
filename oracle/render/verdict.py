"""What every format says about a run and a check, from the same rules, so the outputs agree with
the exit code: a report-only check that found divergences is `reported`, not a green `pass`, and
a run whose warn-level checks failed `passed with warnings`."""

from __future__ import annotations

from typing import Any

from oracle.report import Report

PROBLEM_VERDICTS = ("fail", "vacuous", "error")


def shown_verdict(c: Any) -> str:
    """The verdict as shown: `reported` for a report-only check that found divergences."""
    if c.requirement == "report" and c.verdict == "pass" and c.divergent:
        return "reported"
    return str(c.verdict)


def is_warning(c: Any) -> bool:
    """A non-blocking check whose verdict is a problem (warn-level fail, vacuous or error; a report gate)."""
    if c.requirement == "warn":
        return c.verdict in PROBLEM_VERDICTS
    return c.requirement == "report" and c.verdict in ("fail", "error")


def headline(report: Report) -> str:
    """`passed`, `passed with warnings`, `failed` or `error`, plus `partial` when the run did not finish."""
    code = report.exit_code()
    if code == 0:
        word = "passed with warnings" if any(is_warning(c) for c in report.checks) else "passed"
    elif code == 1:
        word = "failed"
    else:
        word = "error"
    if not getattr(report, "complete", True):
        word += ", partial"
    return f"{word} (exit {code})"


def style(c: Any) -> str | None:
    """A rich style for a check's row: red only where it blocks, yellow for warnings."""
    if c.verdict in PROBLEM_VERDICTS:
        return "red" if c.requirement == "required" else "yellow"
    if shown_verdict(c) == "reported":
        return "yellow"
    return {"pass": "green", "skipped": "dim"}.get(c.verdict)
