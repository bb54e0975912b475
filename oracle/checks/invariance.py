"""invariance: in invariant mode, every target under every trial == its solo reference, bitwise.

A failing trial is rechecked before the batch is blamed (run again as is, its target alone again:
`evidence.recheck`; either moving is run-to-run), then shrunk (its smallest form is a record of its own) and
localized; a known hazard the invariant posture matches that no trial crossed keeps the check from passing
(`untested_hazards`), and `hazard_probes` is the report's account of each matched hazard's probes. A pass
states its strength (oracle.checks.strength), and is vacuous short of `schedule.confidence`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from oracle import op_coverage
from oracle.checks.base import INV, INVARIANT_SECTION, Check, Judged, Runs, record
from oracle.checks.solo import against_solo, cause, run_to_run
from oracle.checks.strength import short_of, strength
from oracle.compare import first_divergence
from oracle.mode_result import ModeResult
from oracle.report import CheckResult, DivergenceRecord, HazardProbesRecord, ProbeNotFormed, Strength
from oracle.report_sections import HazardRecord


def invariance(runs: Runs, requirement: str) -> Judged:
    """Every scheduled trial's target vs its solo run in invariant mode, bitwise; the shrunk trial's record with
    them; vacuous while a matched hazard went untested or the mode leaves an op uncovered (oracle.op_coverage)."""
    result, ev, recs, n = against_solo(runs, "invariance", "invariant")
    if result.reruns or result.solo_again:
        ev["recheck"] = _recheck_evidence(result, runs)
    shrunk = _shrink_evidence(runs, result, ev)
    if result.localize_notes:
        ev["localize_notes"] = list(result.localize_notes)
    judged = [c for tid, c in result.trials.items() if runs.trials[tid].origin != "shrink"]
    return _verdict(runs, requirement, ev, recs + shrunk, shrunk, n, strength(runs.config, judged))


def _recheck_evidence(result: ModeResult, runs: Runs) -> dict[str, list[int]]:
    """What the failing trials rechecked before the batch was blamed gave (oracle.execute.RECHECKED): the trials
    run again, the targets run alone again, those whose solo run moved, and the trials that reproduced bit for
    bit with a steady solo run (the batch's)."""
    moved = sorted(t for t, again in result.solo_again.items() if first_divergence(result.solo[t], again))
    failing = _failing_ids(result, runs)  # a failing trial already repeated is rechecked by its repeat
    repeated = [tid for tid in result.repeats if tid in failing and runs.trials[tid].target in result.solo_again]
    rechecked = sorted({*result.reruns, *repeated})
    reproduced = [tid for tid in rechecked
                  if not run_to_run(result, tid, runs.trials[tid].target, result.trials[tid])]
    return {"trials": rechecked, "targets": sorted(result.solo_again), "solo_moved": moved,
            "reproduced": reproduced, "not_rechecked": sorted(failing - set(rechecked))}


def _failing_ids(result: ModeResult, runs: Runs) -> set[int]:
    """The judged trials (not the shrinker's) whose target differs from its solo run."""
    return {tid for tid, c in result.trials.items() if runs.trials[tid].origin != "shrink"
            and runs.trials[tid].target in result.solo
            and first_divergence(result.solo[runs.trials[tid].target], c) is not None}


def _verdict(runs: Runs, requirement: str, ev: dict[str, Any], recs: list[DivergenceRecord],
             shrunk: list[DivergenceRecord], n: int, power: Strength) -> Judged:
    """Failed on any divergence (or a shrunk one); vacuous when nothing ran, nothing batched, a matched
    hazard went untested, or the batched trials fall short of schedule.confidence; else passed, with what it
    rules out."""
    if n == 0:
        return Judged(CheckResult.vacuous("invariance", requirement, evidence=ev,
                                  message="no trial completed"), tuple(recs))
    failing = [r for r in recs if not r.shrunk]
    gaps = op_coverage.uncovered(runs.environment.get("posture"))
    if gaps:  # a kernel known to follow the batch runs unpinned: no pass, and no divergence blamed on the engine
        ev["uncovered_ops"] = {op: c.model_dump() for op, c in gaps.items()}
        return Judged(CheckResult.vacuous("invariance", requirement, trials=n, divergent=len(failing), evidence=ev,
                                          message=op_coverage.verdict_line(gaps, n, len(failing))),
                      tuple(r.model_copy(update={"cause": "kernels"}) for r in recs))
    if failing or shrunk:
        return Judged(CheckResult.failed("invariance", requirement, trials=n,
                                  divergent=len(failing), evidence=ev,
                                  message=_failure_message(failing, shrunk, n, ev)), tuple(recs))
    if ev["trials_batched"] == 0:
        return Judged(CheckResult.vacuous("invariance", requirement, trials=n, evidence=ev,
                                  message="no trial put a target in a forward pass with another sequence"))
    untested = untested_hazards(runs)
    if untested:
        ev["untested_hazards"] = untested
        why = "; ".join(f"{h}: {w}" for h, w in untested.items())
        return Judged(CheckResult.vacuous("invariance", requirement, trials=n, evidence=ev,
                                  message=f"{n} trials bitwise equal to the solo reference, but a known hazard of "
                                          f"this posture went untested (no trial crossed its threshold): {why}"))
    short = short_of(power)
    if short is not None:
        return Judged(CheckResult.vacuous("invariance", requirement, trials=n, evidence=ev,
                                          message=f"{n} trials bitwise equal to the solo reference, but {short}"
                                          ).model_copy(update={"strength": power}))
    return Judged(CheckResult.passed("invariance", requirement, trials=n, evidence=ev, strength=power,
                                     message=f"{n} trials bitwise equal to the solo reference"))


def _hazard_crossings(runs: Runs, hazard: HazardRecord) -> list[int]:
    """The invariant trials (judged ones) that crossed the threshold of one matched hazard (`environment.hazards`)."""
    from oracle.posture.formed import crossed

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


def untested_hazards(runs: Runs) -> dict[str, str]:
    """hazard id -> why no trial crossed its threshold, for each hazard the invariant posture matches (not merely
    possible): while one is untested, invariance cannot pass."""
    return {h.id: _untested_why(runs, h) for h in _hazards(runs)
            if h.match == "matches" and not _hazard_crossings(runs, h)}


def _hazards(runs: Runs) -> list[HazardRecord]:
    """The known hazards the invariant posture matched (`environment.hazards`)."""
    return [HazardRecord.model_validate(h) for h in runs.environment.get("hazards") or ()]


def _evidence_unformed(runs: Runs, labels: Sequence[str]) -> list[tuple[str, str]]:
    """Probe sides that ran but did not form, as their pass evidence shows (oracle.posture.probes)."""
    from oracle.posture.formed import unformed_by_evidence

    return unformed_by_evidence(runs.trials, runs.inv.trials, labels, runs.judged_ids) if runs.inv else []


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


def _shrink_part(s: dict[str, Any] | None, shrunk: list[DivergenceRecord], recheck: dict[str, Any]) -> str:
    """What the shrinker came to, for the failure message ("" when it did not run and nothing says why)."""
    if s is None:
        return ("not shrunk: no failing trial rechecked gave the same bits twice with a steady solo run"
                if recheck.get("reproduced") == [] else "")
    size = "minimal" if s["minimal"] else f"smallest found in {s['runs']} shrink runs"
    if shrunk and shrunk[0].cause == "nondeterminism":
        return f"shrinking reached trial {shrunk[0].trial_id}, which differs run to run: no minimal batch was found"
    if shrunk:
        return (f"shrunk to trial {shrunk[0].trial_id} of batch {len(shrunk[0].trial.fillers) + 1} "  # type: ignore[union-attr]
                f"({size})")
    return f"trial {s['start_trial']} did not shrink ({size})"


def _failure_message(failing: list[DivergenceRecord], shrunk: list[DivergenceRecord], n: int,
                     ev: dict[str, Any]) -> str:
    nondet = sum(r.cause == "nondeterminism" for r in failing)
    sampler = sum(r.cause == "sampling" for r in failing)
    head = f"{len(failing)} of {n} trials diverged from the solo reference"
    if failing and nondet == len(failing):
        parts = [f"{head}: run-to-run nondeterminism, not batch variance (the target's solo run or the same "
                 "trial gave other bits run again, or the target ran alone)"]
    else:
        parts = [head]
        if nondet:
            parts.append(f"{nondet} of them run-to-run nondeterminism (the target ran alone, or its solo run or "
                         "the trial gave other bits run again), not the batch")
    recheck = ev.get("recheck", {})
    unconfirmed = [r for r in failing if r.cause == "batch" and r.trial_id in recheck.get("not_rechecked", ())]
    if nondet and unconfirmed:
        parts.append(f"{len(unconfirmed)} blamed on the batch were not run again (past the first rechecked): "
                     "unconfirmed while run-to-run nondeterminism was seen")
    if sampler:
        parts.append(f"{sampler} of them the sampler's (another token sampled from bitwise equal logits), "
                     "not the model's")
    shrink_part = _shrink_part(ev.get("shrink"), shrunk, recheck)
    if shrink_part:
        parts.append(shrink_part)
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
    return [record(runs, "invariance", "invariant", t, t.target, out, d, cause(result, t.trial_id, out, t.target),
                   result.localized.get(t.trial_id), shrunk=True, minimal=s.minimal)]


ROW = Check("invariance", invariance, INV, INV, section=INVARIANT_SECTION)
