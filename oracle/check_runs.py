"""The runs four checks make of their own, beside the schedule's trials: prefill_decode, prefix_cache and
seeded_sampling on invariant mode's engine once its trials are done, cross_instance on a second engine of
its mode once the first has closed. (tp_parity's are in oracle.tp_parity.)

Each is a `CheckRun` (oracle.execute) that its check's row in `oracle.judge.CHECKS` names: the execution
runs it when the check is on, keeps what it gave in `ModeResult.checks[name]`, and a shard's results
write and read it by its declared type (oracle.shards.results); the check's function reads it there.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from oracle.compare import first_divergence, step_of
from oracle.engines.contract import (
    Completion,
    Request,
    ResetsPrefixCache,
    RunSpec,
    SamplingParams,
    capabilities,
)
from oracle.errors import ConfigError
from oracle.execute import CheckRun, InstanceRun, ModeExecution, fresh, generate, keep_rows
from oracle.plan import Plan, solo_request, target_sampling


def _invariant_per_target(ex: ModeExecution) -> bool:
    """Invariant mode, and not a shard other than 0 (which leaves the per-target checks to shard 0)."""
    return ex.mode == "invariant" and ex.per_target


# -- prefill_decode ---------------------------------------------------------------------------------------

def _prefill_request(plan: Plan, t: int, ref: Completion, i: int) -> Request:
    """Target t's prompt plus its first i generated tokens, one token asked: step i of decode, prefilled."""
    target = plan.targets[t]
    return Request(f"prefill-{target.name}-{i}", target.token_ids + tuple(ref.token_ids[:i]),
                   target_sampling(plan.config, 1))


def _prefill_steps(n: int, steps: int) -> list[int]:
    """`steps` decode steps spread over n generated tokens, the first and the last among them."""
    return sorted({round(k * (n - 1) / max(1, steps - 1)) for k in range(steps)})[:steps]


def _run_prefill_decode(ex: ModeExecution) -> None:
    """Per target, `checks.prefill_decode.steps` of its decode steps prefilled again; the first that differs
    from decode is localized. Kept: (target, step) -> the re-prefilled step."""
    assert ex.engine is not None
    prefill: dict[tuple[int, int], Completion] = {}
    ex.checks["prefill_decode"] = prefill  # filled as it runs: an engine that dies keeps what completed
    if ex.plan.model.layout.prefill_decode_differs() is not None:
        return  # not applicable: the check says why (oracle.models.layers)
    for t in range(len(ex.plan.targets)):
        ref = ex.solo[t]
        for i in _prefill_steps(len(ref.token_ids), ex.plan.config.checks.prefill_decode.steps):
            prefill[(t, i)] = fresh(ex.engine, [_prefill_request(ex.plan, t, ref, i)])[0]
            ex.observer.advance(ex.divergent)
    bad = [(t, i) for (t, i), again in prefill.items() if first_divergence(step_of(ex.solo[t], i), again) is not None]
    for t, i in bad[:1]:
        ex.localize(("prefill", t, i), RunSpec((solo_request(ex.plan, t),), 0),
                    RunSpec((_prefill_request(ex.plan, t, ex.solo[t], i),), 0))


def _prefill_units(ex: ModeExecution) -> int:
    return len(ex.plan.targets) * ex.plan.config.checks.prefill_decode.steps


PREFILL_DECODE = CheckRun(Mapping[tuple[int, int], Completion], _run_prefill_decode, _invariant_per_target,
                          units=_prefill_units)


# -- prefix_cache -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PrefixRuns:
    """prefix_cache's runs: per target, its run from an emptied cache and the same run again (warm)."""

    pairs: Mapping[int, tuple[Completion, Completion]] = field(default_factory=dict)  # target -> (cold, warm)
    note: str = ""  # why nothing ran (an engine without prefix caching)


def _run_prefix_cache(ex: ModeExecution) -> None:
    """Per target: reset the cache, run cold, run again warm (the prompt's blocks now cached)."""
    engine = ex.engine
    assert engine is not None
    if not (capabilities(engine).reset_prefix_cache and isinstance(engine, ResetsPrefixCache)
            and ex.describe.get("enable_prefix_caching")):
        ex.checks["prefix_cache"] = PrefixRuns(note="the engine runs without prefix caching "
                                                    "(engine.enable_prefix_caching)")
        return
    pairs: dict[int, tuple[Completion, Completion]] = {}
    ex.checks["prefix_cache"] = PrefixRuns(pairs)
    for t in range(len(ex.plan.targets)):
        engine.reset_prefix_cache()
        req = solo_request(ex.plan, t, "prefix")
        cold = generate(engine, [req])[0]
        warm = generate(engine, [req])[0]
        pairs[t] = (cold, warm)
    bad = [t for t, (cold, warm) in pairs.items() if first_divergence(cold, warm) is not None]
    for t in bad[:1]:
        req = solo_request(ex.plan, t, "prefix")
        ex.localize(("prefix", t), RunSpec((req,), 0), RunSpec((req,), 0, warm_with=(req,)))


