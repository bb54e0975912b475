"""negative_control: production mode must diverge somewhere in the schedule, or the schedule cannot tell a
batch-variant engine from an invariant one (vacuous)."""

from __future__ import annotations

from oracle.checks.base import PROD, Check, Judged, Runs
from oracle.checks.drift import drift
from oracle.report import CheckResult


def negative_control(runs: Runs, requirement: str) -> Judged:
    if runs.prod is None:
        return Judged(CheckResult.vacuous("negative_control", requirement, message="production mode did not run"))
    d = drift(runs, "report").result
    if d.divergent:
        return Judged(CheckResult.passed("negative_control", requirement, trials=d.trials, divergent=d.divergent,
                                  message="production diverged, so the schedule can tell a batch-variant "
                                          "engine apart"))
    return Judged(CheckResult.vacuous("negative_control", requirement, trials=d.trials,
                              message="production never diverged: this schedule cannot tell a batch-variant "
                                      "engine from an invariant one (widen batch sizes, lengths or budgets)"))


ROW = Check("negative_control", negative_control, (), PROD, self_compared=True)
