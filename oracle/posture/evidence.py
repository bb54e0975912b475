"""Evidence classes of the known hazards a run matched: verified, failed or not verified, per hazard and per probe.

A probe is `verified` when every side it plans formed, as the pass evidence of its trials shows
(oracle.posture.formed), `failed` when one of its trials diverged in invariant mode, else `not verified`, each
side that did not form named with what prevented it: the limit that ruled it out when the schedule was planned
(the token budget, max_num_seqs, the model's context), what the evidence showed instead, a trial that did not
complete, or the probe left out of the schedule. A hazard is `failed` when a trial of its probes, or one that
crossed its threshold, diverged; `verified` when every probe it names is; else `not verified`. Pure: the runner
hands it the trials, invariant mode's completions and the divergent trial ids, and puts the result in
`environment.posture.hazards`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from oracle.posture.formed import Side, side_of, sides_of
from oracle.report_sections import (
    HazardEvidence,
    HazardRecord,
    PostureRecord,
    ProbeEvidence,
    ProbeSideEvidence,
)
from oracle.schedule import Trial


@dataclass(frozen=True)
class ProbeRuns:
    """What the classes are read from."""

    trials: Mapping[int, Trial]  # the judged trials (schedule, replayed, searched)
    results: Mapping[int, Any] | None  # trial id -> invariant mode's completion of its target; None: not run
    unformed: Sequence[tuple[str, str]] = ()  # (`probe:side`, the limit that ruled it out when planned)
    divergent: frozenset[int] = frozenset()  # trials with an invariant-mode divergence
    left_out: str = "no trial of it ran: the probe was left out of the schedule"


def _seen(runs: ProbeRuns, tid: int) -> Side:
    found = side_of(runs.trials[tid], runs.results[tid].evidence) if runs.results is not None else None
    return found if found is not None else Side(False, f"trial {tid}: no rule reads its probe's evidence")


def _limit(runs: ProbeRuns, key: str) -> str | None:
    """The planning limit of side `key` (`short_budget:below`), else one of its probe's (a probe this engine
    cannot run at all names one side)."""
    label = key.partition(":")[0]
    return next((lim for k, lim in runs.unformed if k == key), None) or \
        next((lim for k, lim in runs.unformed if k.partition(":")[0] == label), None)


def _side(label: str, side: str, runs: ProbeRuns) -> ProbeSideEvidence:
    key = f"{label}:{side}"
    planned = [tid for tid, t in runs.trials.items() if t.probe == key]
    seen = [(tid, _seen(runs, tid)) for tid in planned if runs.results is not None and tid in runs.results]
    formed = [(tid, s) for tid, s in seen if s.formed]
    if formed:
        return ProbeSideEvidence(side=side, formed=[tid for tid, _ in formed], shown=formed[0][1].shown)
    shown = seen[0][1].shown if seen else ""
    if runs.results is None:
        why = "invariant mode did not run"
    elif seen:
        why = shown
    elif planned:
        why = f"trial {planned[0]} did not complete"
    else:
        why = _limit(runs, key) or runs.left_out
    return ProbeSideEvidence(side=side, shown=shown, not_formed=why)


def probe_evidence(label: str, runs: ProbeRuns) -> ProbeEvidence:
    """One probe's class, with each of its sides."""
    sides = [_side(label, side, runs) for side in sides_of(label)]
    mine = {tid for tid, t in runs.trials.items() if t.probe.partition(":")[0] == label}
    divergent = sorted(mine & runs.divergent)
    evidence = "failed" if divergent else "verified" if all(s.formed for s in sides) else "not verified"
    return ProbeEvidence(probe=label, evidence=evidence, sides=sides, divergent=divergent)


def hazard_evidence(h: HazardRecord, crossed_by: Sequence[int], runs: ProbeRuns) -> HazardEvidence:
    """A matched hazard's class: failed on a divergence in its probes' trials or one that crossed it, verified
    when every probe it names is, else not verified; `why` says what it rests on."""
    probes = [probe_evidence(label, runs) for label in h.probes]
    divergent = sorted(({tid for p in probes for tid in p.divergent} | set(crossed_by)) & runs.divergent)
    if divergent:
        where = ", ".join(f"trial {tid} ({runs.trials[tid].probe or 'crossed its threshold'})" for tid in divergent)
        return HazardEvidence(id=h.id, evidence="failed", why=f"diverged from the solo reference at the crossing: "
                              f"{where}", divergent=divergent, probes=probes)
    if probes and all(p.evidence == "verified" for p in probes):
        why = "; ".join(f"{p.probe}:{s.side} {s.shown}" for p in probes for s in p.sides)
        return HazardEvidence(id=h.id, evidence="verified", why=why, probes=probes)
    missing = [f"{p.probe}:{s.side} not formed: {s.not_formed}" for p in probes for s in p.sides if not s.formed]
    why = "; ".join(missing) or "the hazard names no probe that crosses its threshold"
    return HazardEvidence(id=h.id, evidence="not verified", why=why, probes=probes)


def evidence_line(h: HazardEvidence) -> str:
    """`hazard ID: verified: ...`: how the summaries say a hazard's class."""
    return f"hazard {h.id}: {h.evidence}: {h.why}"


def evidence_lines(posture: PostureRecord | None) -> list[str]:
    """One line per matched hazard (`environment.posture.hazards`)."""
    return [evidence_line(h) for h in (posture.hazards if posture is not None else ())]
