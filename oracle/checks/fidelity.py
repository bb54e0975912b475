"""fidelity: invariant solo against production solo. Tokens agree except at near ties, the largest |logprob|
difference and the per-step KL (from full logits rows) within the config's tolerances: invariant kernels
must not be deterministic but wrong."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from oracle.checks.base import BOTH, Check, Judged, Runs, within
from oracle.engines.contract import Completion
from oracle.report import CheckResult


def _row(c: Completion, i: int) -> Any:
    return c.logits[i] if c.logits is not None and i < len(c.logits) else None


def _kl(p_logits: Any, q_logits: Any) -> float:
    p = np.asarray(p_logits, dtype=np.float64)
    q = np.asarray(q_logits, dtype=np.float64)
    with np.errstate(invalid="ignore"):  # a NaN row gives a NaN KL, which fidelity reports as not finite
        lp = p - np.logaddexp.reduce(p)
        lq = q - np.logaddexp.reduce(q)
        return float(np.sum(np.exp(lp) * (lp - lq)))


def _fidelity_gaps(name: str, ref: Completion, ours: Completion,
                   near_tie: float) -> tuple[list[str], list[float], list[float]]:
    """One target's invariant solo run against its production solo run: (problems, the finite |logprob|
    differences, the finite per-step KLs), up to the first token flip past a near tie."""
    problems: list[str] = []
    lp_diffs: list[float] = []
    kls: list[float] = []
    if len(ref.token_ids) != len(ours.token_ids):
        problems.append(f"{name}: {len(ours.token_ids)} tokens in invariant mode, {len(ref.token_ids)} in "
                        "production")
    for i in range(min(len(ref.token_ids), len(ours.token_ids))):
        if ref.token_ids[i] != ours.token_ids[i]:
            margin = ref.top2[i][0] - ref.top2[i][1] if ref.top2 else None
            if not within(margin, near_tie, strict=True):  # a NaN margin is no near tie
                problems.append(f"{name} step {i}: token {ours.token_ids[i]} vs "
                                f"{ref.token_ids[i]} at margin {margin}")
            break  # after a token flip the continuations are different texts
        lp_diff = abs(ref.logprobs[i] - ours.logprobs[i])
        if not math.isfinite(lp_diff):  # never folded into the max: max(0.0, nan) is 0.0
            problems.append(f"{name} step {i}: logprob {ours.logprobs[i]} vs {ref.logprobs[i]} is not finite")
        else:
            lp_diffs.append(lp_diff)
        if _row(ref, i) is not None and _row(ours, i) is not None:
            kl = _kl(_row(ref, i), _row(ours, i))
            if not math.isfinite(kl):
                problems.append(f"{name} step {i}: KL {kl} is not finite")
            else:
                kls.append(kl)
    return problems, lp_diffs, kls


def _both_solo(runs: Runs) -> list[tuple[int, Completion, Completion]]:
    """(target, production solo, invariant solo) for each target that ran alone in both modes."""
    inv, prod = runs.inv, runs.prod
    if prod is None or inv is None:
        return []
    return [(t, ref, inv.solo[t]) for t, ref in prod.solo.items() if t in inv.solo]


def fidelity(runs: Runs, requirement: str) -> Judged:
    """Invariant solo vs production solo: tokens agree except at near ties; logprob diff and KL bounded."""
    cfg = runs.config.checks.fidelity
    problems: list[str] = []
    lp_diffs: list[float] = []
    kls: list[float] = []
    both = _both_solo(runs)
    n = len(both)
    for t, ref, ours in both:
        found, lps, ks = _fidelity_gaps(runs.targets[t].name, ref, ours, cfg.near_tie)
        problems += found
        lp_diffs += lps
        kls += ks
    max_lp = max([0.0, *lp_diffs])
    max_kl = max([0.0, *kls]) if kls else None
    ev = {"targets": n, "max_abs_logprob_diff": max_lp, "max_kl": max_kl,
          "tolerances": {"logprob": cfg.max_logprob_diff, "kl": cfg.max_kl, "near_tie": cfg.near_tie}}
    if not within(max_lp, cfg.max_logprob_diff):
        problems.append(f"max |dlogprob| {max_lp:.3g} > {cfg.max_logprob_diff}")
    if max_kl is not None and not within(max_kl, cfg.max_kl):
        problems.append(f"max KL {max_kl:.3g} > {cfg.max_kl}")
    if n == 0:
        return Judged(CheckResult.vacuous("fidelity", requirement, evidence=ev,
                                  message="no target ran in both modes"))
    if problems:
        return Judged(CheckResult.failed("fidelity", requirement, trials=n,
                                  divergent=len(problems), evidence=ev, message="; ".join(problems[:3])))
    return Judged(CheckResult.passed("fidelity", requirement, trials=n, evidence=ev,
                              message=f"invariant within {max_lp:.2g} logprob of production"))


ROW = Check("fidelity", fidelity, BOTH, BOTH, self_compared=True)
