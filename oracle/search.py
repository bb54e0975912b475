"""The guided search (`schedule.search: {trials: N}`): after the schedule, hypothesis draws more trials.

The schedule spreads trials over the config's ranges; a kernel that switches configuration at a
size nobody listed (a packed query length, a KV length) can sit between its draws. The search
draws trials from the same ranges with hypothesis and steers with `hypothesis.target()` toward
what real engines key their kernels on, read from the engine's per-pass evidence for the target:

- the packed query length of the target's shared passes, its KV length there, the sequences per
  pass and the target's position: each maximised, and each one's distance to the nearest value
  already seen (the schedule's trials included), so the search also fills the gaps between them;
- once a difference appears, its size in ULP (log2): toward the worst case of a fault.

Every trial runs once (hypothesis never shrinks here: a failing trial is recorded and the search
goes on); failures are handed to our shrinker by the caller (oracle.execute). The search is
derandomized from the run's seed: hypothesis runs with `@seed(...)`, no database, no health checks,
no deadline and every setting given, so the same seed gives the same search in the CLI, under
pytest (whatever hypothesis profile is loaded) and in a plain script, and no `.hypothesis/` folder
is written. hypothesis is imported when a search starts, not before.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from oracle.compare import Divergence
from oracle.config import ScheduleConfig
from oracle.engines.contract import Completion
from oracle.report_sections import SearchRecord
from oracle.schedule import Filler, Trial

# A search trial -> the target's completion and its first divergence from the solo run (None: equal).
Observe = Callable[[Trial], tuple[Completion, Divergence | None]]

# hypothesis.target() labels: the quantities kernels key on, and the size of a difference.
TARGETS = ("packed query length", "target KV length", "sequences per pass", "target position")
ULP_LABEL = "log2 ULP of the difference"
# Trials per hypothesis run (a round of the search).
ROUND = 20
# Rounds in a row that run no new trial end the search (the ranges hold no more shapes).
IDLE_ROUNDS = 3
# A divergence in the token itself (no ULP to measure) counts as this many ULP.
TOKEN_ULP = 2**24


@dataclass(frozen=True)
class SearchOutcome:
    """What the search ran: its trials in order, the ones that diverged, and the best value of each target."""

    asked: int
    seed: int  # hypothesis's seed, derived from the run's
    trials: tuple[Trial, ...] = ()
    failing: tuple[int, ...] = ()  # trial ids
    best: dict[str, float] = field(default_factory=dict)

    def summary(self) -> SearchRecord:
        """The report's `search` section."""
        return SearchRecord(asked=self.asked, run=len(self.trials), hypothesis_seed=self.seed,
                            failing_trials=list(self.failing), best=dict(self.best),
                            trial_ids=[t.trial_id for t in self.trials])


def search_seed(seed: int) -> int:
    """hypothesis's seed for a run's seed: its own stream, never the schedule's `random.Random(seed)`."""
    return int.from_bytes(hashlib.sha256(f"oracle.search/{seed}".encode()).digest()[:8], "big")


def observe_keys(trial: Trial, c: Completion) -> dict[str, int]:
    """What the target's passes looked like, as kernels would see them; 0 where it never shared a pass."""
    shared = [e for e in c.evidence if e.num_seqs >= 2]
    return {
        "packed query length": max((e.num_tokens for e in shared), default=0),
        "target KV length": max((e.kv_len or 0 for e in shared), default=0),
        "sequences per pass": max((e.num_seqs for e in shared), default=0),
        "target position": max((e.seq_position if e.seq_position is not None else trial.position for e in shared),
                               default=0),
    }


def shape(trial: Trial) -> tuple[Any, ...]:
    """What kernels would see of a trial: its target and place, the sequences and their total prompt and
    generated tokens, arrivals and budget. The search runs one trial of a shape: hypothesis, climbing a
    target, would otherwise spend engine runs on variations no kernel keys on (seeds, how the same
    tokens are shared out among fillers)."""
    fs = trial.fillers
    return (trial.target, trial.position, trial.target_arrival_step, trial.max_num_batched_tokens, len(fs),
            sum(f.length for f in fs), sum(f.max_tokens for f in fs), tuple(sorted({f.arrival_step for f in fs})),
            sum(f.shared_prefix for f in fs))


def ulp_score(d: Divergence | None) -> float:
    """0 without a difference; else 1 + log2(1 + ULP), a token flip counting as TOKEN_ULP."""
    if d is None:
        return 0.0
    ulp = d.ulp if d.ulp is not None else TOKEN_ULP
    return 1.0 + math.log2(1 + ulp)


