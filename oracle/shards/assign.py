"""Shards: slice `i/N` of one seed's schedule, so that many workers run one run's trials.

Every shard draws the whole schedule from the seed (the draw is pure: oracle.schedule) and keeps the
trials `assign` gives its index: trials are dealt largest first to the least loaded shard (ties to
the lower index), by an estimate of each trial's cost: the tokens its sequences hold (prompts and
generated tokens) times the passes it is run (twice when it is repeated). The deal is a function of
the schedule alone, so every shard and `oracle merge` compute the same one.

What a shard runs (`oracle.plan.slice_plan` cuts the plan; the runner hands the slice to oracle.execute):
- both modes' solo references of every target (each shard compares its trials against them; merge
  checks that every shard's references are bitwise the same);
- its trials, and the repeats of those of its trials the whole run repeats (the schedule's first
  `repeat_trials`);
- shard 0 alone: the per-target checks (prefill_decode, prefix_cache);
- no shrinking and no localization of invariance failures: `oracle merge` runs those once, for the
  run's first failing trial (oracle.shards.merge says why).

Indexes are 0-based (`--shard 0/4` .. `--shard 3/4`), as Kubernetes' JOB_COMPLETION_INDEX and a
Ray task's index are.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from oracle.errors import ConfigError
from oracle.prompts import Target
from oracle.schedule import Trial

_SPEC = re.compile(r"^\s*(\d{1,9})\s*/\s*(\d{1,9})\s*$")
MAX_SHARDS = 100_000


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count`: the ids of its trials and of the trials it repeats."""

    index: int
    count: int
    schedule_size: int = 0  # trials in the whole schedule (shrink candidates are numbered after them)
    trial_ids: tuple[int, ...] = ()
    repeat_ids: frozenset[int] = field(default_factory=frozenset)
    schedule: tuple[Trial, ...] = field(default=(), repr=False)  # the whole schedule, every shard's trials

    @property
    def runs_per_target_checks(self) -> bool:
        """Shard 0 runs the checks that are per target, not per trial (prefill_decode, prefix_cache)."""
        return self.index == 0

    @property
    def name(self) -> str:
        return f"{self.index}/{self.count}"

    def to_json(self) -> dict[str, object]:
        return {"index": self.index, "count": self.count, "schedule_size": self.schedule_size,
                "trials": list(self.trial_ids), "repeats": sorted(self.repeat_ids)}


def parse_shard(text: str) -> tuple[int, int]:
    """`i/N` -> (i, N) with 0 <= i < N; ConfigError naming --shard otherwise."""
    m = _SPEC.match(text)
    if m is None:
        raise ConfigError(f"--shard: expected INDEX/COUNT such as 0/4 (0-based), got {text!r}")
    index, count = int(m.group(1)), int(m.group(2))
    if not 1 <= count <= MAX_SHARDS:
        raise ConfigError(f"--shard: COUNT must be in 1..{MAX_SHARDS}, got {count}")
    if index >= count:
        raise ConfigError(f"--shard: INDEX is 0-based and must be below COUNT {count}, got {index}")
    return index, count


def trial_cost(trial: Trial, targets: Sequence[Target], max_tokens: int, repeated: bool) -> int:
    """Tokens x passes: every sequence's prompt and generated tokens, times 2 for a repeated trial."""
    tokens = len(targets[trial.target].token_ids) + max_tokens + sum(f.length + f.max_tokens for f in trial.fillers)
    return tokens * (2 if repeated else 1)


def assign(trials: Sequence[Trial], targets: Sequence[Target], max_tokens: int, repeat_trials: int,
           count: int) -> list[list[int]]:
    """Trial ids per shard (each list in id order): largest cost first to the least loaded shard."""
    repeated = {t.trial_id for t in trials[:repeat_trials]}
    costs = {t.trial_id: trial_cost(t, targets, max_tokens, t.trial_id in repeated) for t in trials}
    loads = [0] * count
    out: list[list[int]] = [[] for _ in range(count)]
    for tid in sorted(costs, key=lambda i: (-costs[i], i)):
        k = min(range(count), key=lambda s: (loads[s], s))
        loads[k] += costs[tid]
        out[k].append(tid)
    return [sorted(ids) for ids in out]


def make_shard(trials: Sequence[Trial], targets: Sequence[Target], max_tokens: int, repeat_trials: int,
               index: int, count: int) -> Shard:
    ids = assign(trials, targets, max_tokens, repeat_trials, count)[index]
    repeats = frozenset(t.trial_id for t in trials[:repeat_trials]) & frozenset(ids)
    return Shard(index, count, len(trials), tuple(ids), repeats, tuple(trials))
