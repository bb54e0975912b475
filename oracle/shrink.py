"""Shrinking a failing trial to a smaller one that still fails, within a budget of engine runs.

Greedy and deterministic: each round tries reductions from the boldest to the finest and keeps
the first candidate that still fails, then starts again from it. The moves:

1. one telling filler alone (batch 2: the longest, the latest, ...), and one filler that carries
   all the fillers' tokens (longer, arriving with the first) - a failure that needs a big pass,
   not many sequences, shrinks to batch 2 this way;
2. drop a chunk of fillers: halves, then quarters, ... then single ones (delta debugging);
3. simplify what is left: all fillers, then each, to the range's minimum length, max_tokens and
   arrival, without a shared prefix; the target earlier in the batch and arriving first; the
   largest token budget (fewest chunks); filler lengths and max_tokens halved.

The result is `minimal` only when a whole round of every move ran without a failure (no single
reduction of it still fails); when the budget ran out first it is the smallest found. Every
candidate run is a trial of the report (origin `shrink`, `parent` the trial it came from).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from oracle.config import ScheduleConfig
from oracle.schedule import Filler, Trial

# A candidate trial -> did it diverge. The callable runs the engine and records the trial.
Property = Callable[[Trial], bool]


@dataclass
class ShrinkResult:
    start: Trial
    smallest: Trial
    minimal: bool  # a whole round of reductions found nothing smaller that fails
    runs: int = 0
    tried: list[int] = field(default_factory=list)  # trial ids of every candidate run


def _size(t: Trial) -> tuple[int, ...]:
    """Ordering of simplicity: fewer sequences, fewer tokens, earlier arrivals, smaller numbers."""
    return (
        t.batch_size, sum(f.length for f in t.fillers), sum(f.max_tokens for f in t.fillers),
        sum(f.arrival_step for f in t.fillers) + t.target_arrival_step, sum(f.shared_prefix for f in t.fillers),
        t.position, -(t.max_num_batched_tokens or 0),
    )


def _with_fillers(t: Trial, fillers: tuple[Filler, ...]) -> Trial:
    return replace(t, fillers=fillers, position=min(t.position, len(fillers)))


def _pairs(fs: tuple[Filler, ...]) -> list[Filler]:
    """Fillers worth trying alone: the longest, the latest, the longest-running, prefix sharers, ends."""
    picks = [max(fs, key=lambda f: f.length), max(fs, key=lambda f: f.arrival_step),
             max(fs, key=lambda f: f.max_tokens), *[f for f in fs if f.shared_prefix][:2], fs[0], fs[-1]]
    return list(dict.fromkeys(picks))


FillerMove = Callable[[Filler], Filler]


def _fewer_fillers(t: Trial, cfg: ScheduleConfig) -> Iterator[Trial]:
    """1. Batch 2: a telling filler alone, then one filler with all the fillers' tokens. 2. Drop a chunk of
    fillers: halves, quarters, ... single ones (delta debugging's order). One filler: none."""
    fs = t.fillers
    if len(fs) == 1:
        yield _with_fillers(t, ())
    if len(fs) <= 1:
        return
    for f in _pairs(fs):
        yield _with_fillers(t, (f,))
    yield _with_fillers(t, (Filler(
        seed=fs[0].seed, length=min(cfg.filler_len[1], sum(f.length for f in fs)),
        max_tokens=max(f.max_tokens for f in fs), arrival_step=min(f.arrival_step for f in fs),
        shared_prefix=max(f.shared_prefix for f in fs)),))
    chunk = len(fs) // 2
    while chunk >= 1:
        for start in range(0, len(fs), chunk):
            yield _with_fillers(t, fs[:start] + fs[start + chunk:])
        chunk //= 2


def _bulk_moves(cfg: ScheduleConfig) -> list[FillerMove]:
    """Each filler field at its simplest: no shared prefix, the earliest arrival, the shortest prompt and budget."""
    f_lo = cfg.filler_len[0]
    a_lo = cfg.arrival_step[0]
    return [
        lambda f: replace(f, shared_prefix=0),
        lambda f: replace(f, arrival_step=a_lo),
        lambda f: replace(f, length=max(f_lo, f.shared_prefix)),
        lambda f: replace(f, max_tokens=cfg.filler_max_tokens[0]),
    ]


def _finer_moves(cfg: ScheduleConfig) -> list[FillerMove]:
    """The bulk moves, then halving a filler's prompt and budget."""
    f_lo = cfg.filler_len[0]
    return [
        *_bulk_moves(cfg),
        lambda f: replace(f, length=max(f_lo, f.shared_prefix, f.length // 2)),
        lambda f: replace(f, max_tokens=max(cfg.filler_max_tokens[0], f.max_tokens // 2)),
    ]


def _simpler_target(t: Trial, cfg: ScheduleConfig) -> Iterator[Trial]:
    """The target earlier in the batch, arriving first, under the largest token budget."""
    a_lo = cfg.arrival_step[0]
    for p in sorted({0, t.position // 2, t.position - 1}):
        if 0 <= p < t.position:
            yield replace(t, position=p)
    if t.target_arrival_step > a_lo:
        yield replace(t, target_arrival_step=a_lo)
    if cfg.max_num_batched_tokens and t.max_num_batched_tokens != cfg.max_num_batched_tokens[1]:
        yield replace(t, max_num_batched_tokens=cfg.max_num_batched_tokens[1])


def _simpler_each_filler(t: Trial, cfg: ScheduleConfig) -> Iterator[Trial]:
    """Filler by filler, every move that changes it."""
    fs = t.fillers
    moves = _finer_moves(cfg)
    for j, f in enumerate(fs):
        for move in moves:
            g = move(f)
            if g != f:
                yield _with_fillers(t, fs[:j] + (g,) + fs[j + 1:])


def _candidates(t: Trial, cfg: ScheduleConfig) -> Iterator[Trial]:
    yield from _fewer_fillers(t, cfg)
    # 3. Simplify what is left: every filler at once, then the target, then filler by filler.
    for move in _bulk_moves(cfg):
        yield _with_fillers(t, tuple(move(f) for f in t.fillers))
    yield from _simpler_target(t, cfg)
    yield from _simpler_each_filler(t, cfg)


def shrink(start: Trial, fails: Property, cfg: ScheduleConfig, max_runs: int,
           new_id: Callable[[Trial, int], Trial]) -> ShrinkResult:
    """Shrink `start` (which fails) while `fails` holds, running at most `max_runs` candidates.

    `new_id(candidate, parent_id)` gives each candidate its trial id before it runs.
    """
    result = ShrinkResult(start=start, smallest=start, minimal=False)
    seen = {start.key}
    while True:
        improved = False
        for cand in _candidates(result.smallest, cfg):
            if cand.key in seen or _size(cand) >= _size(result.smallest):
                continue
            if result.runs >= max_runs:
                return result
            seen.add(cand.key)
            trial = new_id(cand, result.smallest.trial_id)
            result.runs += 1
            result.tried.append(trial.trial_id)
            if fails(trial):
                result.smallest = trial
                improved = True
                break
        if not improved:
            result.minimal = True
            return result
