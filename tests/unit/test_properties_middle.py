"""Properties of the pure middle over hypothesis-drawn inputs: the schedule (N distinct trials within the
drawn ranges), config round trips, the shrinker (the result still fails and is never larger) and the
judge table over drawn frozen results (invariance fails exactly where a drawn trial differs)."""

from __future__ import annotations

from types import MappingProxyType

import yaml
from hypothesis import given
from hypothesis import strategies as st

from oracle.checks.base import Runs
from oracle.checks.invariance import invariance
from oracle.config import ScheduleConfig, parse_config
from oracle.engines.contract import Completion, StepEvidence
from oracle.judge import coverage
from oracle.mode_result import ModeResult
from oracle.prompts import Target
from oracle.schedule import Filler, Trial, draw_schedule, renumber
from oracle.shrink import _size, shrink


def _range(lo: int, hi: int) -> st.SearchStrategy[tuple[int, int]]:
    return st.tuples(st.integers(lo, hi), st.integers(lo, hi)).map(lambda t: (min(t), max(t)))


schedules = st.builds(
    lambda trials, batch, flen, fmax, arrival, budget, seed: ScheduleConfig(
        trials=trials, batch_size=batch, filler_len=flen, filler_max_tokens=fmax, arrival_step=arrival,
        max_num_batched_tokens=budget, seed=seed),
    st.integers(1, 60), _range(1, 40), _range(1, 64), _range(1, 16), _range(0, 4), st.none() | _range(8, 512),
    st.none() | st.integers(0, 2**32),
)
target_lens = st.lists(st.integers(1, 48), min_size=1, max_size=6)


@given(schedules, target_lens, st.integers(0, 2**32))
def test_the_schedule_is_n_distinct_trials_within_the_ranges(cfg: ScheduleConfig, lens: list[int], seed: int) -> None:
    trials = draw_schedule(cfg, lens, seed)
    assert trials == draw_schedule(cfg, lens, seed)  # the seed alone decides
    assert [t.trial_id for t in trials] == list(range(len(trials)))
    assert len({t.key for t in trials}) == len(trials) <= cfg.trials
    if cfg.batch_size[1] >= 2:
        assert len(trials) == cfg.trials  # fillers (seeded apart) leave room for N distinct trials: N of them
    for t in trials:
        assert cfg.batch_size[0] <= t.batch_size <= cfg.batch_size[1] and 0 <= t.position < t.batch_size
        assert 0 <= t.target < len(lens)
        for f in t.fillers:
            assert f.shared_prefix <= f.length and cfg.filler_max_tokens[0] <= f.max_tokens <= cfg.filler_max_tokens[1]
            assert cfg.arrival_step[0] <= f.arrival_step <= cfg.arrival_step[1]
            assert f.length <= max(cfg.filler_len[1], lens[t.target])
        if cfg.max_num_batched_tokens:
            lo, hi = cfg.max_num_batched_tokens
            assert t.max_num_batched_tokens is not None and lo <= t.max_num_batched_tokens <= hi


@given(schedules, st.integers(0, 500))
def test_config_round_trips_through_yaml_and_json(cfg: ScheduleConfig, search: int) -> None:
    cfg = cfg.model_copy(update={"search": cfg.search.model_copy(update={"trials": search})})
    data = {"model": "preset:tiny-qwen3", "prompts": {"random": {"count": 2}}, "schedule": cfg.model_dump(mode="json")}
    config = parse_config(data)
    again = parse_config(yaml.safe_load(yaml.safe_dump(config.model_dump(mode="json"))))
    assert again == config and again.digest() == config.digest()
    assert again.schedule.search.trials == search


fillers = st.builds(Filler, seed=st.integers(0, 2**31 - 1), length=st.integers(1, 40), max_tokens=st.integers(1, 16),
                    arrival_step=st.integers(0, 3), shared_prefix=st.integers(0, 4))
trials = st.builds(lambda fs, pos, arr, budget: Trial(0, 0, min(pos, len(fs)), arr, tuple(fs), budget),
                   st.lists(fillers, min_size=0, max_size=12), st.integers(0, 12), st.integers(0, 3),
                   st.none() | st.integers(8, 512))


