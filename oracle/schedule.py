"""Trials drawn by hypothesis from the config's ranges.

A trial is plain data: which requests, in which order, when each arrives and what token budget
the engine runs with. Fillers are described by a seed and a length, so a trial stays small
and replayable; `filler_tokens` turns them into token ids.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from oracle.config import ScheduleConfig

# Batch sizes where kernels switch tiles or CUDA graphs are captured; always worth a trial.
BOUNDARY_SIZES = (1, 2, 15, 16, 17, 255, 256, 257, 511, 512, 513)


@dataclass(frozen=True)
class Filler:
    seed: int
    length: int
    max_tokens: int
    arrival_step: int


@dataclass(frozen=True)
class Trial:
    """One execution plan: the target sits at `position` among the fillers."""

    trial_id: int
    target: int  # index into the run's targets
    position: int
    target_arrival_step: int
    fillers: tuple[Filler, ...]
    max_num_batched_tokens: int | None = None

    @property
    def batch_size(self) -> int:
        return len(self.fillers) + 1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> Trial:
        return Trial(
            trial_id=int(d["trial_id"]), target=int(d["target"]), position=int(d["position"]),
            target_arrival_step=int(d["target_arrival_step"]),
            fillers=tuple(Filler(**f) for f in d["fillers"]),
            max_num_batched_tokens=d.get("max_num_batched_tokens"),
        )


def filler_tokens(f: Filler, vocab_size: int) -> tuple[int, ...]:
    rng = random.Random(f.seed)
    return tuple(rng.randrange(vocab_size) for _ in range(f.length))


def _sizes(lo: int, hi: int) -> st.SearchStrategy[int]:
    edges = [b for b in BOUNDARY_SIZES if lo <= b <= hi]
    ints = st.integers(lo, hi)
    # Integers first: shrinking prefers the first branch, so a failure shrinks to its smallest size.
    return st.one_of(ints, st.sampled_from(edges)) if edges else ints


def boundary_sizes(cfg: ScheduleConfig) -> list[int]:
    lo, hi = cfg.batch_size
    return [b for b in BOUNDARY_SIZES if lo <= b <= hi]


def trial_strategy(
    cfg: ScheduleConfig, num_targets: int, batch_size: int | None = None
) -> st.SearchStrategy[dict[str, Any]]:
    """Strategy of trial fields (without the id): batch size, target and position, fillers, budget."""
    sizes = st.just(batch_size) if batch_size is not None else _sizes(*cfg.batch_size)

    @st.composite
    def draw(data: st.DrawFn) -> dict[str, Any]:
        # A handful of scalars per trial rather than choices per filler: hypothesis' generator
        # mutates long choice sequences in place, which would keep repeating one batch size; the
        # upper bounds still shrink, so a minimal trial has fillers of the minimum length.
        batch = data(sizes)
        base_seed = data(st.integers(0, 2**31 - 1))
        len_hi = data(st.integers(*cfg.filler_len))
        tokens_hi = data(st.integers(*cfg.filler_max_tokens))
        arrival_hi = data(st.integers(*cfg.arrival_step))
        rng = random.Random(base_seed)
        fillers = tuple(
            Filler(
                seed=base_seed + i,
                length=rng.randint(cfg.filler_len[0], len_hi),
                max_tokens=rng.randint(cfg.filler_max_tokens[0], tokens_hi),
                arrival_step=rng.randint(cfg.arrival_step[0], arrival_hi),
            )
            for i in range(batch - 1)
        )
        budget = data(st.integers(*cfg.max_num_batched_tokens)) if cfg.max_num_batched_tokens else None
        return {
            "target": data(st.integers(0, num_targets - 1)),
            "position": data(st.integers(0, batch - 1)),
            "target_arrival_step": data(st.integers(*cfg.arrival_step)),
            "fillers": fillers,
            "max_num_batched_tokens": budget,
        }

    return draw()


def _collect(strategy: st.SearchStrategy[dict[str, Any]], n: int, seed: int) -> list[dict[str, Any]]:
    drawn: list[dict[str, Any]] = []

    @hypothesis_seed(seed)
    @settings(max_examples=n, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(fields: dict[str, Any]) -> None:
        if fields not in drawn:
            drawn.append(fields)

    collect()
    return drawn[:n]


def draw_schedule(cfg: ScheduleConfig, num_targets: int, seed: int) -> list[Trial]:
    """Draw `cfg.trials` trials with hypothesis' own engine, reproducibly from `seed`.

    The first trials are the search's own (the same strategy and seed), so a search that finds
    nothing has run exactly them; then one trial at each boundary batch size the range allows
    (1, 2, 15, 16, 17, 255, ...) that the draw missed. Trials repeating an earlier one exactly
    are dropped, so a narrow range may give fewer trials than asked for.
    """
    edges = boundary_sizes(cfg)
    drawn = _collect(trial_strategy(cfg, num_targets), cfg.trials, seed)
    missing = [b for b in edges if b not in {len(f["fillers"]) + 1 for f in drawn}]
    keep = max(0, cfg.trials - len(missing))
    extra = [_collect(trial_strategy(cfg, num_targets, b), 1, seed + b)[0] for b in missing][: cfg.trials]
    return [Trial(trial_id=i, **f) for i, f in enumerate(drawn[:keep] + extra)]
