"""Property-driven search over trials with hypothesis' own engine: find a failing trial, shrink it.

The property is "the target, run inside this trial, equals its solo reference bitwise". The
search draws from the same strategy and seed as the schedule (so, while nothing fails, it runs
exactly the schedule's first trials), keeps failures in a directory example database under the
report folder (replayed first on the next run), and shrinks the first failure to a minimal
trial within a budget of engine runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.database import DirectoryBasedExampleDatabase

from oracle.errors import OracleError
from oracle.schedule import Trial

# Trial fields -> did it diverge; the same fields are never run twice.
TrialCheck = Callable[[Trial], bool]


class _Diverged(AssertionError):
    pass


@dataclass
class SearchResult:
    minimal: Trial | None = None  # the smallest failing trial found, if any
    first_failure: Trial | None = None
    runs: int = 0
    shrink_runs: int = 0
    replayed_from_database: bool = False
    notes: list[str] = field(default_factory=list)


def search(
    strategy: Any, check: TrialCheck, *, seed: int, max_examples: int, max_shrink_runs: int,
    database_dir: Path | None, first_trial_id: int,
) -> SearchResult:
    """Run `check` over trials drawn by hypothesis until one diverges; shrink it; return the minimal one."""
    result = SearchResult()
    failing: list[Trial] = []
    engine_error: list[OracleError] = []
    next_id = [first_trial_id]

    # settings above seed: @seed alone turns the example database off.
    @settings(
        max_examples=max_examples, deadline=None, suppress_health_check=list(HealthCheck),
        database=DirectoryBasedExampleDatabase(str(database_dir)) if database_dir else None,
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink], verbosity=Verbosity.quiet,
        report_multiple_bugs=False, print_blob=False,
    )
    @hypothesis_seed(seed)
    @given(strategy)
    def invariant_equals_solo(fields: dict[str, Any]) -> None:
        trial = Trial(trial_id=next_id[0], **fields)
        if engine_error:
            return
        if failing and result.shrink_runs >= max_shrink_runs:
            # Budget spent: only the smallest failure found so far still fails, so hypothesis stops there.
            if _same(trial, failing[-1]):
                raise _Diverged()
            return
        next_id[0] += 1
        if failing:
            result.shrink_runs += 1
        else:
            result.runs += 1
        try:
            diverged = check(trial)
        except OracleError as e:
            # Not a divergence: stop the search and re-raise it outside hypothesis.
            engine_error.append(e)
            raise _Diverged() from e
        if diverged:
            if not failing:
                result.first_failure = trial
            if not failing or not _same(trial, failing[-1]):
                failing.append(trial)
            raise _Diverged()

    try:
        invariant_equals_solo()
    except _Diverged:
        pass
    except Exception as e:  # noqa: BLE001 - hypothesis' Flaky (maybe grouped): a trial diverged once only
        if not engine_error:
            result.notes.append(f"hypothesis: {type(e).__name__}: {str(e).splitlines()[0]}")
    if engine_error:
        raise engine_error[0]
    if failing:
        result.minimal = failing[-1]
        result.replayed_from_database = result.runs == 1 and database_dir is not None
    return result


def _same(a: Trial, b: Trial) -> bool:
    return _key(a) == _key(b)


def _key(t: Trial) -> tuple[Any, ...]:
    return (t.target, t.position, t.target_arrival_step, t.fillers, t.max_num_batched_tokens)


trial_key = _key
