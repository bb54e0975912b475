"""prefix_cache: a target run with its prompt's blocks cached (warm) == the same target run from an emptied
cache (cold), bitwise, with evidence that the cache was hit (invariant mode).

Its runs, on invariant mode's engine once the trials are done: per target, the cache reset, a one-token run that
caches the prompt's blocks, and the warm run. The cold run is the target's reference (run alone from an emptied
cache before the trials), not run again. The first pair that differs is localized."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from oracle.checks.base import (
    INV,
    INVARIANT_SECTION,
    Check,
    CheckContext,
    CheckRun,
    Judged,
    Runs,
    invariant_per_target,
    record,
)
from oracle.compare import first_divergence
from oracle.engines.contract import Completion, RunSpec
from oracle.mode_result import ModeResult
from oracle.plan import solo_request, target_sampling
from oracle.report import CheckResult, DivergenceRecord


@dataclass(frozen=True)
class PrefixRuns:
    """prefix_cache's runs: per target, its run from an emptied cache and the same run again (warm)."""

    pairs: Mapping[int, tuple[Completion, Completion]] = field(default_factory=dict)  # target -> (cold, warm)
    note: str = ""  # why nothing ran (an engine without prefix caching)


def _run(context: CheckContext) -> None:
    """Per target: reset the cache, cache the prompt's blocks with a one-token run, run the target warm. Its cold
    run is the reference the run already has (alone, from an emptied cache), not run again."""
    if not (context.can_reset_prefix_cache() and context.describe.get("enable_prefix_caching")):
        context.keep(PrefixRuns(note="the engine runs without prefix caching (engine.enable_prefix_caching)"))
        return
    plan = context.plan
    pairs: dict[int, tuple[Completion, Completion]] = {}
    context.keep(PrefixRuns(pairs))
    for t in range(len(plan.targets)):
        context.reset_prefix_cache()
        req = solo_request(plan, t, "prefix")
        cold = context.solo.get(t)
        if cold is None:  # no reference kept for it: run it cold here, which caches its blocks too
            cold = context.generate([req])[0]
        else:
            one = target_sampling(plan.config, 1)
            context.generate([replace(req, request_id=f"{req.request_id}-warmup", sampling=one)])
        warm = context.generate([req])[0]
        pairs[t] = (cold, warm)
    bad = [t for t, (cold, warm) in pairs.items() if first_divergence(cold, warm) is not None]
    for t in bad[:1]:
        req = solo_request(plan, t, "prefix")
        context.localize(("prefix", t), RunSpec((req,), 0), RunSpec((req,), 0, warm_with=(req,)))


RUNS = CheckRun(PrefixRuns, _run, invariant_per_target, phase="prefix-cache check")


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
    row = runs.engine
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


ROW = Check("prefix_cache", prefix_cache, INV, INV, RUNS, section=INVARIANT_SECTION)