@given(trials, st.integers(1, 13), st.integers(1, 300), st.integers(0, 60))
def test_the_shrinker_returns_a_failing_trial_never_larger(start: Trial, min_batch: int, min_tokens: int,
                                                           budget: int) -> None:
    """A drawn fault: the trial fails when its batch and its fillers' tokens reach drawn thresholds."""
    def fails(t: Trial) -> bool:
        return t.batch_size >= min_batch and sum(f.length for f in t.fillers) >= min_tokens

    cfg = ScheduleConfig(filler_len=(1, 40), filler_max_tokens=(1, 16), arrival_step=(0, 3),
                         max_num_batched_tokens=(8, 512))
    if not fails(start):
        return
    ids = iter(range(1, 10**6))
    result = shrink(start, fails, cfg, budget, lambda c, parent: renumber(c, next(ids), parent))
    assert fails(result.smallest) and _size(result.smallest) <= _size(start)
    assert result.runs <= budget and len(result.tried) == result.runs
    if result.minimal and min_tokens <= 40:  # one filler can carry the tokens: batch 2 at most, or the threshold
        assert result.smallest.batch_size <= max(2, min_batch)


def _completion(tokens: list[int], lps: list[float], batch: int) -> Completion:
    return Completion("r", list(tokens), list(lps),
                      evidence=[StepEvidence(i, batch, batch, i == 0, token_index=i) for i in range(len(tokens))])


@st.composite
def frozen_results(draw: st.DrawFn) -> tuple[Runs, set[int]]:
    n_targets = draw(st.integers(1, 3))
    steps = draw(st.integers(1, 5))
    solos = {i: _completion(draw(st.lists(st.integers(0, 96), min_size=steps, max_size=steps)),
                            [-1.0 - 0.125 * j for j in range(steps)], 1) for i in range(n_targets)}
    n = draw(st.integers(1, 12))
    ts = {tid: Trial(tid, draw(st.integers(0, n_targets - 1)), 0, 0,
                     (Filler(seed=tid, length=3, max_tokens=2, arrival_step=0),)) for tid in range(n)}
    bad = set(draw(st.sets(st.integers(0, n - 1))))
    outs = {}
    for tid, t in ts.items():
        solo = solos[t.target]
        lps = list(solo.logprobs)
        if tid in bad:
            j = draw(st.integers(0, steps - 1))
            lps[j] = lps[j] + 2.0**-20
        outs[tid] = _completion(solo.token_ids, lps, 2)
    config = parse_config({"model": "preset:tiny-qwen3", "prompts": {"random": {"count": n_targets}}})
    inv = ModeResult("invariant", solo=MappingProxyType(solos), trials=MappingProxyType(outs))
    targets = tuple(Target(f"t{i}", (1, 2, 3)) for i in range(n_targets))
    return Runs(config, targets, ts, inv, None, {}), bad


@given(frozen_results())
def test_invariance_fails_exactly_on_the_drawn_differences(drawn: tuple[Runs, set[int]]) -> None:
    runs, bad = drawn
    judged = invariance(runs, "required")
    assert judged.result.verdict == ("fail" if bad else "pass")
    assert judged.result.divergent == len(bad) and judged.result.trials == len(runs.trials)
    assert {d.trial_id for d in judged.divergences} == bad
    assert all(d.kind == "logprob" and d.ulp is not None and d.ulp > 0 for d in judged.divergences)
    assert coverage(runs)["trials run"] == len(runs.trials)


@given(lengths=st.lists(st.tuples(st.integers(0, 6), st.integers(1, 64)), min_size=1, max_size=60),
       count=st.integers(1, 9), repeats=st.integers(0, 10), max_tokens=st.integers(1, 32))
def test_shards_deal_every_trial_exactly_once_in_balance(lengths: list[tuple[int, int]], count: int, repeats: int,
                                                         max_tokens: int) -> None:
    """Over drawn schedules and shard counts: the shards partition the trial ids (merged = the whole schedule),
    each shard's load is within one trial's cost of every other's, and the deal is a function of the schedule."""
    from oracle.shards.assign import assign, trial_cost

    targets = (Target("t", (1, 2, 3)),)
    trials = [Trial(i, 0, 0, 0, tuple(Filler(i * 10 + j, n, 2, 0) for j in range(f))) for i, (f, n) in enumerate(lengths)]
    parts = assign(trials, targets, max_tokens, repeats, count)
    assert len(parts) == count and sorted(i for p in parts for i in p) == list(range(len(trials)))
    cost = {t.trial_id: trial_cost(t, targets, max_tokens, t.trial_id < repeats) for t in trials}
    loads = [sum(cost[i] for i in p) for p in parts]
    assert max(loads) - min(loads) <= max(cost.values())
    assert assign(list(reversed(trials)), targets, max_tokens, repeats, count) == parts or repeats > 0
