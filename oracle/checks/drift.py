"""drift: production mode under the same trials against its own solo runs: how often, where and how far the
production path moves with the batch. A report, optionally gated by thresholds (checks.drift)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from oracle.checks.base import DRIFT_SECTION, PROD, Check, Judged, Runs
from oracle.checks.solo import against_solo
from oracle.report import CheckResult, DivergenceRecord


def drift(runs: Runs, requirement: str) -> Judged:
    """Production mode: every scheduled trial's target vs its production solo run, bitwise; a report, failed
    only past the config's gates (checks.drift)."""
    _, ev, recs, n = against_solo(runs, "drift", "production")
    return _verdict(runs, requirement, ev, recs, n)


def _drift_over(runs: Runs, ev: Mapping[str, Any], recs: Sequence[DivergenceRecord], n: int) -> list[str]:
    """The drift gates (checks.drift) the production trials went past."""
    cfg = runs.config.checks.drift
    over = []
    if n and cfg.max_divergent_fraction is not None and len(recs) / n > cfg.max_divergent_fraction:
        over.append(f"divergent fraction {len(recs) / n:.3f} > {cfg.max_divergent_fraction}")
    if cfg.max_ulp is None:
        return over
    if recs and ev["max_ulp"] > cfg.max_ulp:
        over.append(f"max ULP {ev['max_ulp']} > {cfg.max_ulp}")
    # A different token or length has no ULP distance (`max_ulp` counts it as 0): it is past any ULP gate.
    unmeasured = sum(r.ulp is None for r in recs)
    if unmeasured:
        over.append(f"{unmeasured} past any max ULP (a different token or length)")
    return over


def _verdict(runs: Runs, requirement: str, ev: dict[str, Any], recs: list[DivergenceRecord],
                   n: int) -> Judged:
    msg = (f"{len(recs)} of {n} production trials diverged from production solo" if recs
           else f"no production divergence in {n} trials")
    over = _drift_over(runs, ev, recs, n)
    if over:
        return Judged(CheckResult.failed("drift", requirement, trials=n,
                                  divergent=len(recs), evidence=ev, message=msg + "; " + "; ".join(over)),
                      tuple(recs))
    made = CheckResult.vacuous if n == 0 or ev["trials_batched"] == 0 else CheckResult.passed
    return Judged(made("drift", requirement, trials=n,
                              divergent=len(recs), evidence=ev, message=msg), tuple(recs))


ROW = Check("drift", drift, PROD, PROD, section=DRIFT_SECTION, self_compared=True)