PREFIX_CACHE = CheckRun(PrefixRuns, _run_prefix_cache, _invariant_per_target)


# -- seeded_sampling --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SampledRound:
    """One sampling variant of the seeded_sampling check: each request (a target under its own seed, two
    seeds per target) run alone and in every batch layout. `batches[b][j]` is request j's completion in
    layout b (all requests together, in order, then in reverse order)."""

    variant: int
    targets: tuple[int, ...]  # per request: the target it samples
    seeds: tuple[int, ...]  # per request: its seed (all distinct)
    solo: tuple[Completion, ...]
    batches: tuple[tuple[Completion, ...], ...]


@dataclass(frozen=True)
class SampledRuns:
    """seeded_sampling's runs: a round per sampling variant, or why none ran."""

    rounds: tuple[SampledRound, ...] = ()
    note: str = ""  # why it did not run (an engine that only decodes greedily)


def _sampled_requests(plan: Plan, v: int, var: Any, targets: Sequence[int], seeds: Sequence[int]) -> list[Request]:
    """Variant v's requests: target j under seed j, with the variant's temperature, top-p and top-k."""
    return [Request(f"sampled-v{v}-{j}-{plan.targets[t].name}", plan.targets[t].token_ids,
                    SamplingParams(plan.config.sampling.max_tokens, var.temperature, seed,
                                   plan.config.sampling.logits, var.top_p, var.top_k))
            for j, (t, seed) in enumerate(zip(targets, seeds, strict=True))]


def _distinct_seeds(rng: random.Random, n: int) -> list[int]:
    """n different seeds, drawn in order from `rng`."""
    seeds: list[int] = []
    while len(seeds) < n:
        seed = rng.randrange(2**31)
        if seed not in seeds:
            seeds.append(seed)
    return seeds


def _run_seeded_sampling(ex: ModeExecution) -> None:
    """Per sampling variant: the first targets under two distinct seeds each, every request alone, then all
    together in order and in reverse order. Seeds are drawn from the run's seed."""
    assert ex.engine is not None
    plan = ex.plan
    cfg = plan.config.checks.seeded_sampling
    rng = random.Random(f"seeded_sampling/{plan.seed}")
    targets = tuple(t for t in range(min(cfg.targets, len(plan.targets))) for _ in (0, 1))
    rounds: list[SampledRound] = []
    for v, var in enumerate(cfg.variants):
        seeds = _distinct_seeds(rng, len(targets))
        reqs = _sampled_requests(plan, v, var, targets, seeds)
        try:
            solo = [fresh(ex.engine, [r])[0] for r in reqs]
        except ConfigError as e:  # an engine that only decodes greedily says so
            ex.checks["seeded_sampling"] = SampledRuns(
                tuple(rounds), f"the {ex.describe.get('engine', 'engine')} engine does not sample: {e}")
            return
        forward = fresh(ex.engine, reqs)
        backward = fresh(ex.engine, reqs[::-1])[::-1]
        rounds.append(SampledRound(
            v, targets, tuple(seeds), tuple(keep_rows(c) for c in solo),
            (tuple(keep_rows(c) for c in forward), tuple(keep_rows(c) for c in backward))))
        ex.checks["seeded_sampling"] = SampledRuns(tuple(rounds))


SEEDED_SAMPLING = CheckRun(SampledRuns, _run_seeded_sampling, _invariant_per_target)


# -- cross_instance ---------------------------------------------------------------------------------------

def _run_cross_instance(ex: ModeExecution) -> None:
    """Start the mode's engine again, separately, and run every reference and the first trials on it."""
    plan = ex.plan
    # The schedule's first trials, also in a shard (whose `trials` are its slice), as unsharded.
    schedule = plan.shard.schedule if plan.shard is not None else plan.trials
    n = min(plan.config.checks.cross_instance.trials, len(schedule))

    def keep(run: InstanceRun) -> None:
        ex.checks["cross_instance"] = run

    ex.run_again(f"{ex.mode} (second instance)", lambda: ex.build_second(ex.mode), schedule[:n], keep)


def _cross_instance_wanted(ex: ModeExecution) -> bool:
    return ex.mode == ex.plan.config.checks.cross_instance.mode and ex.per_target


CROSS_INSTANCE = CheckRun(InstanceRun, _run_cross_instance, _cross_instance_wanted, after_close=True,
                          phase="second_instance")
