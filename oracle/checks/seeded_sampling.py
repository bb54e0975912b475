"""seeded_sampling (invariant mode): each request's seed alone decides its tokens and logprob bits, alone and in
a batch, and requests with different seeds in one batch do not share their noise.

Its runs, on invariant mode's engine once the trials are done: per sampling variant, the first targets under
two distinct seeds each, every request alone, then all together in order and in reverse order."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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
from oracle.engines.contract import Completion, Request, SamplingParams
from oracle.errors import ConfigError
from oracle.execute import keep_rows
from oracle.plan import Plan
from oracle.report import CheckResult, DivergenceRecord

_LAYOUTS = ("in order", "reversed")


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


def _run(context: CheckContext) -> None:
    """Per sampling variant: the first targets under two distinct seeds each, every request alone, then all
    together in order and in reverse order. Seeds are drawn from the run's seed."""
    plan = context.plan
    cfg = plan.config.checks.seeded_sampling
    rng = random.Random(f"seeded_sampling/{plan.seed}")
    targets = tuple(t for t in range(min(cfg.targets, len(plan.targets))) for _ in (0, 1))
    rounds: list[SampledRound] = []
    for v, var in enumerate(cfg.variants):
        seeds = _distinct_seeds(rng, len(targets))
        reqs = _sampled_requests(plan, v, var, targets, seeds)
        try:
            solo = [context.fresh([r])[0] for r in reqs]
        except ConfigError as e:  # an engine that only decodes greedily says so
            context.keep(SampledRuns(
                tuple(rounds), f"the {context.describe.get('engine', 'engine')} engine does not sample: {e}"))
            return
        forward = context.fresh(reqs)
        backward = context.fresh(reqs[::-1])[::-1]
        rounds.append(SampledRound(
            v, targets, tuple(seeds), tuple(keep_rows(c) for c in solo),
            (tuple(keep_rows(c) for c in forward), tuple(keep_rows(c) for c in backward))))
        context.keep(SampledRuns(tuple(rounds)))


RUNS = CheckRun(SampledRuns, _run, invariant_per_target, phase="seeded-sampling check")


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


ROW = Check("seeded_sampling", seeded_sampling, INV, INV, RUNS, section=INVARIANT_SECTION)
