"""The schedule: N distinct trials from a seed alone, covering the ranges real engines key kernels on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from oracle.config import ScheduleConfig
from oracle.schedule import draw_schedule, filler_tokens

TINY = ScheduleConfig(trials=50, batch_size=(1, 17), filler_len=(1, 40), filler_max_tokens=(1, 10),
                      arrival_step=(0, 2), max_num_batched_tokens=(48, 256))
TARGET_LENS = [8, 12, 17, 20, 25, 31, 36, 40]


@pytest.mark.parametrize("trials", [1, 7, 50, 400])
@pytest.mark.parametrize("seed", [0, 1, 123456])
def test_n_trials_are_n_distinct_trials(trials: int, seed: int) -> None:
    cfg = TINY.model_copy(update={"trials": trials})
    schedule = draw_schedule(cfg, TARGET_LENS, seed)
    assert len(schedule) == trials
    assert len({t.key for t in schedule}) == trials
    assert [t.trial_id for t in schedule] == list(range(trials))


def test_schedule_covers_targets_positions_sizes_and_prefixes() -> None:
    schedule = draw_schedule(TINY, TARGET_LENS, seed=5)
    assert {t.target for t in schedule} == set(range(len(TARGET_LENS)))
    batched = [t for t in schedule if t.batch_size > 2]
    assert any(t.position == 0 for t in batched) and any(t.position == t.batch_size - 1 for t in batched)
    assert any(0 < t.position < t.batch_size - 1 for t in batched)
    assert {1, 2, 15, 16, 17} <= {t.batch_size for t in schedule}
    sizes = sorted(t.batch_size for t in schedule)
    assert sizes[len(sizes) // 4] <= 4 and sizes[3 * len(sizes) // 4] >= 8  # log spread: small and large
    budgets = {t.max_num_batched_tokens for t in schedule}
    assert min(budgets) < 64 and max(budgets) > 160  # type: ignore[type-var]
    shared = [t for t in schedule if any(f.shared_prefix for f in t.fillers)]
    assert shared, "some fillers must start with the target's prompt (prefix-cache hits inside a trial)"
    for t in shared:
        f = next(f for f in t.fillers if f.shared_prefix)
        assert f.arrival_step < t.target_arrival_step  # it arrives first, so its blocks are cached
    timings = {(min(f.arrival_step for f in t.fillers) > t.target_arrival_step) for t in schedule if t.fillers}
    assert timings == {True, False}  # fillers arriving after the target (mixed passes) and not


def test_filler_starts_with_the_targets_prompt() -> None:
    schedule = draw_schedule(TINY, TARGET_LENS, seed=5)
    t = next(t for t in schedule if any(f.shared_prefix for f in t.fillers))
    f = next(f for f in t.fillers if f.shared_prefix)
    target = tuple(range(100, 100 + TARGET_LENS[t.target]))
    tokens = filler_tokens(f, 1000, target)
    assert len(tokens) == f.length and tokens[: f.shared_prefix] == target[: f.shared_prefix]


def test_narrow_ranges_give_as_many_distinct_trials_as_exist() -> None:
    cfg = ScheduleConfig(trials=10, batch_size=(1, 1))
    assert len(draw_schedule(cfg, [4], seed=0)) == 1  # one target alone: one experiment


_SCRIPT = """
import json, sys
for m in sys.argv[2:]:
    __import__(m)
from oracle.config import ScheduleConfig
from oracle.schedule import draw_schedule
cfg = ScheduleConfig(trials=50, batch_size=(1, 17), filler_len=(1, 40), arrival_step=(0, 2))
print(json.dumps([t.to_json() for t in draw_schedule(cfg, [8, 20, 33], int(sys.argv[1]))]))
"""


def test_same_seed_same_schedule_whatever_else_is_imported(tmp_path: Path) -> None:
    def draw(*modules: str) -> list[dict]:  # type: ignore[type-arg]
        out = subprocess.run([sys.executable, "-c", _SCRIPT, "77", *modules], cwd=tmp_path,
                             capture_output=True, text=True, check=True)
        return json.loads(out.stdout)  # type: ignore[no-any-return]

    plain = draw()
    assert draw("numpy", "yaml", "rich", "oracle.engines.native", "_pytest.python") == plain
    assert plain == [json.loads(json.dumps(t.to_json())) for t in draw_schedule(ScheduleConfig(
        trials=50, batch_size=(1, 17), filler_len=(1, 40), arrival_step=(0, 2)), [8, 20, 33], 77)]
    assert not (tmp_path / ".hypothesis").exists()
