"""Every scheduled trial's target against its solo run in the same mode, bitwise: what invariance (invariant
mode) and drift (production mode) share."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from oracle.checks.base import Runs, record
from oracle.compare import first_divergence
from oracle.engines.contract import Completion
from oracle.mode_result import ModeResult
from oracle.report import Cause, DivergenceRecord


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


def run_to_run(result: ModeResult, trial_id: int, target: int, actual: Completion) -> bool:
    """The same trial gave other bits run again (its repeat or its recheck), or its target alone did."""
    for again in (result.repeats.get(trial_id), result.reruns.get(trial_id)):
        if again is not None and first_divergence(actual, again) is not None:
            return True
    solo = result.solo_again.get(target)
    return solo is not None and target in result.solo and first_divergence(result.solo[target], solo) is not None


def cause(result: ModeResult, trial_id: int, actual: Completion, target: int) -> Cause:
    """What made the target differ from its solo run.

    Nondeterminism when the same trial disagreed with itself, or the target's solo run moved when run
    again (`run_to_run`), or when the other requests could not have touched the target (it never shared a
    pass and started from no cached blocks); the prefix cache when it only met them through cached
    blocks; else the batch. (`record` classes a token sampled from bitwise equal logits as the sampler's.)
    """
    if run_to_run(result, trial_id, target, actual):
        return "nondeterminism"
    if actual.max_batch <= 1:
        hit = any(e.num_cached_tokens > 0 for e in actual.evidence)
        return "prefix_cache" if hit else "nondeterminism"
    return "batch"


def solo_divergences(runs: Runs, name: str, mode: str, result: ModeResult,
                     scheduled: Mapping[int, Completion]) -> list[DivergenceRecord]:
    """A record for each scheduled trial whose target differs from its solo run (bitwise)."""
    recs: list[DivergenceRecord] = []
    for tid, actual in scheduled.items():
        trial = runs.trials[tid]
        if trial.target not in result.solo:
            continue
        d = first_divergence(result.solo[trial.target], actual)
        if d is not None:
            recs.append(record(runs, name, mode, trial, trial.target, actual, d,
                               cause(result, tid, actual, trial.target),
                               result.localized.get(tid)))
    return recs


def divergence_evidence(recs: Sequence[DivergenceRecord], n: int) -> dict[str, Any]:
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


def against_solo(runs: Runs, name: str,
                 mode: str) -> tuple[ModeResult, dict[str, Any], list[DivergenceRecord], int]:
    """(the mode's result, the batch evidence, a record per scheduled trial that differs from its solo run,
    the number of trials judged): every scheduled trial's target vs that target's solo run, bitwise."""
    result = runs.mode(mode)
    assert result is not None
    scheduled = {tid: c for tid, c in result.trials.items() if runs.trials[tid].origin != "shrink"}
    ev = batch_evidence(runs, scheduled)
    recs = solo_divergences(runs, name, mode, result, scheduled)
    n = len(scheduled)
    if recs:
        ev.update(divergence_evidence(recs, n))
    return result, ev, recs, n
