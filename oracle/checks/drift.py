"""drift: production mode under the same trials against its own solo runs: how often, where and how far the
production path moves with the batch. A report, optionally gated by thresholds (checks.drift)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from oracle.checks.base import DRIFT_SECTION, PROD, Check, Judged, Runs
from oracle.checks.solo import against_solo
from oracle.checks.strength import strength
from oracle.report import CheckResult, DivergenceRecord, Strength


def drift(runs: Runs, requirement: str) -> Judged:
    """Production mode: every scheduled trial's target vs its production solo run, bitwise; a report, failed
    only past the config's gates (checks.drift)."""
    result, ev, recs, n = against_solo(runs, "drift", "production")
    power = strength(runs.config, [c for tid, c in result.trials.items() if runs.trials[tid].origin != "shrink"])
    return _verdict(runs, requirement, ev, recs, n, power)


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
             n: int, power: Strength) -> Judged:
    """Failed past a gate; vacuous when nothing ran or batched; else passed (with what it rules out when no
    trial drifted)."""
    msg = (f"{len(recs)} of {n} production trials diverged from production solo" if recs
           else f"no production divergence in {n} trials")
    over = _drift_over(runs, ev, recs, n)
    if over:
        return Judged(CheckResult.failed("drift", requirement, trials=n,
                                  divergent=len(recs), evidence=ev, message=msg + "; " + "; ".join(over)),
                      tuple(recs))
    if n == 0 or ev["trials_batched"] == 0:
        return Judged(CheckResult.vacuous("drift", requirement, trials=n, divergent=len(recs), evidence=ev,
                                          message=msg), tuple(recs))
    return Judged(CheckResult.passed("drift", requirement, trials=n, divergent=len(recs), evidence=ev,
                                     message=msg, strength=None if recs else power), tuple(recs))


ROW = Check("drift", drift, PROD, PROD, section=DRIFT_SECTION, self_compared=True)