class _Seen:
    """Values of one key seen so far, sorted: the distance of a new one to the nearest."""

    def __init__(self) -> None:
        self.values: list[int] = []

    def gap(self, v: int) -> int:
        i = bisect.bisect_left(self.values, v)
        near = [abs(v - self.values[j]) for j in (i - 1, i) if 0 <= j < len(self.values)]
        return min(near, default=v)

    def add(self, v: int) -> None:
        i = bisect.bisect_left(self.values, v)
        if i == len(self.values) or self.values[i] != v:
            self.values.insert(i, v)


def split_tokens(total: int, weights: Sequence[int], lo: int, hi: int) -> list[int]:
    """`len(weights)` lengths in [lo, hi] summing to `total` (clamped to what they can hold), in proportion
    to `weights` (+1 each) above `lo`: the packed query length is drawn, then shared out among fillers."""
    n = len(weights)
    if n == 0:
        return []
    room = hi - lo
    rest = min(max(total - n * lo, 0), n * room)
    whole = sum(w + 1 for w in weights)
    out = [min(room, rest * (w + 1) // whole) for w in weights]
    left = rest - sum(out)
    i = 0
    while left > 0:  # what the floors and caps left over, one token at a time to those with room
        if out[i % n] < room:
            out[i % n] += 1
            left -= 1
        i += 1
    return [lo + x for x in out]


def _trial_strategy(cfg: ScheduleConfig, target_lens: Sequence[int]) -> Any:
    """Trials from the config's ranges, shared passes preferred (a batch of 1 tells nothing).

    The fillers' total prompt length is drawn directly (then shared out by drawn weights), so that the
    packed query length of the pass, the quantity most kernels key on, is one integer hypothesis draws
    evenly over its range and moves in one step while it climbs a target; drawn filler by filler its
    sum would crowd the middle of the range.
    """
    from hypothesis import strategies as st

    lo, hi = cfg.batch_size
    f_lo, f_hi = cfg.filler_len
    m_lo, m_hi = cfg.filler_max_tokens
    a_lo, a_hi = cfg.arrival_step
    budgets = cfg.max_num_batched_tokens

    @st.composite
    def trials(draw: Any) -> Trial:
        target = draw(st.integers(0, len(target_lens) - 1))
        n_lo, n_hi = max(lo, min(2, hi)) - 1, hi - 1
        # The fillers' tokens first, evenly over all a batch can hold; then a number of fillers that holds them.
        total = draw(st.integers(n_lo * f_lo, n_hi * f_hi))
        n = draw(st.integers(max(n_lo, -(-total // f_hi)), max(n_lo, min(n_hi, total // f_lo))))
        lengths = split_tokens(total, draw(st.lists(st.integers(0, 15), min_size=n, max_size=n)), f_lo, f_hi)
        position = draw(st.integers(0, n))
        target_arrival = draw(st.integers(a_lo, a_hi))
        together = draw(st.booleans())  # every filler arrives with the target: one packed pass
        share = n > 0 and target_lens[target] > 1 and draw(st.booleans())
        fillers = []
        for j, length in enumerate(lengths):
            arrival = target_arrival if together else draw(st.integers(a_lo, a_hi))
            prefix = 0
            if share and j == 0:
                # As the schedule does: the first filler starts with the target's prompt and arrives first.
                prefix = draw(st.integers(1, min(length, target_lens[target])))
                arrival = a_lo
            fillers.append(Filler(seed=draw(st.integers(0, 2**31 - 1)), length=length,
                                  max_tokens=draw(st.integers(m_lo, m_hi)), arrival_step=arrival,
                                  shared_prefix=prefix))
        budget = draw(st.integers(*budgets)) if budgets else None
        return Trial(0, target, position, target_arrival, tuple(fillers), budget, origin="search")

    return trials()


@contextlib.contextmanager
def _no_local_constants() -> Iterator[None]:
    """hypothesis draws, now and then, constants it found in the source of every "local" module in
    `sys.modules` (anything outside site-packages and the standard library): what a search draws would
    then hang on what else the process imported. Off for the search, restored in `finally`; the
    determinism test (tests/unit/test_search.py) notices a hypothesis that draws them elsewhere."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - a hypothesis without local constants
        yield
        return
    get = getattr(providers, "_get_local_constants", None)
    cache = getattr(providers, "CONSTANTS_CACHE", None)
    if get is None or cache is None:  # pragma: no cover
        yield
        return
    empty = providers.Constants()
    providers._get_local_constants = lambda: empty
    providers.CONSTANTS_CACHE = type(cache)(1024)  # the constants drawn so far in the process held apart
    try:
        yield
    finally:
        providers._get_local_constants = get
        providers.CONSTANTS_CACHE = cache


def _score(scores: dict[str, float]) -> None:
    from hypothesis import target

    for label, value in scores.items():
        target(value, label=label)


class _Search:
    """One search's state across its rounds: the trials run, the failing ones, the gap targets, each label's best
    value, and the exception that stopped it."""

    def __init__(self, asked: int, first_id: int, observe: Observe, on_trial: Callable[[Trial, bool], None] | None,
                 seen_trials: Iterable[Trial], prior: Iterable[tuple[Trial, Completion]]) -> None:
        self.asked, self.first_id, self.observe, self.on_trial = asked, first_id, observe, on_trial
        self.shapes = {shape(t) for t in seen_trials}
        self.gaps = {k: _Seen() for k in TARGETS}
        for trial, c in prior:
            for k, v in observe_keys(trial, c).items():
                self.gaps[k].add(v)
        self.ran: list[Trial] = []
        self.failing: list[int] = []
        self.best: dict[str, float] = {}
        self.stopped: list[BaseException] = []
        self.scored: dict[tuple[Any, ...], dict[str, float]] = {}  # shape -> its scores: a shape seen again scores the same

    @property
    def done(self) -> bool:
        return bool(self.stopped) or len(self.ran) >= self.asked

    def one(self, trial: Trial) -> None:
        """One hypothesis example: run the drawn trial (once per shape, never one the schedule ran) and score it."""
        from hypothesis import reject

        if self.done:
            return
        key = shape(trial)
        if key in self.shapes:
            reject()  # the schedule ran it: never again, so the same draw is always rejected
        if key in self.scored:  # hypothesis replays a draw, or draws another of the same shape: no second run
            _score(self.scored[key])
            return
        trial = Trial(self.first_id + len(self.ran), trial.target, trial.position, trial.target_arrival_step,
                      trial.fillers, trial.max_num_batched_tokens, origin="search")
        self.ran.append(trial)
        try:
            c, d = self.observe(trial)
        except BaseException as e:  # noqa: BLE001 - raised again after hypothesis returns, never shrunk by it
            self.stopped.append(e)
            return
        if d is not None:
            self.failing.append(trial.trial_id)
        if self.on_trial is not None:
            self.on_trial(trial, d is not None)
        keys = observe_keys(trial, c)
        scores = {f"{k}: gap to the nearest seen": float(self.gaps[k].gap(v)) for k, v in keys.items()}
        for k, v in keys.items():
            self.gaps[k].add(v)
        scores[ULP_LABEL] = ulp_score(d)
        self.scored[key] = scores
        _score(scores)
        for label, value in [*keys.items(), *scores.items()]:
            self.best[label] = max(self.best.get(label, value), value)


def run_search(cfg: ScheduleConfig, target_lens: Sequence[int], seed: int, observe: Observe, first_id: int,
               seen_trials: Iterable[Trial] = (), prior: Iterable[tuple[Trial, Completion]] = (),
               on_trial: Callable[[Trial, bool], None] | None = None) -> SearchOutcome:
    """Run up to `cfg.search.trials` new trials (ids from `first_id`), steered as the module says.

    `seen_trials`: trials already run (the schedule's), whose shapes are never drawn again; `prior`:
    their outcomes, which the gap targets start from. The search runs in rounds of ROUND trials, each
    one hypothesis run with its own seed: within a round the gap targets are measured against what
    was seen before it (a target must not move while hypothesis climbs it), between rounds they
    take in the round's trials, so the widest gap left is the next round's to climb into. An
    exception from `observe` (an engine error, a signal) stops the search and is raised once
    hypothesis has returned.
    """
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis import seed as hypothesis_seed

    asked = cfg.search.trials
    h_seed = search_seed(seed)
    if asked <= 0 or not target_lens:
        return SearchOutcome(asked, h_seed)
    search = _Search(asked, first_id, observe, on_trial, seen_trials, prior)
    strategy = _trial_strategy(cfg, target_lens)
    idle = 0
    for round_ in range(asked + IDLE_ROUNDS):
        before = len(search.ran)
        # Every setting given, so no loaded profile (a test suite's, hypothesis' "ci") changes the search.
        run = settings(
            max_examples=ROUND, derandomize=False, database=None, deadline=None,
            phases=(Phase.generate, Phase.target), suppress_health_check=list(HealthCheck),
            verbosity=Verbosity.quiet, report_multiple_bugs=False, print_blob=False, stateful_step_count=50,
        )(hypothesis_seed(h_seed + round_)(given(strategy)(search.one)))
        with _no_local_constants():
            run()
        idle = idle + 1 if len(search.ran) == before else 0
        if search.done or idle >= IDLE_ROUNDS:  # rounds that find nothing new: the ranges are spent
            break
    if search.stopped:
        raise search.stopped[0]
    return SearchOutcome(asked, h_seed, tuple(search.ran), tuple(search.failing), dict(sorted(search.best.items())))
