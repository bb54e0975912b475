"""The schedule: N distinct trials drawn by a seeded generator that covers the config's ranges.

A trial is plain data: which requests, in which order, when each arrives and what token budget
the engine runs with. Fillers are described by a seed, a length and how many of the target's
prompt tokens they start with, so a trial stays small and replayable; `filler_tokens` turns
them into token ids.

The draw depends on the seed and the config alone (one `random.Random(seed)`, no global state,
nothing read from loaded modules), so a seed gives the same schedule in the CLI, under pytest
and in a plain script. It is stratified rather than uniform, because what real engines key
their kernel choice on is not only the batch size:

- batch sizes spread on a log scale over the range, plus every boundary size the range holds
  (1, 2, 15-17, 255-257, 511-513: where kernels switch tiles or CUDA graphs are captured);
- every target in turn; the target first, last, in the middle or anywhere in the batch;
- fillers all short, all long or mixed (the packed query length of co-scheduled prefills);
- fillers arriving with the target, staggered, or after it (decode-only vs mixed
  prefill+decode passes); small and large token budgets (chunked prompts);
- fillers that start with the target's prompt and arrive first, so that the target's prompt
  hits the prefix cache inside the trial: a bug that needs a cache hit fails invariance.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from oracle.config import ScheduleConfig
from oracle.config_base import MAX_TRIALS

# Batch sizes where kernels switch tiles or CUDA graphs are captured; always worth a trial.
BOUNDARY_SIZES = (1, 2, 15, 16, 17, 255, 256, 257, 511, 512, 513)
# A trial is redrawn at most this often when it repeats an earlier one.
_MAX_REDRAWS = 32

# schedule: drawn by the seeded generator; database: a failing trial of an earlier run, replayed first
# (oracle.example_db); search: drawn by the guided search (oracle.search); shrink: a shrinker candidate.
Origin = Literal["schedule", "database", "search", "shrink"]


@dataclass(frozen=True)
class Filler:
    seed: int
    length: int
    max_tokens: int
    arrival_step: int
    shared_prefix: int = 0  # leading tokens copied from the target's prompt (at most `length`)


@dataclass(frozen=True)
class Trial:
    """One execution plan: the target sits at `position` among the fillers.

    `origin` says why it ran: drawn by the schedule, replayed from the example database, drawn by
    the guided search, or a reduction tried while shrinking the trial `parent`.
    """

    trial_id: int
    target: int  # index into the run's targets
    position: int
    target_arrival_step: int
    fillers: tuple[Filler, ...]
    max_num_batched_tokens: int | None = None
    origin: Origin = "schedule"
    parent: int | None = None
    probe: str = ""  # a hazard probe's stratum and side (oracle.posture.probes), `fa3_kv_256:above`; "" for a drawn trial

    @property
    def batch_size(self) -> int:
        return len(self.fillers) + 1

    @property
    def key(self) -> tuple[Any, ...]:
        """What the engine runs: two trials with the same key are the same experiment."""
        return (self.target, self.position, self.target_arrival_step, self.fillers, self.max_num_batched_tokens)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> Trial:
        return Trial(
            trial_id=int(d["trial_id"]), target=int(d["target"]), position=int(d["position"]),
            target_arrival_step=int(d["target_arrival_step"]),
            fillers=tuple(Filler(**f) for f in d["fillers"]),
            max_num_batched_tokens=d.get("max_num_batched_tokens"),
            origin=d.get("origin", "schedule"), parent=d.get("parent"), probe=d.get("probe", ""),
        )


def filler_tokens(f: Filler, vocab_size: int, target_tokens: Sequence[int] = ()) -> tuple[int, ...]:
    """The filler's prompt: `shared_prefix` tokens of the target's prompt, then seeded random tokens."""
    shared = tuple(target_tokens[: min(f.shared_prefix, f.length)])
    rng = random.Random(f.seed)
    return shared + tuple(rng.randrange(vocab_size) for _ in range(f.length - len(shared)))


def boundary_sizes(cfg: ScheduleConfig) -> list[int]:
    lo, hi = cfg.batch_size
    return [b for b in BOUNDARY_SIZES if lo <= b <= hi]


def _log_spread(rng: random.Random, lo: int, hi: int, i: int, n: int) -> int:
    """The i-th of n stratified draws, log-uniform over [lo, hi]."""
    u = (i + rng.random()) / n
    return min(hi, max(lo, int(math.exp(math.log(lo) + u * (math.log(hi + 1) - math.log(lo))))))


class _Draw:
    """One schedule's generator: stratified choices from one seeded `random.Random`."""

    def __init__(self, cfg: ScheduleConfig, target_lens: Sequence[int], seed: int) -> None:
        self.cfg = cfg
        self.target_lens = list(target_lens)
        self.rng = random.Random(seed)
        n = cfg.trials
        lo, hi = cfg.batch_size
        sizes = [_log_spread(self.rng, lo, hi, i, n) for i in range(n)]
        # Every boundary size once (replacing log-spread draws at random slots), unless N is too small.
        edges = boundary_sizes(cfg)
        if len(edges) > n:
            edges = [edges[round(k * (len(edges) - 1) / max(1, n - 1))] for k in range(n)]
        for slot, size in zip(self.rng.sample(range(n), len(edges)), edges, strict=True):
            sizes[slot] = size
        self.sizes = sizes
        order = list(range(len(target_lens)))
        self.rng.shuffle(order)
        self.targets = [order[i % len(order)] for i in range(n)]
        budgets = cfg.max_num_batched_tokens
        self.budgets = [_log_spread(self.rng, budgets[0], budgets[1], i, n) for i in range(n)] if budgets else None
        if self.budgets:
            self.rng.shuffle(self.budgets)

    def _slot(self, i: int, redraw: int) -> tuple[int, int]:
        """Slot i's (batch size, target); after many redraws, others drawn afresh."""
        if redraw < _MAX_REDRAWS // 2:
            return self.sizes[i], self.targets[i]
        # This slot's size keeps giving trials already drawn (batch 1 of one target, say): another size.
        batch = _log_spread(self.rng, *self.cfg.batch_size, 0, 1)
        return batch, self.rng.randrange(len(self.target_lens))

    def _filler(self, lengths: str, timing: str, target_arrival: int, prefix_of: int) -> Filler:
        """One filler of the given lengths and timing; `prefix_of` > 0: it starts with that many tokens' worth of
        the target's prompt (some of them) and arrives first."""
        cfg, rng = self.cfg, self.rng
        f_lo, f_hi = cfg.filler_len
        a_lo, a_hi = cfg.arrival_step
        # Every kind is drawn whichever is kept, so the stream does not depend on the choice.
        length = {"short": rng.randint(f_lo, max(f_lo, min(f_hi, f_lo + (f_hi - f_lo) // 4))),
                  "long": rng.randint(max(f_lo, f_hi - (f_hi - f_lo) // 4), f_hi),
                  "mixed": rng.randint(f_lo, f_hi)}[lengths]
        arrival = {"together": target_arrival, "staggered": rng.randint(a_lo, a_hi),
                   "after": rng.randint(min(a_hi, target_arrival + 1), a_hi)}[timing]
        prefix = 0
        if prefix_of:
            # The first filler starts with the target's prompt and arrives first: its blocks are
            # cached by the time the target's prompt is scheduled.
            prefix = rng.randint(1, prefix_of)
            length = max(length, prefix)
            arrival = a_lo
        return Filler(seed=rng.randrange(2**31), length=length, max_tokens=rng.randint(*cfg.filler_max_tokens),
                      arrival_step=arrival, shared_prefix=prefix)

    def _after_prefix(self, target_arrival: int) -> int:
        """A target behind a filler that shares its prefix arrives after the earliest step, where the range allows."""
        a_lo, a_hi = self.cfg.arrival_step
        if target_arrival == a_lo and a_hi > a_lo:
            return self.rng.randint(a_lo + 1, a_hi)
        return target_arrival

    def trial(self, i: int, trial_id: int, redraw: int = 0) -> Trial:
        cfg, rng = self.cfg, self.rng
        batch, target = self._slot(i, redraw)
        place = i % 4
        position = (0, batch - 1, batch // 2, rng.randrange(batch))[place]
        target_arrival = rng.randint(*cfg.arrival_step)
        # How the fillers arrive relative to the target: together, staggered, or after it (mixed passes).
        timing = rng.choice(("together", "staggered", "after"))
        lengths = rng.choice(("short", "long", "mixed"))
        shared = batch > 1 and self.target_lens[target] > 1 and rng.random() < 0.25
        prefix_of = self.target_lens[target] if shared else 0  # the first filler's only
        fillers = tuple(self._filler(lengths, timing, target_arrival, 0 if j else prefix_of) for j in range(batch - 1))
        if shared:
            target_arrival = self._after_prefix(target_arrival)
        budget = self.budgets[i] if self.budgets else None
        return Trial(trial_id, target, position, target_arrival, fillers, budget)


def sized(cfg: ScheduleConfig, target_lens: Sequence[int], seed: int) -> ScheduleConfig:
    """`cfg` with enough trials that `schedule.confidence`'s batched trials are drawn: at least `cfg.trials`,
    grown until the stratified batch sizes hold that many of 2 or more. Unchanged without a confidence, or
    where the batch sizes cannot reach it (then invariance says vacuous)."""
    if cfg.confidence is None or cfg.batch_size[1] < 2:
        return cfg
    wanted = cfg.confidence.batched_trials
    n = max(cfg.trials, wanted)
    while n < MAX_TRIALS:
        got = sum(s >= 2 for s in _Draw(cfg.model_copy(update={"trials": n}), target_lens, seed).sizes)
        if got >= wanted:
            break
        n = min(MAX_TRIALS, n + wanted - got)  # at most about one batched trial per slot added
    return cfg if n == cfg.trials else cfg.model_copy(update={"trials": n})


def draw_schedule(cfg: ScheduleConfig, target_lens: Sequence[int], seed: int) -> list[Trial]:
    """`cfg.trials` distinct trials for targets with prompts of `target_lens` tokens, from `seed` (more where
    `schedule.confidence` needs them: `sized`).

    A trial that repeats an earlier one is redrawn; only where the ranges hold fewer distinct
    trials than asked for (one target, batch size 1, nothing else to vary) is the schedule shorter.
    """
    if not target_lens:
        return []
    cfg = sized(cfg, target_lens, seed)
    draw = _Draw(cfg, target_lens, seed)
    seen: set[tuple[Any, ...]] = set()
    trials: list[Trial] = []
    for i in range(cfg.trials):
        for redraw in range(_MAX_REDRAWS):
            t = draw.trial(i, len(trials), redraw)
            if t.key not in seen:
                seen.add(t.key)
                trials.append(t)
                break
    return trials


def renumber(trial: Trial, trial_id: int, parent: int | None) -> Trial:
    return replace(trial, trial_id=trial_id, origin="shrink", parent=parent)
