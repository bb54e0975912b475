"""judge: a table of pure check functions over the frozen results of both modes.

Each check takes a `Runs` (plan, environment and the per-mode results) and returns a `Judged`:
its CheckResult and the divergence records it found. Nothing here runs an engine or writes a
report; `judge()` calls every enabled check in order and `coverage()` counts what the schedule
exercised. All comparisons are bitwise (oracle.compare) except fidelity, which compares
invariant solo against production solo within the config's tolerances.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from oracle import op_coverage
from oracle.check_runs import (
    CROSS_INSTANCE,
    PREFILL_DECODE,
    PREFIX_CACHE,
    SEEDED_SAMPLING,
    PrefixRuns,
    SampledRuns,
)
from oracle.compare import Divergence, first_divergence, step_of
from oracle.config import Config
from oracle.engines.contract import Completion, LocalizedOp, Mode, StepEvidence
from oracle.engines.kinds import known_row
from oracle.execute import CheckRun, InstanceRun, ModeResult
from oracle.posture.probes import probe_hits
from oracle.prompts import Target
from oracle.report import (
    Cause,
    CheckResult,
    DivergenceRecord,
    HazardProbesRecord,
    ProbeNotFormed,
    TrialRecord,
)
from oracle.report_sections import HazardRecord, PostureRecord, environment_json
from oracle.schedule import Trial
from oracle.tp_parity import TP_PARITY, judge_parity, run_size

KV_BOUNDARIES = (64, 128, 256, 512)


@dataclass(frozen=True)
class Runs:
    """What the checks read: the plan's data and both modes' frozen results (either may be missing)."""

    config: Config
    targets: tuple[Target, ...]
    trials: Mapping[int, Trial]  # every trial run: the schedule's and the shrinker's
    inv: ModeResult | None
    prod: ModeResult | None
    environment: Mapping[str, Any]
    golden: Mapping[str, Any] | None = None
    unformed_probes: tuple[tuple[str, str], ...] = ()  # (`probe:side`, the limit that ruled it out)

    def mode(self, name: str) -> ModeResult | None:
        return self.inv if name == "invariant" else self.prod

    @property
    def schedule_ids(self) -> list[int]:
        return [i for i, t in self.trials.items() if t.origin == "schedule"]

    @property
    def judged_ids(self) -> list[int]:
        """Trials judged against the solo run: the schedule's, the replayed ones and the search's (not the
        shrinker's candidates, which its own evidence reports)."""
        return [i for i, t in self.trials.items() if t.origin != "shrink"]


@dataclass(frozen=True)
class Judged:
    result: CheckResult
    divergences: tuple[DivergenceRecord, ...] = ()


def record(runs: Runs, check: str, mode: str, trial: Trial | None, target: int, actual: Completion,
           d: Divergence, cause: Cause = "batch", localized: LocalizedOp | None = None,
           **extra: Any) -> DivergenceRecord:
    margin = d.reference_margin
    ev = next((e for e in actual.evidence if e.token_index == d.step), None)
    return DivergenceRecord(
        check=check, mode=mode, target=runs.targets[target].name,  # type: ignore[arg-type]
        trial_id=trial.trial_id if trial else None,
        trial=TrialRecord.model_validate(trial.to_json()) if trial else None,
        request_id=actual.request_id, step=d.step, kind=d.kind,  # type: ignore[arg-type]
        expected_token=d.expected_token, actual_token=d.actual_token,
        expected_logprob=d.expected_logprob, actual_logprob=d.actual_logprob, ulp=d.ulp,
        max_abs_logits_diff=d.max_abs_logits_diff, reference_margin=margin,
        near_tie=None if margin is None else margin < runs.config.checks.fidelity.near_tie,
        first_token_step=d.first_token_step, cause=cause,
        evidence={**(asdict(ev) if ev else {}), **extra}, localized_op=localized,
    )


def batch_evidence(runs: Runs, completions: Mapping[int, Completion]) -> dict[str, Any]:
    """How often targets really shared forward passes: without this a pass can be vacuous."""
    shared = {tid: c.max_batch for tid, c in completions.items()}
    return {
        "trials_batched": sum(m >= 2 for m in shared.values()),
        "max_seqs_shared": max(shared.values(), default=0),
        "seqs_shared_histogram": {str(k): v for k, v in sorted(Counter(shared.values()).items())},
        "scheduled_batch_sizes": sorted({runs.trials[t].batch_size for t in completions if t in runs.trials}),
        "trials_chunked_prefill": sum(any(e.chunked for e in c.evidence) for c in completions.values()),
        "trials_with_cache_hits": sum(any(e.num_cached_tokens > 0 for e in c.evidence) for c in completions.values()),
    }


def _cause(result: ModeResult, trial_id: int, actual: Completion) -> Cause:
    """What made the target differ from its solo run.

    Nondeterminism when the same trial disagreed with itself, or when the other requests could
    not have touched the target (it never shared a pass and started from no cached blocks); the
    prefix cache when it only met them through cached blocks; else the batch.
    """
    again = result.repeats.get(trial_id)
    if again is not None and first_divergence(actual, again) is not None:
        return "nondeterminism"
    if actual.max_batch <= 1:
        hit = any(e.num_cached_tokens > 0 for e in actual.evidence)
        return "prefix_cache" if hit else "nondeterminism"
    return "batch"


def _solo_divergences(runs: Runs, name: str, mode: str, result: ModeResult,
                      scheduled: Mapping[int, Completion]) -> list[DivergenceRecord]:
    """A record for each scheduled trial whose target differs from its solo run (bitwise)."""
    recs: list[DivergenceRecord] = []
    for tid, actual in scheduled.items():
        trial = runs.trials[tid]
        if trial.target not in result.solo:
            continue
        d = first_divergence(result.solo[trial.target], actual)
        if d is not None:
            recs.append(record(runs, name, mode, trial, trial.target, actual, d, _cause(result, tid, actual),
                               result.localized.get(tid)))
    return recs


def _divergence_evidence(recs: Sequence[DivergenceRecord], n: int) -> dict[str, Any]:
    """Where and how far the divergent trials of n left their solo runs."""
    token_steps = [r.first_token_step for r in recs if r.first_token_step is not None]
    return {
        "divergent_fraction": len(recs) / n,
        "first_divergence_steps": {str(k): v for k, v in sorted(Counter(r.step for r in recs).items())},
        "first_token_divergence_steps": {str(k): v for k, v in sorted(Counter(token_steps).items())},
        "token_divergences": len(token_steps),
        "max_ulp": max((r.ulp or 0) for r in recs),
        "nondeterministic": sum(r.cause == "nondeterminism" for r in recs),
    }


def against_solo(runs: Runs, name: str, requirement: str, mode: str) -> Judged:
    """Every scheduled trial's target vs that target's solo run in the same mode, bitwise."""
    result = runs.mode(mode)
    assert result is not None
    scheduled = {tid: c for tid, c in result.trials.items() if runs.trials[tid].origin != "shrink"}
    ev = batch_evidence(runs, scheduled)
    recs = _solo_divergences(runs, name, mode, result, scheduled)
    n = len(scheduled)
    if recs:
        ev.update(_divergence_evidence(recs, n))
    if name == "drift":
        return _drift_verdict(runs, requirement, ev, recs, n)
    shrunk: list[DivergenceRecord] = []
    if name == "invariance":
        shrunk = _shrink_evidence(runs, result, ev)
        if result.localize_notes:
            ev["localize_notes"] = list(result.localize_notes)
    return _solo_verdict(runs, name, requirement, ev, recs + shrunk, shrunk, n)


def _solo_verdict(runs: Runs, name: str, requirement: str, ev: dict[str, Any], recs: list[DivergenceRecord],
                  shrunk: list[DivergenceRecord], n: int) -> Judged:
    """Failed on any divergence (or a shrunk one); vacuous when nothing ran, nothing batched, or a matched
    hazard went untested (invariance); else passed."""
    if n == 0:
        return Judged(CheckResult.vacuous(name, requirement, evidence=ev,
                                  message="no trial completed"), tuple(recs))
    failing = [r for r in recs if not r.shrunk]
    gaps = op_coverage.uncovered(runs.environment.get("posture")) if name == "invariance" else {}
    if gaps:  # a kernel known to follow the batch runs unpinned: no pass, and no divergence blamed on the engine
        ev["uncovered_ops"] = {op: c.model_dump() for op, c in gaps.items()}
        return Judged(CheckResult.vacuous(name, requirement, trials=n, divergent=len(failing), evidence=ev,
                                          message=op_coverage.verdict_line(gaps, n, len(failing))),
                      tuple(r.model_copy(update={"cause": "kernels"}) for r in recs))
    if failing or shrunk:
        return Judged(CheckResult.failed(name, requirement, trials=n,
                                  divergent=len(failing), evidence=ev,
                                  message=_failure_message(failing, shrunk, n, ev)), tuple(recs))
    if ev["trials_batched"] == 0:
        return Judged(CheckResult.vacuous(name, requirement, trials=n, evidence=ev,
                                  message="no trial put a target in a forward pass with another sequence"))
    untested = untested_hazards(runs) if name == "invariance" else {}
    if untested:
        ev["untested_hazards"] = untested
        why = "; ".join(f"{h}: {w}" for h, w in untested.items())
        return Judged(CheckResult.vacuous(name, requirement, trials=n, evidence=ev,
                                  message=f"{n} trials bitwise equal to the solo reference, but a known hazard of "
                                          f"this posture went untested (no trial crossed its threshold): {why}"))
    return Judged(CheckResult.passed(name, requirement, trials=n, evidence=ev,
                              message=f"{n} trials bitwise equal to the solo reference, "
                                      f"{ev['trials_batched']} batched"))


def _hazard_crossings(runs: Runs, hazard: HazardRecord) -> list[int]:
    """The invariant trials (judged ones) that crossed the threshold of one matched hazard (`environment.hazards`)."""
    from oracle.posture.probes import crossed

    inv = runs.inv
    specs = [spec_of(label) for label in hazard.probes]
    if inv is None or not specs:
        return []
    return [tid for tid in runs.judged_ids if tid in inv.trials
            and any(crossed(spec, runs.trials[tid], inv.trials[tid].evidence) for spec in specs)]


def spec_of(label: str) -> Any:
    """`pass_tokens=48` -> ProbeSpec("pass_tokens", 48); `fa3_kv_256` -> ProbeSpec("fa3_kv_256")."""
    from oracle.posture.hazards import ProbeSpec

    name, eq, at = label.partition("=")
    return ProbeSpec(name, int(at)) if eq and at.isdigit() else ProbeSpec(name)


def _untested_why(runs: Runs, hazard: HazardRecord) -> str:
    labels = hazard.probes
    if not labels:
        return "the hazard names no probe that crosses its threshold"
    if runs.config.schedule.probes == "none":
        return f"schedule.probes is none, and no drawn trial crossed it ({hazard.threshold})"
    limits = [f"{side}: {limit}" for side, limit in runs.unformed_probes
              if side.partition(":")[0] in labels] + [f"{side}: {why}" for side, why in _evidence_unformed(runs, labels)]
    if limits:
        return "its probes could not be formed: " + "; ".join(limits)
    return f"no trial of its probes ({', '.join(labels)}) ran over the threshold ({hazard.threshold})"


def _evidence_unformed(runs: Runs, labels: Sequence[str]) -> list[tuple[str, str]]:
    """Probe sides that ran but did not form, as their pass evidence shows (oracle.posture.probes)."""
    from oracle.posture.probes import unformed_by_evidence

    return unformed_by_evidence(runs.trials, runs.inv.trials, labels, runs.judged_ids) if runs.inv else []


def untested_hazards(runs: Runs) -> dict[str, str]:
    """hazard id -> why no trial crossed its threshold, for each hazard the invariant posture matches (not merely
    possible): while one is untested, invariance cannot pass."""
    return {h.id: _untested_why(runs, h) for h in _hazards(runs)
            if h.match == "matches" and not _hazard_crossings(runs, h)}


def _hazards(runs: Runs) -> list[HazardRecord]:
    """The known hazards the invariant posture matched (`environment.hazards`)."""
    return [HazardRecord.model_validate(h) for h in runs.environment.get("hazards") or ()]


def _hazard_record(runs: Runs, h: HazardRecord) -> HazardProbesRecord:
    labels = h.probes
    crossed_by = _hazard_crossings(runs, h)
    planned = sorted({t.probe for t in runs.trials.values() if t.probe.partition(":")[0] in labels})
    return HazardProbesRecord(
        id=h.id, match=h.match, threshold=h.threshold,
        probes=labels, sides=planned, crossed_by=crossed_by,
        not_formed=[ProbeNotFormed(probe=side, limit=limit) for side, limit in runs.unformed_probes
                    if side.partition(":")[0] in labels]
        + [ProbeNotFormed(probe=side, limit=why) for side, why in _evidence_unformed(runs, labels)],
        untested="" if crossed_by or runs.inv is None else _untested_why(runs, h))


def hazard_probes(runs: Runs, unformed: Sequence[tuple[str, str]] = ()) -> list[HazardProbesRecord]:
    """Per known hazard the run matched: its probes, the trials that crossed its threshold, the probe sides the
    engine's limits ruled out, and why it went untested (the report's `hazard_probes`)."""
    runs = replace(runs, unformed_probes=tuple(unformed))
    return [_hazard_record(runs, h) for h in _hazards(runs)]


def _failure_message(failing: list[DivergenceRecord], shrunk: list[DivergenceRecord], n: int,
                     ev: dict[str, Any]) -> str:
    nondet = sum(r.cause == "nondeterminism" for r in failing)
    parts = [f"{len(failing)} of {n} trials diverged from the solo reference"]
    if nondet:
        parts.append(f"{nondet} of them run-to-run nondeterminism (the target ran alone, or the trial "
                     "disagreed with itself), not the batch")
    s = ev.get("shrink")
    if s is not None:
        size = "minimal" if s["minimal"] else f"smallest found in {s['runs']} shrink runs"
        if shrunk:
            parts.append(f"shrunk to trial {shrunk[0].trial_id} of batch {len(shrunk[0].trial.fillers) + 1} "  # type: ignore[union-attr]
                         f"({size})")
        else:
            parts.append(f"trial {s['start_trial']} did not shrink ({size})")
    op = next((r.localized_op for r in [*shrunk, *failing] if r.localized_op is not None), None)
    if op is not None:
        parts.append(f"first diverging op: {op.summary()}")
    return "; ".join(parts)


def _shrink_evidence(runs: Runs, result: ModeResult, ev: dict[str, Any]) -> list[DivergenceRecord]:
    s = result.shrink
    if s is None:
        return []
    ev["shrink"] = {"start_trial": s.start.trial_id, "smallest_trial": s.smallest.trial_id, "minimal": s.minimal,
                    "runs": s.runs, "tried": s.tried}
    if s.smallest is s.start:
        return []
    t = s.smallest
    out = result.trials.get(t.trial_id)
    if out is None or t.target not in result.solo:
        return []
    d = first_divergence(result.solo[t.target], out)
    if d is None:
        return []
    return [record(runs, "invariance", "invariant", t, t.target, out, d, _cause(result, t.trial_id, out),
                   result.localized.get(t.trial_id), shrunk=True, minimal=s.minimal)]


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


def _drift_verdict(runs: Runs, requirement: str, ev: dict[str, Any], recs: list[DivergenceRecord],
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


def invariance(runs: Runs, requirement: str) -> Judged:
    return against_solo(runs, "invariance", requirement, "invariant")


def drift(runs: Runs, requirement: str) -> Judged:
    return against_solo(runs, "drift", requirement, "production")


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
    return Judged(CheckResult.passed("repeatability", requirement, trials=n, evidence=ev,
                              message=f"{n} repeated trials bitwise equal"))


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


def prefill_decode(runs: Runs, requirement: str) -> Judged:
    """Step i's output in decode == the output of prefilling the prompt plus tokens[:i], bitwise."""
    inv = runs.inv
    assert inv is not None
    if why := runs.environment.get("prefill_decode_not_applicable"):
        return Judged(CheckResult.skipped("prefill_decode", requirement, message=f"not applicable: {why}"))
    prefill: Mapping[tuple[int, int], Completion] = inv.checks.get("prefill_decode", {})
    recs: list[DivergenceRecord] = []
    for (t, step), again in prefill.items():
        d = first_divergence(step_of(inv.solo[t], step), again)
        if d is not None:
            d = Divergence(step, d.kind, d.expected_token, d.actual_token, d.expected_logprob,
                           d.actual_logprob, d.ulp, d.max_abs_logits_diff, d.reference_margin,
                           None if d.first_token_step is None else step)
            recs.append(record(runs, "prefill_decode", "invariant", None, t, again, d, "prefill",
                               inv.localized.get(("prefill", t, step))))
    n = len(prefill)
    if n == 0:
        return Judged(CheckResult.vacuous("prefill_decode", requirement, message="nothing re-prefilled"))
    if recs:
        return Judged(CheckResult.failed("prefill_decode", requirement, trials=n,
                                  divergent=len(recs), message=f"{len(recs)} of {n} re-prefilled steps differ "
                                                               "from decode"), tuple(recs))
    return Judged(CheckResult.passed("prefill_decode", requirement, trials=n,
                              message=f"{n} generated steps bitwise equal when their prefix is prefilled again"))


def _max_cached(c: Completion) -> int:
    """The most prompt tokens any of the completion's passes read from the prefix cache."""
    return max((e.num_cached_tokens for e in c.evidence), default=0)


def _prefix_divergences(runs: Runs, inv: ModeResult, ran: PrefixRuns) -> list[DivergenceRecord]:
    """A record for each target whose warm run differs from its cold run (bitwise)."""
    return [record(runs, "prefix_cache", "invariant", None, t, warm, d, "prefix_cache",
                   inv.localized.get(("prefix", t)), num_cached_tokens=_max_cached(warm))
            for t, (cold, warm) in ran.pairs.items() if (d := first_divergence(cold, warm)) is not None]


def _no_hit_message(runs: Runs, ran: PrefixRuns) -> str:
    """Why no warm run hit the prefix cache: the engine's note, else a hint from its row."""
    if ran.note:
        return ran.note
    row = known_row(runs.config.engine.kind)
    return "no warm run hit the prefix cache" + (row.prefix_cache_hint if row is not None else "")


def prefix_cache(runs: Runs, requirement: str) -> Judged:
    """A target run with its prefix cached (warm) == the same target run cold, bitwise."""
    inv = runs.inv
    assert inv is not None
    ran: PrefixRuns = inv.checks.get("prefix_cache", PrefixRuns())
    recs = _prefix_divergences(runs, inv, ran)
    n = len(ran.pairs)
    hits = sum(_max_cached(warm) > 0 for _, warm in ran.pairs.values())
    cold_hits = sum(_max_cached(cold) > 0 for cold, _ in ran.pairs.values())
    ev = {"targets": n, "warm_runs_with_cache_hits": hits, "cold_runs_with_cache_hits": cold_hits}
    if cold_hits:  # the reset did not empty the cache: no run here was cold, so warm vs cold says nothing
        return Judged(CheckResult.vacuous("prefix_cache", requirement, trials=n,
                                  evidence=ev, message=f"{cold_hits} of {n} cold runs hit the prefix cache: the "
                                  "engine's reset did not empty it, so no run was cold"))
    if ran.note and requirement != "required":
        # Not applicable: the engine was configured without a prefix cache. Required, it stays vacuous (blocks).
        return Judged(CheckResult.skipped("prefix_cache", requirement, trials=0,
                                  evidence=ev, message=ran.note))
    if n == 0 or hits == 0:
        return Judged(CheckResult.vacuous("prefix_cache", requirement, trials=n,
                                  evidence=ev, message=_no_hit_message(runs, ran)))
    if recs:
        return Judged(CheckResult.failed("prefix_cache", requirement, trials=n,
                                  divergent=len(recs), evidence=ev,
                                  message=f"{len(recs)} of {n} warm runs differ from cold"), tuple(recs))
    return Judged(CheckResult.passed("prefix_cache", requirement, trials=n, evidence=ev,
                              message=f"{n} warm runs ({hits} with cache hits) bitwise equal to cold"))


# Environment fields a golden file does not pin: where the model sits, the schedule's size, production's side.
_GOLDEN_UNPINNED = ("model_dir", "trials", "targets", "target_names", "engines.production",
                    "posture.modes.production", "posture.digests.production", "posture.digest")


def _golden_environment_changes(runs: Runs, pinned: Mapping[str, Any]) -> dict[str, Any]:
    """What changed in the environment since the golden file was written, in the fields it pins."""
    from oracle.golden import environment_changes

    changed = environment_changes(pinned.get("environment", {}), environment_json(runs.environment))
    return {k: v for k, v in changed.items() if not k.startswith(_GOLDEN_UNPINNED)}


def _golden_diff_message(differing: int, n: int, changed: Mapping[str, Any], map_note: str) -> str:
    """How many targets left the golden file, and the first environment changes that might say why."""
    what = ", ".join(f"{k}: {v[0]} -> {v[1]}" for k, v in list(changed.items())[:4]) or "nothing recorded"
    return (f"{differing} of {n} targets differ from the golden file; "
            f"changed: {what}" + (f"; variance map: {map_note}" if map_note else ""))


def golden(runs: Runs, requirement: str) -> Judged:
    from oracle.golden import compare_golden

    assert runs.inv is not None and runs.golden is not None
    refs = {runs.targets[i].name: c for i, c in runs.inv.solo.items()}
    prompts = {t.name: t.token_ids for t in runs.targets}
    diffs = compare_golden(dict(runs.golden), refs, prompts)
    changed = _golden_environment_changes(runs, runs.golden)
    posture = runs.environment.get("posture")
    ev = {"targets": len(refs), "differing": diffs, "environment_changes": changed,
          "config_digest": {"golden": runs.golden.get("config_digest"), "now": runs.config.digest()},
          "posture_digest": {"golden": runs.golden.get("posture_digest"),
                             "now": None if posture is None else
                             PostureRecord.model_validate(posture).digests.get("invariant")}}
    if not refs:
        return Judged(CheckResult.vacuous("golden", requirement, evidence=ev,
                                  message="no reference completed"))
    map_note = _golden_map(runs, ev)
    if map_note and not diffs:
        return Judged(CheckResult.failed("golden", requirement, trials=len(refs),
                                  evidence=ev, message=f"{len(refs)} targets bitwise equal to the golden file, but "
                                                       f"production's variance map changed: {map_note}"))
    if diffs:
        return Judged(CheckResult.failed("golden", requirement, trials=len(refs),
                                  divergent=len(diffs), evidence=ev,
                                  message=_golden_diff_message(len(diffs), len(refs), changed, map_note)))
    return Judged(CheckResult.passed("golden", requirement, trials=len(refs), evidence=ev,
                              message=f"{len(refs)} targets bitwise equal to the golden file"))


def _golden_map(runs: Runs, ev: dict[str, Any]) -> str:
    """The golden file's pinned variance map (`oracle pin-map`) against this run's: the named changes, "" for
    none; evidence says when a pinned map could not be compared (drift not localized here)."""
    from oracle.variance_map import map_changes, variance_map

    pinned = runs.golden.get("variance_map") if runs.golden is not None else None
    if not isinstance(pinned, dict):
        return ""
    now = variance_map(runs)
    if now is None:
        ev["variance_map"] = "pinned in the golden file, not compared: this run did not localize drift " \
                             "(checks.drift.localize)"
        return ""
    added, unseen = map_changes(pinned.get("ops") or {}, now)
    ev["variance_map_changes"] = added
    if unseen:
        ev["variance_map_unseen"] = unseen
    return "; ".join(added)


def _round_divergences(runs: Runs, rnd: Any, sampling: dict[str, Any]) -> list[DivergenceRecord]:
    """A record for each request of one sampled round that differs between alone and a batch layout."""
    recs: list[DivergenceRecord] = []
    for j, t in enumerate(rnd.targets):
        for b, batch in enumerate(rnd.batches):
            d = first_divergence(rnd.solo[j], batch[j])
            if d is not None:
                recs.append(record(runs, "seeded_sampling", "invariant", None, t, batch[j], d, "sampling",
                                   seed=rnd.seeds[j], sampling=sampling, layout=_LAYOUTS[b],
                                   batch=len(rnd.targets)))
    return recs


def _shared_noise(rnd: Any) -> tuple[int, int]:
    """(pairs of one prompt whose seeds gave different tokens alone, those of them identical in some batch)."""
    n = len(rnd.targets)
    sensitive = [(j, k) for j in range(n) for k in range(j + 1, n)
                 if rnd.targets[j] == rnd.targets[k] and rnd.solo[j].token_ids != rnd.solo[k].token_ids]
    shared = sum(any(batch[j].token_ids == batch[k].token_ids for batch in rnd.batches) for j, k in sensitive)
    return len(sensitive), shared


def _sampling_evidence(runs: Runs, sampled: SampledRuns) -> tuple[list[DivergenceRecord], dict[str, Any]]:
    """Every sampled round's divergences, and the counts seeded_sampling judges by."""
    variants = runs.config.checks.seeded_sampling.variants
    recs: list[DivergenceRecord] = []
    compared = sensitive = shared = 0
    for rnd in sampled.rounds:
        var = variants[rnd.variant].model_dump() if rnd.variant < len(variants) else {}
        recs += _round_divergences(runs, rnd, var)
        compared += len(rnd.targets) * len(rnd.batches)
        pairs, same = _shared_noise(rnd)
        sensitive += pairs
        shared += same
    batched = sum(c.max_batch >= 2 for rnd in sampled.rounds for b in rnd.batches for c in b)
    return recs, {"variants": [v.model_dump() for v in variants], "requests_compared": compared,
                  "requests_batched": batched,
                  "seed_pairs_that_differ_alone": sensitive, "seed_pairs_identical_in_a_batch": shared,
                  "seeds": [list(r.seeds) for r in sampled.rounds]}


def seeded_sampling(runs: Runs, requirement: str) -> Judged:
    """Seeded sampling (temperature > 0, top-p / top-k): each request under its own seed, in every batch
    layout, == the same request alone, bitwise (tokens, logprob bits, logits rows or digests). Two requests
    of one prompt whose seeds gave different tokens alone must not come out identical together: that is a
    seed shared by the batch (vLLM #50440), reported as `shared noise`."""
    inv = runs.inv
    assert inv is not None
    sampled: SampledRuns = inv.checks.get("seeded_sampling", SampledRuns())
    recs, ev = _sampling_evidence(runs, sampled)
    compared, sensitive, shared = (ev["requests_compared"], ev["seed_pairs_that_differ_alone"],
                                   ev["seed_pairs_identical_in_a_batch"])
    if not sampled.rounds:
        return Judged(CheckResult.vacuous("seeded_sampling", requirement, evidence=ev,
                                  message=sampled.note or "nothing was sampled"))
    if recs or shared:
        return _sampling_failure(requirement, ev, recs, compared, shared)
    if ev["requests_batched"] == 0:  # the "batched" requests never shared a pass: nothing was tested
        return Judged(CheckResult.vacuous("seeded_sampling", requirement, trials=compared, evidence=ev,
                                  message="no sampled request shared a forward pass with another"))
    if sensitive == 0:
        return Judged(CheckResult.vacuous("seeded_sampling", requirement, trials=compared, evidence=ev,
                                  message="every seed gave the same tokens, so shared noise cannot be told apart "
                                          "(raise the variants' temperature or sampling.max_tokens)"))
    return Judged(CheckResult.passed("seeded_sampling", requirement, trials=compared,
                              evidence=ev, message=f"{compared} sampled requests bitwise equal alone and in a "
                                                   f"batch; {sensitive} seed pairs kept their own noise"))


def _sampling_failure(requirement: str, ev: dict[str, Any], recs: list[DivergenceRecord], compared: int,
                      shared: int) -> Judged:
    parts = [f"{len(recs)} of {compared} sampled requests differ between alone and in a batch"]
    if shared:
        parts.append(f"{shared} pairs of requests with different seeds got the same tokens in one batch: "
                     "the batch shares one seed's noise")
    return Judged(CheckResult.failed("seeded_sampling", requirement, trials=compared,
                              divergent=len(recs) or shared, evidence=ev, message="; ".join(parts)),
                  tuple(recs))


_LAYOUTS = ("in order", "reversed")


def _instance_pairs(runs: Runs, first: ModeResult,
                    second: InstanceRun) -> list[tuple[Trial | None, int, Completion, Completion]]:
    """(trial or None for a reference, target, the first instance's completion, the second's) for every run
    both instances completed: the references first, then the trials."""
    pairs: list[tuple[Trial | None, int, Completion, Completion]] = [
        (None, t, first.solo[t], c) for t, c in second.solo.items() if t in first.solo]
    pairs += [(runs.trials[i], runs.trials[i].target, first.trials[i], c) for i, c in second.trials.items()
              if i in first.trials and i in runs.trials]
    return pairs


def cross_instance(runs: Runs, requirement: str) -> Judged:
    """A second, separately started engine of the mode: every reference and the trials it ran == the first
    instance's, bitwise."""
    mode = runs.config.checks.cross_instance.mode
    first = runs.mode(mode)
    name = "cross_instance"
    second: InstanceRun | None = first.checks.get(name) if first is not None else None
    if first is None or second is None:
        return Judged(CheckResult.vacuous(name, requirement, message=f"no second {mode} instance ran"))
    ev: dict[str, Any] = {"mode": mode, "references": len(second.solo), "trials": len(second.trials)}
    if "base_url" in first.engine and first.engine.get("base_url") == second.engine.get("base_url"):
        ev["same_server"] = first.engine["base_url"]
        return Judged(CheckResult.vacuous(name, requirement, evidence=ev,
                                  message=f"both instances are the server at {first.engine['base_url']}; give the "
                                          f"mode a list of URLs (engine.options.base_url.{mode}: [URL, URL]) or "
                                          "a command that starts one"))
    pairs = _instance_pairs(runs, first, second)
    recs = [record(runs, name, mode, trial, t, b, d, "instance", reference=trial is None)
            for trial, t, a, b in pairs if (d := first_divergence(a, b)) is not None]
    n = len(pairs)
    if n == 0:
        return Judged(CheckResult.vacuous(name, requirement, evidence=ev,
                                  message=second.note or "the second instance completed nothing"))
    if recs:
        return Judged(CheckResult.failed(name, requirement, trials=n, divergent=len(recs),
                                  evidence=ev, message=f"{len(recs)} of {n} runs differ between two {mode} "
                                                       "instances"), tuple(recs))
    return Judged(CheckResult.passed(name, requirement, trials=n, evidence=ev,
                              message=f"{n} runs bitwise equal on two separately started {mode} instances"))


def tp_parity(runs: Runs, requirement: str) -> Judged:
    """Invariant mode's references at the run's tensor-parallel size against those at the check's size:
    reported with the size of their difference (oracle.tp_parity)."""
    inv = runs.inv
    other: InstanceRun | None = inv.checks.get("tp_parity") if inv is not None else None
    verdict, message, ev, n, divergent = judge_parity(
        inv.solo if inv is not None else None, other.solo if other is not None else None,
        other.note if other is not None else "", [t.name for t in runs.targets], run_size(runs.config.engine),
        runs.config.checks.tp_parity.tensor_parallel_size)
    made = {"pass": CheckResult.passed, "fail": CheckResult.failed, "vacuous": CheckResult.vacuous}[verdict]
    return Judged(made("tp_parity", requirement, trials=n, divergent=divergent, evidence=ev, message=message))


CheckFn = Callable[[Runs, str], Judged]
INV: tuple[Mode, ...] = ("invariant",)
PROD: tuple[Mode, ...] = ("production",)
BOTH: tuple[Mode, ...] = ("invariant", "production")


@dataclass(frozen=True)
class Check:
    """A check's row: its function, the modes it cannot be judged without, the modes a run must execute for
    it, and the runs it makes of its own beside the schedule's trials (oracle.execute.CheckRun), if any."""

    judge: CheckFn
    needs: tuple[Mode, ...]
    reads: tuple[Mode, ...]
    runs: CheckRun | None = None


# One row per check (and per field of `checks:` in the config), in the order they run and are reported.
CHECKS: dict[str, Check] = {
    "invariance": Check(invariance, INV, INV),
    "repeatability": Check(repeatability, (), BOTH),
    "fidelity": Check(fidelity, BOTH, BOTH),
    "drift": Check(drift, PROD, PROD),
    "negative_control": Check(negative_control, (), PROD),
    "prefill_decode": Check(prefill_decode, INV, INV, PREFILL_DECODE),
    "prefix_cache": Check(prefix_cache, INV, INV, PREFIX_CACHE),
    "golden": Check(golden, INV, INV),
    "seeded_sampling": Check(seeded_sampling, INV, INV, SEEDED_SAMPLING),
    "cross_instance": Check(cross_instance, (), (), CROSS_INSTANCE),  # reads checks.cross_instance.mode (modes_read)
    "tp_parity": Check(tp_parity, INV, INV, TP_PARITY),
}


def check_runs(config: Config) -> dict[str, CheckRun]:
    """The own runs of the checks `config` enables, by check name, in table order (oracle.execute)."""
    return {name: row.runs for name, row in CHECKS.items()
            if row.runs is not None and getattr(config.checks, name).requirement != "off"}


def check_data() -> dict[str, Any]:
    """Check name -> the type of what its own runs keep in `ModeResult.checks` (oracle.shards.results)."""
    return {name: row.runs.data for name, row in CHECKS.items() if row.runs is not None}


def modes_read(config: Config) -> list[Mode]:
    """The modes the enabled checks read, in the order they run: a run executes only these."""
    read = {m for name, row in CHECKS.items()
            if getattr(config.checks, name).requirement != "off" for m in row.reads}
    if config.checks.cross_instance.requirement != "off":
        read.add(config.checks.cross_instance.mode)
    return [m for m in BOTH if m in read]


# Checks that compare one mode's server against the other's: with one server for both, they compare it
# with itself, and say so (vacuous), whatever they found.
SELF_COMPARED = ("fidelity", "drift", "negative_control")
SHARED_SERVER = ("one server serves both modes (engine.options.base_url is a single URL), so this compares "
                 "the server with itself; give base_url: {invariant: URL, production: URL}")


def shared_server(config: Config) -> bool:
    """One server serves both modes (the openai engine with one base_url): the engine's row says (a
    `module:Class` engine's row is the default: never; its class is not imported here)."""
    row = known_row(config.engine.kind)
    return row is not None and row.shared_server(config.engine)


def _self_compared(result: CheckResult) -> CheckResult:
    if result.verdict == "error":
        return result
    message = SHARED_SERVER + (f" (found: {result.message})" if result.message else "")
    return result.model_copy(update={"verdict": "vacuous", "message": message,
                                     "evidence": {**result.evidence, "shared_server": True}})


def judge(runs: Runs) -> tuple[list[CheckResult], list[DivergenceRecord]]:
    """Every enabled check whose modes ran, in table order."""
    results: list[CheckResult] = []
    divergences: list[DivergenceRecord] = []
    for name, row in CHECKS.items():
        requirement = getattr(runs.config.checks, name).requirement
        if requirement == "off" or any(runs.mode(m) is None for m in row.needs):
            continue
        if name == "golden" and runs.golden is None:
            continue
        judged = row.judge(runs, requirement)
        self_compared = name in SELF_COMPARED and shared_server(runs.config)
        results.append(_self_compared(judged.result) if self_compared else judged.result)
        divergences += judged.divergences
    return results, divergences


def within(value: float | None, tolerance: float, strict: bool = False) -> bool:
    """value <= tolerance (< when strict) for a finite value; NaN, infinities and None are never within."""
    if value is None or not math.isfinite(value):
        return False
    return value < tolerance if strict else value <= tolerance


def _row(c: Completion, i: int) -> Any:
    return c.logits[i] if c.logits is not None and i < len(c.logits) else None


def _kl(p_logits: Any, q_logits: Any) -> float:
    p = np.asarray(p_logits, dtype=np.float64)
    q = np.asarray(q_logits, dtype=np.float64)
    with np.errstate(invalid="ignore"):  # a NaN row gives a NaN KL, which fidelity reports as not finite
        lp = p - np.logaddexp.reduce(p)
        lq = q - np.logaddexp.reduce(q)
        return float(np.sum(np.exp(lp) * (lp - lq)))


def _bucket(n: int, edges: Iterable[int]) -> str:
    lo = 1
    for e in edges:
        if n <= e:
            return f"{lo}-{e}" if lo != e else str(e)
        lo = e + 1
    return f"{lo}+"


_ORIGIN_HITS = {"search": ("search trials run",), "database": ("trials replayed from the example database",)}

# What a trial's target met, read from the trial and its completion: (condition, hit(trial, completion, the
# passes the target shared with another sequence)). Every condition is listed in coverage, hit or not.
_Condition = Callable[[Trial, Completion, list[StepEvidence]], bool]
_CONDITIONS: tuple[tuple[str, _Condition], ...] = (
    ("target shared a pass", lambda t, c, shared: bool(shared)),
    ("target first in batch", lambda t, c, shared: t.batch_size > 1 and t.position == 0),
    ("target in the middle of the batch",
     lambda t, c, shared: t.batch_size > 1 and t.position not in (0, t.batch_size - 1)),
    ("target last in batch", lambda t, c, shared: t.batch_size > 1 and t.position == t.batch_size - 1),
    ("mixed prefill+decode pass",
     lambda t, c, shared: any(e.num_prefill_tokens and e.num_decode_tokens for e in shared)),
    ("decode-only shared pass", lambda t, c, shared: any(e.num_prefill_tokens == 0 for e in shared)),
    ("target prompt chunked", lambda t, c, shared: any(e.chunked for e in c.evidence)),
    ("shared pass with a chunked prompt", lambda t, c, shared: any(e.has_chunked for e in shared)),
    ("filler shares the target's prefix", lambda t, c, shared: any(f.shared_prefix for f in t.fillers)),
    ("target prompt hit the prefix cache", lambda t, c, shared: any(e.num_cached_tokens > 0 for e in c.evidence)),
    ("staggered arrival", lambda t, c, shared: t.target_arrival_step > 0
     or any(f.arrival_step > t.target_arrival_step for f in t.fillers)),
    *((f"target KV length > {b} in a shared pass",
       lambda t, c, shared, b=b: any((e.kv_len or 0) > b for e in shared)) for b in KV_BOUNDARIES),
)


def _shared_sizes(shared: Sequence[StepEvidence]) -> set[str]:
    """How many other sequences the target's shared passes held, and how many tokens they packed (bucketed)."""
    if not shared:
        return set()
    others = _bucket(max(e.num_seqs for e in shared) - 1, (1, 3, 7, 15, 63, 255))
    return {f"shared with {others} {'sequence' if others == '1' else 'sequences'}",
            f"packed query length {_bucket(max(e.num_tokens for e in shared), (16, 64, 256, 1024))}"}


def _hits(t: Trial, c: Completion) -> set[str]:
    """Every coverage condition one trial's target hit."""
    shared = [e for e in c.evidence if e.num_seqs >= 2]
    return {"trials run", *_ORIGIN_HITS.get(t.origin, ()), *probe_hits(t), *_shared_sizes(shared),
            *(name for name, hit in _CONDITIONS if hit(t, c, shared))}


def _coverage_order(item: tuple[str, int]) -> tuple[int, list[int | str]]:
    """Most hit first; equal counts by name, numbers by value ("> 64" before "> 512")."""
    name, count = item
    return -count, [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def coverage(runs: Runs) -> dict[str, int]:
    """How many trials (invariant mode: the schedule's, replayed and searched) hit each condition that kernels
    key their choices on.

    Conditions read from the engine's per-pass evidence count only passes the target shared with
    another sequence; an engine that does not report a field counts 0 for it.
    """
    inv = runs.inv
    if inv is None:
        return {}
    # every listed condition and every planned probe side, hit or not
    out: Counter[str] = Counter({k: 0 for k in (
        *(name for name, _ in _CONDITIONS), *(h for t in runs.trials.values() for h in probe_hits(t)))})
    for tid in runs.judged_ids:
        c = inv.trials.get(tid)
        if c is not None:
            out.update(_hits(runs.trials[tid], c))
    return dict(sorted(out.items(), key=_coverage_order))
