"""repeatability: the same trial run twice gives bitwise the same outputs, in each mode that ran."""

from __future__ import annotations

from oracle.checks.base import BOTH, INVARIANT_SECTION, Check, Judged, Runs, record
from oracle.checks.strength import strength
from oracle.compare import first_divergence
from oracle.report import CheckResult, DivergenceRecord


def repeatability(runs: Runs, requirement: str) -> Judged:
    n = 0
    recs: list[DivergenceRecord] = []
    for result in (runs.inv, runs.prod):
        if result is None:
            continue
        for tid, again in result.repeats.items():
            n += 1
            d = first_divergence(result.trials[tid], again)
            if d is not None:
                t = runs.trials[tid]
                recs.append(record(runs, "repeatability", result.mode, t, t.target, again, d, "nondeterminism"))
    ev = {"modes": [r.mode for r in (runs.inv, runs.prod) if r is not None], "repeated": n}
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
