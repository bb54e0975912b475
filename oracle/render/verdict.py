"""The verdict rules every view reads (console, summary.md, report.html, junit.xml, the GitHub Action's
annotations, the pytest plugin), so the outputs agree with each other and with the exit code.

The exit code itself is `Report.exit_code` (a required check whose verdict is a problem blocks); this
module says what the views derive from it: which verdicts are a problem, which are warnings (a
non-blocking problem: warn-level fail, vacuous or error; a report-level gate that failed or errored),
the word shown for a check (`reported` for a report-only check that found divergences, never a green
`pass`), the run's headline (`passed with warnings` when a warning stands), how loud a row is, and
which divergence is shown first (the shrunk minimal trial, then the report's order).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from oracle.report import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    PROBLEM_VERDICTS,
    CheckResult,
    DivergenceRecord,
    Report,
)
from oracle.report_sections import ShardSlice

ShownVerdict = Literal["pass", "fail", "vacuous", "error", "skipped", "reported"]
# How loud a check's row is: `blocking` (it fails the run), `notice` (a warning, a report-only finding,
# a non-blocking vacuous), `pass`, `skipped`.
Tone = Literal["blocking", "notice", "pass", "skipped"]
# What a check means where it is one test (a pytest item, an Action annotation): fail it, warn, skip it, pass.
Gate = Literal["fail", "warn", "skip", "pass"]
RunVerdict = Literal["pass", "fail", "error"]


def is_problem(c: CheckResult) -> bool:
    """The verdict is fail, vacuous or error: it blocks at `required` (`c.blocks`), warns at `warn`."""
    return c.verdict in PROBLEM_VERDICTS


def is_warning(c: CheckResult) -> bool:
    """A non-blocking check whose verdict is a problem (warn-level fail, vacuous or error; a report gate
    that failed or errored)."""
    if c.requirement == "warn":
        return is_problem(c)
    return c.requirement == "report" and c.verdict in ("fail", "error")


def shown_verdict(c: CheckResult) -> ShownVerdict:
    """The verdict as shown: `reported` for a report-only check that found divergences."""
    if c.requirement == "report" and c.verdict == "pass" and c.divergent:
        return "reported"
    return c.verdict


def verdict_label(c: CheckResult) -> str:
    """The verdict as a table cell says it: `warning: fail` for a warning, else the shown word."""
    return f"warning: {shown_verdict(c)}" if is_warning(c) else shown_verdict(c)


def tone(c: CheckResult) -> Tone:
    """`blocking` only where the check fails the run; `notice` for the other problems and `reported`."""
    if c.blocks:
        return "blocking"
    if is_problem(c) or shown_verdict(c) == "reported":
        return "notice"
    return "pass" if c.verdict == "pass" else "skipped"


def gate(c: CheckResult) -> Gate:
    """`fail` where the check blocks, `warn` for a warning, `skip` for a skipped check, else `pass`."""
    if c.blocks:
        return "fail"
    if is_warning(c):
        return "warn"
    return "skip" if c.verdict == "skipped" else "pass"


def run_verdict(exit_code: int) -> RunVerdict:
    """The run's verdict from its exit code: pass (0), fail (1), error (anything else)."""
    if exit_code == EXIT_OK:
        return "pass"
    return "fail" if exit_code == EXIT_FAILED else "error"


# What a report's `error` is called, by the exit code it stands for; any other code is the engine's.
ERROR_LABELS = {EXIT_USAGE: "config/usage error", 130: "interrupted", 143: "terminated"}


def error_label(exit_code: int) -> str:
    """What every view calls a report's `error`: `config/usage error` (exit 2), `interrupted` (130),
    `terminated` (143), else `engine error`."""
    return ERROR_LABELS.get(exit_code, "engine error")


def headline(report: Report) -> str:
    """`passed`, `passed with warnings`, `failed` or `error`, plus `partial` when the run did not finish. A
    shard's slice that ran whole has no verdict of its own: it says which shard it is and that the merge judges."""
    code = report.exit_code()
    if isinstance(report.shard, ShardSlice) and report.complete and report.error is None:
        index, count = report.shard.index, report.shard.count
        return f"shard {index}/{count} of seed {report.seed} ran (exit {code}): merge the shards to judge"
    word = {"pass": "passed", "fail": "failed", "error": "error"}[run_verdict(code)]
    if code == EXIT_OK and any(is_warning(c) for c in report.checks):
        word = "passed with warnings"
    if not report.complete:
        word += ", partial"
    return f"{word} (exit {code})"


def minimal_first(divergences: Iterable[DivergenceRecord]) -> list[DivergenceRecord]:
    """The divergences in the order views show them: the shrunk minimal trial first (so it is never among
    the rows cut), then the report's order."""
    return sorted(divergences, key=lambda d: not d.shrunk)


def first_divergence(report: Report, checks: Iterable[str]) -> DivergenceRecord | None:
    """The divergence to show for `checks`: the shrunk (minimal) trial if there is one, else the first."""
    names = set(checks)
    return next(iter(minimal_first(d for d in report.divergences if d.check in names)), None)
