"""Verdicts: each check turns the runs of both modes into a CheckResult and divergence records.

All comparisons are bitwise (see oracle.compare) except fidelity, which compares invariant
solo against production solo within the config's tolerances.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from oracle.compare import Divergence, first_divergence
from oracle.config import Config
from oracle.engines.base import Completion, Mode
from oracle.prompts import Target
from oracle.report import CheckResult, DivergenceRecord, Report
from oracle.schedule import Trial
from oracle.search import SearchResult


@dataclass
class ModeRuns:
    """Everything one mode produced (target outputs only)."""

    solo: dict[int, Completion] = field(default_factory=dict)
    trials: dict[int, Completion] = field(default_factory=dict)
    repeats: dict[int, Completion] = field(default_factory=dict)
    prefill: dict[tuple[int, int], Completion] = field(default_factory=dict)  # (target, step) -> re-prefilled
    prefix: dict[int, tuple[Completion, Completion]] = field(default_factory=dict)  # target -> (cold, warm)
    prefix_note: str = ""
    extra: dict[int, Completion] = field(default_factory=dict)  # search-only trials (e.g. the shrunk one)
    search: SearchResult | None = None
    seconds: float = 0.0
    engine: dict[str, Any] = field(default_factory=dict)


@dataclass
class Judge:
    config: Config
    targets: list[Target]
    trials: dict[int, Trial]
    report: Report

    def record(self, check: str, mode: str, trial: Trial | None, target: int, actual: Completion,
               d: Divergence, **extra: Any) -> DivergenceRecord:
        margin = d.reference_margin
        ev = next((e for e in actual.evidence if e.token_index == d.step), None)
        rec = DivergenceRecord(
            check=check, mode=mode, target=self.targets[target].name,
            trial_id=trial.trial_id if trial else None, trial=trial.to_json() if trial else None,
            request_id=actual.request_id, step=d.step, kind=d.kind,
            expected_token=d.expected_token, actual_token=d.actual_token,
            expected_logprob=d.expected_logprob, actual_logprob=d.actual_logprob, ulp=d.ulp,
            max_abs_logits_diff=d.max_abs_logits_diff, reference_margin=margin,
            near_tie=None if margin is None else margin < self.config.checks.fidelity.near_tie,
            first_token_step=d.first_token_step, evidence={**(asdict(ev) if ev else {}), **extra},
        )
        self.report.divergences.append(rec)
        return rec

    def batch_evidence(self, completions: dict[int, Completion]) -> dict[str, Any]:
        """How often targets really shared forward passes: without this a pass can be vacuous."""
        shared = {tid: c.max_batch for tid, c in completions.items()}
        return {
            "trials_batched": sum(m >= 2 for m in shared.values()),
            "max_seqs_shared": max(shared.values(), default=0),
            "seqs_shared_histogram": {str(k): v for k, v in sorted(Counter(shared.values()).items())},
            "scheduled_batch_sizes": sorted({self.trials[t].batch_size for t in completions if t in self.trials}),
            "trials_chunked_prefill": sum(any(e.chunked for e in c.evidence) for c in completions.values()),
        }

    def against_solo(self, name: str, requirement: str, mode: Mode, runs: ModeRuns) -> CheckResult:
        """Every trial's target vs that target's solo run in the same mode, bitwise."""
        ev = self.batch_evidence(runs.trials)
        recs: list[DivergenceRecord] = []
        for tid, actual in runs.trials.items():
            trial = self.trials[tid]
            if trial.target in runs.solo:
                d = first_divergence(runs.solo[trial.target], actual)
                if d is not None:
                    recs.append(self.record(name, mode, trial, trial.target, actual, d))
        n = len(runs.trials)
        if recs:
            token_steps = [r.first_token_step for r in recs if r.first_token_step is not None]
            ev.update({
                "divergent_fraction": len(recs) / n,
                "first_divergence_steps": {str(k): v for k, v in sorted(Counter(r.step for r in recs).items())},
                "first_token_divergence_steps": {str(k): v for k, v in sorted(Counter(token_steps).items())},
                "token_divergences": len(token_steps),
                "max_ulp": max((r.ulp or 0) for r in recs),
            })
        shrunk = self._search_evidence(runs, ev) if name == "invariance" and runs.search is not None else []
        if n == 0 and not shrunk:
            return CheckResult(name, requirement, "vacuous", 0, 0, ev, "no trial completed")
        if name == "drift":
            return self._drift_verdict(requirement, ev, recs, n)
        if recs or shrunk:
            minimal = shrunk[0].trial if shrunk else None
            found = f"; shrunk to a minimal trial of batch {len(minimal['fillers']) + 1}" if minimal else ""
            return CheckResult(name, requirement, "fail", n, len(recs), ev,
                               f"{len(recs)} of {n} trials diverged from the solo reference{found}")
        if ev["trials_batched"] == 0:
            return CheckResult(name, requirement, "vacuous", n, 0, ev,
                               "no trial put a target in a forward pass with another sequence")
        return CheckResult(name, requirement, "pass", n, 0, ev,
                           f"{n} trials bitwise equal to the solo reference, {ev['trials_batched']} batched")

    def _search_evidence(self, runs: ModeRuns, ev: dict[str, Any]) -> list[DivergenceRecord]:
        s = runs.search
        assert s is not None
        ev["search"] = {"runs": s.runs, "shrink_runs": s.shrink_runs, "notes": s.notes,
                        "replayed_from_database": s.replayed_from_database}
        if s.minimal is None:
            return []
        ev["search"]["minimal_trial"] = s.minimal.to_json()
        out = runs.extra.get(s.minimal.trial_id) or runs.trials.get(s.minimal.trial_id)
        if out is None or s.minimal.target not in runs.solo:
            return []
        d = first_divergence(runs.solo[s.minimal.target], out)
        if d is None:
            return []
        self.trials.setdefault(s.minimal.trial_id, s.minimal)
        return [self.record("invariance", "invariant", s.minimal, s.minimal.target, out, d, shrunk=True)]

    def _drift_verdict(self, requirement: str, ev: dict[str, Any], recs: list[DivergenceRecord],
                       n: int) -> CheckResult:
        cfg = self.config.checks.drift
        msg = (f"{len(recs)} of {n} production trials diverged from production solo" if recs
               else f"no production divergence in {n} trials")
        over = []
        if cfg.max_divergent_fraction is not None and len(recs) / n > cfg.max_divergent_fraction:
            over.append(f"divergent fraction {len(recs) / n:.3f} > {cfg.max_divergent_fraction}")
        if cfg.max_ulp is not None and recs and ev["max_ulp"] > cfg.max_ulp:
            over.append(f"max ULP {ev['max_ulp']} > {cfg.max_ulp}")
        if over:
            return CheckResult("drift", requirement, "fail", n, len(recs), ev, msg + "; " + "; ".join(over))
        verdict = "vacuous" if ev["trials_batched"] == 0 else "pass"
        return CheckResult("drift", requirement, verdict, n, len(recs), ev, msg)  # type: ignore[arg-type]

    def repeatability(self, requirement: str, all_runs: dict[Mode, ModeRuns]) -> CheckResult:
        n = divergent = 0
        for mode, runs in all_runs.items():
            for tid, again in runs.repeats.items():
                n += 1
                d = first_divergence(runs.trials[tid], again)
                if d is not None:
                    divergent += 1
                    self.record("repeatability", mode, self.trials[tid], self.trials[tid].target, again, d)
        ev = {"modes": sorted(all_runs), "repeated": n}
        if n == 0:
            return CheckResult("repeatability", requirement, "vacuous", 0, 0, ev, "no trial was repeated")
        if divergent:
            return CheckResult("repeatability", requirement, "fail", n, divergent, ev,
                               f"{divergent} of {n} repeated trials differed")
        return CheckResult("repeatability", requirement, "pass", n, 0, ev, f"{n} repeated trials bitwise equal")

    def fidelity(self, requirement: str, inv: ModeRuns, prod: ModeRuns) -> CheckResult:
        """Invariant solo vs production solo: tokens agree except at near ties; logprob diff and KL bounded."""
        cfg = self.config.checks.fidelity
        max_lp = 0.0
        max_kl: float | None = None
        problems: list[str] = []
        n = 0
        for t, ref in prod.solo.items():
            if t not in inv.solo:
                continue
            n += 1
            ours = inv.solo[t]
            steps = min(len(ref.token_ids), len(ours.token_ids))
            for i in range(steps):
                if ref.token_ids[i] != ours.token_ids[i]:
                    margin = ref.top2[i][0] - ref.top2[i][1] if ref.top2 else None
                    if margin is None or margin >= cfg.near_tie:
                        problems.append(f"{self.targets[t].name} step {i}: token {ours.token_ids[i]} vs "
                                        f"{ref.token_ids[i]} at margin {margin}")
                    break  # after a token flip the continuations are different texts
                max_lp = max(max_lp, abs(ref.logprobs[i] - ours.logprobs[i]))
                if ref.logits is not None and ours.logits is not None:
                    max_kl = max(max_kl or 0.0, _kl(ref.logits[i], ours.logits[i]))
        ev = {"targets": n, "max_abs_logprob_diff": max_lp, "max_kl": max_kl,
              "tolerances": {"logprob": cfg.max_logprob_diff, "kl": cfg.max_kl, "near_tie": cfg.near_tie}}
        if max_lp > cfg.max_logprob_diff:
            problems.append(f"max |dlogprob| {max_lp:.3g} > {cfg.max_logprob_diff}")
        if max_kl is not None and max_kl > cfg.max_kl:
            problems.append(f"max KL {max_kl:.3g} > {cfg.max_kl}")
        if n == 0:
            return CheckResult("fidelity", requirement, "vacuous", 0, 0, ev, "no target ran in both modes")
        if problems:
            return CheckResult("fidelity", requirement, "fail", n, len(problems), ev, "; ".join(problems[:3]))
        return CheckResult("fidelity", requirement, "pass", n, 0, ev,
                           f"invariant within {max_lp:.2g} logprob of production")

    def negative_control(self, requirement: str, drift: CheckResult | None) -> CheckResult:
        if drift is None:
            return CheckResult("negative_control", requirement, "vacuous", 0, 0, {}, "production mode did not run")
        if drift.divergent:
            return CheckResult("negative_control", requirement, "pass", drift.trials, drift.divergent, {},
                               "production diverged, so the schedule can tell a batch-variant engine apart")
        return CheckResult("negative_control", requirement, "vacuous", drift.trials, 0, {},
                           "production never diverged: this schedule cannot tell a batch-variant engine "
                           "from an invariant one (widen batch sizes, lengths or budgets)")

    def prefill_decode(self, requirement: str, inv: ModeRuns) -> CheckResult:
        """Step i's output in decode == the output of prefilling the prompt plus tokens[:i], bitwise."""
        n = divergent = 0
        for (t, step), again in inv.prefill.items():
            ref = inv.solo[t]
            n += 1
            one = _step_of(ref, step)
            d = first_divergence(one, again)
            if d is not None:
                divergent += 1
                d = Divergence(step, d.kind, d.expected_token, d.actual_token, d.expected_logprob,
                               d.actual_logprob, d.ulp, d.max_abs_logits_diff, d.reference_margin,
                               None if d.first_token_step is None else step)
                self.record("prefill_decode", "invariant", None, t, again, d)
        if n == 0:
            return CheckResult("prefill_decode", requirement, "vacuous", 0, 0, {}, "nothing re-prefilled")
        if divergent:
            return CheckResult("prefill_decode", requirement, "fail", n, divergent, {},
                               f"{divergent} of {n} re-prefilled steps differ from decode")
        return CheckResult("prefill_decode", requirement, "pass", n, 0, {},
                           f"{n} generated steps bitwise equal when their prefix is prefilled again")


    def prefix_cache(self, requirement: str, inv: ModeRuns) -> CheckResult:
        """A target run with its prefix cached (warm) == the same target run cold, bitwise."""
        n = divergent = hits = 0
        for t, (cold, warm) in inv.prefix.items():
            n += 1
            cached = max((e.num_cached_tokens for e in warm.evidence), default=0)
            hits += cached > 0
            d = first_divergence(cold, warm)
            if d is not None:
                divergent += 1
                self.record("prefix_cache", "invariant", None, t, warm, d, num_cached_tokens=cached)
        ev = {"targets": n, "warm_runs_with_cache_hits": hits}
        if n == 0 or hits == 0:
            return CheckResult("prefix_cache", requirement, "vacuous", n, 0, ev,
                               inv.prefix_note or "no warm run hit the prefix cache")
        if divergent:
            return CheckResult("prefix_cache", requirement, "fail", n, divergent, ev,
                               f"{divergent} of {n} warm runs differ from cold")
        return CheckResult("prefix_cache", requirement, "pass", n, 0, ev,
                           f"{n} warm runs ({hits} with cache hits) bitwise equal to cold")


def _step_of(c: Completion, i: int) -> Completion:
    """Completion holding only step i of c (to compare against a one-token run)."""
    return Completion(
        c.request_id, c.token_ids[i:i + 1], c.logprobs[i:i + 1],
        logits=c.logits[i:i + 1] if c.logits is not None else None,
        logits_digests=c.logits_digests[i:i + 1] if c.logits_digests is not None else None,
        top2=c.top2[i:i + 1] if c.top2 is not None else None,
    )


def _kl(p_logits: Any, q_logits: Any) -> float:
    p = np.asarray(p_logits, dtype=np.float64)
    q = np.asarray(q_logits, dtype=np.float64)
    lp = p - np.logaddexp.reduce(p)
    lq = q - np.logaddexp.reduce(q)
    return float(np.sum(np.exp(lp) * (lp - lq)))


def golden_path(config: Config) -> Path | None:
    f = config.checks.golden.file
    return config.resolve_path(f) if f else None
