"""shrink, called directly over fake predicates (a function of the trial saying whether it fails): the result
still fails, is never larger, stays within its budget of runs and is the same every time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from oracle.config import ScheduleConfig
from oracle.schedule import Filler, Trial, renumber
from oracle.shrink import ShrinkResult, _candidates, _size, shrink

CFG = ScheduleConfig.model_validate({"batch_size": (1, 16), "filler_len": (1, 40), "filler_max_tokens": (1, 8),
                                     "arrival_step": (0, 3), "max_num_batched_tokens": (16, 256)})


def _start() -> Trial:
    """Batch 12, the target at 6 arriving at step 2, fillers of every kind, a small token budget."""
    fillers = tuple(Filler(seed=100 + j, length=5 + 3 * j, max_tokens=1 + j % 8, arrival_step=j % 4,
                           shared_prefix=2 if j == 3 else 0) for j in range(11))
    return Trial(4, 0, 6, 2, fillers, max_num_batched_tokens=32)


@dataclass
class Recorder:
    """A fake predicate that records every trial it was asked about."""

    fails: Callable[[Trial], bool]
    asked: list[Trial] = field(default_factory=list)

    def __call__(self, t: Trial) -> bool:
        self.asked.append(t)
        return self.fails(t)


def _shrink(fails: Callable[[Trial], bool], start: Trial | None = None, max_runs: int = 500) -> tuple[ShrinkResult,
                                                                                                     Recorder]:
    ids = iter(range(1000, 10**6))
    recorder = Recorder(fails)
    result = shrink(start or _start(), recorder, CFG, max_runs, lambda c, parent: renumber(c, next(ids), parent))
    return result, recorder


def _tokens(t: Trial) -> int:
    return sum(f.length for f in t.fillers)


PREDICATES: dict[str, Callable[[Trial], bool]] = {
    "batch >= 7, target not first": lambda t: t.batch_size >= 7 and t.position >= 1,
    "fillers carry >= 60 prompt tokens": lambda t: _tokens(t) >= 60,
    "a filler shares the target's prefix": lambda t: any(f.shared_prefix for f in t.fillers),
    "a filler arrives after the target": lambda t: any(f.arrival_step > t.target_arrival_step for f in t.fillers),
    "the token budget is under 64": lambda t: (t.max_num_batched_tokens or 10**9) < 64,
    "always": lambda t: True,
}


@pytest.mark.parametrize("name", list(PREDICATES))
def test_the_result_still_fails_and_is_never_larger(name: str) -> None:
    fails = PREDICATES[name]
    start = _start()
    result, asked = _shrink(fails)
    assert result.start == start and fails(result.smallest)
    assert _size(result.smallest) <= _size(start)
    assert result.minimal  # the budget is ample: a whole round found nothing smaller that fails
    assert result.runs == len(asked.asked) == len(result.tried)
    assert result.tried == [t.trial_id for t in asked.asked]
    # No single reduction of the result fails any more (what `minimal` promises).
    smaller = [c for c in _candidates(result.smallest, CFG) if _size(c) < _size(result.smallest)]
    assert not any(fails(c) for c in smaller)


@pytest.mark.parametrize(("name", "batch", "tokens"), [
    ("batch >= 7, target not first", 7, 6),  # six fillers of the range's minimum length
    ("a filler shares the target's prefix", 2, 2),
    ("a filler arrives after the target", 2, 1),
    ("the token budget is under 64", 1, 0),
    ("always", 1, 0),
])
def test_each_fault_shrinks_to_its_smallest_trial(name: str, batch: int, tokens: int) -> None:
    result, _ = _shrink(PREDICATES[name])
    small = result.smallest
    assert (small.batch_size, _tokens(small)) == (batch, tokens)
    assert small.origin == "shrink" and small.parent is not None and small.trial_id in result.tried


def test_a_fault_of_many_tokens_trades_fillers_for_longer_ones() -> None:
    """One filler cannot hold 60 tokens (filler_len's maximum is 40): two, each within the range."""
    result, _ = _shrink(PREDICATES["fillers carry >= 60 prompt tokens"])
    small = result.smallest
    assert small.batch_size == 3 and 60 <= _tokens(small) <= 80
    assert all(1 <= f.length <= 40 and f.max_tokens == 1 and f.arrival_step == 0 for f in small.fillers)


def test_the_kept_fault_conditions_survive_and_the_rest_is_simplified() -> None:
    result, _ = _shrink(PREDICATES["batch >= 7, target not first"])
    small = result.smallest
    assert small.position == 1 and small.target_arrival_step == 0
    assert all(f.length == 1 and f.arrival_step == 0 and f.max_tokens == 1 and f.shared_prefix == 0
               for f in small.fillers)
    assert small.max_num_batched_tokens == 256  # the largest budget: fewest chunks
    assert small.target == 0  # the target is never changed


@pytest.mark.parametrize("max_runs", [0, 1, 2, 5, 17])
def test_the_budget_of_runs_is_respected(max_runs: int) -> None:
    fails = PREDICATES["batch >= 7, target not first"]
    result, asked = _shrink(fails, max_runs=max_runs)
    assert result.runs == len(asked.asked) <= max_runs
    assert fails(result.smallest) and _size(result.smallest) <= _size(_start())
    assert result.minimal is False  # cut short: the smallest found, not a proven minimum
    if max_runs == 0:
        assert result.smallest is result.start and result.tried == []


def test_a_budget_just_large_enough_reaches_the_minimum() -> None:
    fails = PREDICATES["batch >= 7, target not first"]
    full, _ = _shrink(fails)
    again, _ = _shrink(fails, max_runs=full.runs)
    assert again.smallest == full.smallest and again.minimal and again.runs == full.runs
    short, _ = _shrink(fails, max_runs=full.runs - 1)
    assert not short.minimal and short.runs == full.runs - 1


@pytest.mark.parametrize("name", list(PREDICATES))
def test_shrinking_is_deterministic(name: str) -> None:
    first, asked_first = _shrink(PREDICATES[name])
    second, asked_second = _shrink(PREDICATES[name])
    assert first == second
    assert asked_first.asked == asked_second.asked  # the same candidates, in the same order


def test_every_candidate_is_smaller_than_the_trial_it_came_from_and_new() -> None:
    fails = PREDICATES["fillers carry >= 60 prompt tokens"]
    result, asked = _shrink(fails)
    by_id = {t.trial_id: t for t in asked.asked} | {result.start.trial_id: result.start}
    for t in asked.asked:
        assert t.origin == "shrink" and t.parent in by_id
        assert _size(t) < _size(by_id[t.parent])  # type: ignore[index]
    keys = [t.key for t in asked.asked]
    assert len(keys) == len(set(keys)) and result.start.key not in keys  # never the same experiment twice
    # A failing candidate becomes the parent of the next ones: parents only ever move to failing trials.
    assert {t.parent for t in asked.asked} <= {result.start.trial_id} | {t.trial_id for t in asked.asked if fails(t)}


def test_a_trial_with_nothing_to_reduce_is_minimal_at_once() -> None:
    alone = Trial(0, 1, 0, 0, (), max_num_batched_tokens=256)
    result, asked = _shrink(lambda t: True, start=alone)
    assert result.smallest is alone and result.minimal and result.runs == 0 and asked.asked == []


def test_a_trial_whose_every_reduction_passes_is_its_own_minimum() -> None:
    start = _start()
    result, asked = _shrink(lambda t: t.key == start.key, start=start)
    assert result.smallest is start and result.minimal
    assert result.runs == len(asked.asked) > 0
