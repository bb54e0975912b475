"""repeatability: the same trial run twice gives bitwise the same outputs, in each mode that ran.

Beside the schedule's repeated trials it reads what invariance's recheck ran before blaming a failure on the
batch (`ModeResult.reruns`, `solo_again`: oracle.execute.RECHECKED): a failing trial run again as is, and its
target alone again; either giving other bits fails it as run-to-run nondeterminism."""

from __future__ import annotations

from oracle.checks.base import BOTH, INVARIANT_SECTION, Check, Judged, Runs, record
from oracle.checks.strength import strength
from oracle.compare import first_divergence
from oracle.report import CheckResult, DivergenceRecord


def repeatability(runs: Runs, requirement: str) -> Judged:
    n = rechecked = 0
    recs: list[DivergenceRecord] = []
    for result in (runs.inv, runs.prod):
        if result is None:
            continue
        for tid, again in {**result.repeats, **result.reruns}.items():
            n += 1
            rechecked += tid not in result.repeats
            d = first_divergence(result.trials[tid], again)
            if d is not None:
                t = runs.trials[tid]
                recs.append(record(runs, "repeatability", result.mode, t, t.target, again, d, "nondeterminism"))
        for target, again in result.solo_again.items():
            n += 1
            rechecked += 1
            d = first_divergence(result.solo[target], again)
            if d is not None:
                recs.append(record(runs, "repeatability", result.mode, None, target, again, d, "nondeterminism",
                                   solo_again=True))
    ev: dict[str, object] = {"modes": [r.mode for r in (runs.inv, runs.prod) if r is not None], "repeated": n}
    if rechecked:
        ev["rechecked"] = rechecked  # of them, invariance's failing trials and their solo runs run again
    if n == 0:
        return Judged(CheckResult.vacuous("repeatability", requirement, evidence=ev,
                                  message="no trial was repeated"))
    if recs:
        return Judged(CheckResult.failed("repeatability", requirement, trials=n,
                                  divergent=len(recs), evidence=ev,
                                  message=f"{len(recs)} of {n} repeated trials differed: run-to-run "
                                          "nondeterminism"), tuple(recs))
    repeated = [r.trials[tid] for r in (runs.inv, runs.prod) if r is not None for tid in r.repeats]
    return Judged(CheckResult.passed("repeatability", requirement, trials=n, evidence=ev,
                                     strength=strength(runs.config, repeated),
                                     message=f"{n} repeated trials bitwise equal"))


ROW = Check("repeatability", repeatability, (), BOTH, section=INVARIANT_SECTION)
