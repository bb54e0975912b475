"""The strength of a pass: how many batched trials and distinct pass compositions a check saw, and the rate of a
break those 0 divergences rule out.

A break that shows in a fraction p of batched trials escapes N independent ones with probability (1-p)^N; the
largest p that still escapes with probability >= 1-level is 1 - (1-level)^(1/N) (about 3/N at 95%: the rule of
three). `schedule.confidence` asks for a rate at a level: N = ceil(ln(1-level) / ln(1-rate)) batched trials
(`ConfidenceConfig.batched_trials`).

A trial's composition is the set of (num_seqs, num_tokens, is_prefill, chunked, cached) over the target's
forward passes (`StepEvidence`; cached: the pass started from cached prefix blocks): two trials of the same
composition put the target through the same pass shapes, whatever else differed.
"""

from __future__ import annotations

from collections.abc import Iterable

from oracle.config import Config
from oracle.engines.contract import Completion
from oracle.report import Strength

DEFAULT_LEVEL = 0.95

Pass = tuple[int, int, bool, bool, bool]  # (num_seqs, num_tokens, is_prefill, chunked, cached)


def composition(c: Completion) -> frozenset[Pass]:
    """The pass shapes the target went through (its evidence's)."""
    return frozenset((e.num_seqs, e.num_tokens, e.is_prefill, e.chunked, e.num_cached_tokens > 0)
                     for e in c.evidence)


def rate_bound(n: int, level: float) -> float | None:
    """The rate of a break that 0 divergences in n batched trials rule out at `level`; None for n = 0."""
    return 1.0 - (1.0 - level) ** (1.0 / n) if n > 0 else None


def strength(config: Config, completions: Iterable[Completion]) -> Strength:
    """What 0 divergences among `completions` (one per trial, the target's) rule out, at the level of
    `schedule.confidence` (95% without one)."""
    batched = [c for c in completions if c.max_batch >= 2]
    wanted = config.schedule.confidence
    level = wanted.level if wanted is not None else DEFAULT_LEVEL
    return Strength(batched_trials=len(batched), compositions=len({composition(c) for c in batched}), level=level,
                    rate_bound=rate_bound(len(batched), level),
                    wanted=wanted.batched_trials if wanted is not None else None)


def short_of(s: Strength) -> str | None:
    """Why the batched trials fall short of `schedule.confidence`, or None when they reach it (or none was asked)."""
    if s.wanted is None or s.batched_trials >= s.wanted:
        return None
    return (f"schedule.confidence needs {s.wanted} batched trials, the run formed {s.batched_trials} "
            "(raise schedule.trials or the batch sizes)")
