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


def trial_strategy(cfg: ScheduleConfig, num_targets: int) -> st.SearchStrategy[dict[str, Any]]:
    """Strategy of trial fields (without the id): batch size, target and position, fillers, budget."""

    @st.composite
    def draw(data: st.DrawFn) -> dict[str, Any]:
        batch = data(_sizes(*cfg.batch_size))
        base_seed = data(st.integers(0, 2**31 - 1))
        fillers = tuple(
            Filler(
                seed=base_seed + i,
                length=data(st.integers(*cfg.filler_len)),
                max_tokens=data(st.integers(*cfg.filler_max_tokens)),
                arrival_step=data(st.integers(*cfg.arrival_step)),
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


def draw_schedule(cfg: ScheduleConfig, num_targets: int, seed: int) -> list[Trial]:
    """Draw `cfg.trials` trials with hypothesis' own engine, reproducibly from `seed`.

    Trials whose fields repeat an earlier trial exactly are dropped, so a narrow range may
    give fewer trials than asked for.
    """
    drawn: list[dict[str, Any]] = []

    @hypothesis_seed(seed)
    @settings(max_examples=cfg.trials, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck), derandomize=False)
    @given(trial_strategy(cfg, num_targets))
    def collect(fields: dict[str, Any]) -> None:
        if fields not in drawn:
            drawn.append(fields)

    collect()
    return [Trial(trial_id=i, **f) for i, f in enumerate(drawn)]
