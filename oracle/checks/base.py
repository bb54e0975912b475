"""What every check shares: the results it reads (`Runs`), what it returns (`Judged`, `record`), its row (`Check`),
the runs it may make of its own (`CheckRun`) and the narrow context those runs are handed (`CheckContext`).

A check module (oracle/checks/NAME.py) holds its verdict function, its runs if it has any, and `ROW`;
`oracle.judge.CHECKS` lists the rows. Nothing here runs an engine: the execution (oracle.execute) implements
`CheckContext` for a check's runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from oracle.compare import Divergence
from oracle.config import Config
from oracle.engines.contract import Completion, Engine, LocalizedOp, Mode, Request, RunSpec
from oracle.engines.kinds import EngineKind
from oracle.mode_result import InstanceRun, ModeResult
from oracle.plan import Plan
from oracle.prompts import Target
from oracle.report import Cause, CheckResult, DivergenceRecord, TrialRecord
from oracle.schedule import Trial

INV: tuple[Mode, ...] = ("invariant",)
PROD: tuple[Mode, ...] = ("production",)
BOTH: tuple[Mode, ...] = ("invariant", "production")

# The views' divergence sections, in the order they are shown: a check that writes divergence records names one.
INVARIANT_SECTION = "invariant-mode divergences"
DRIFT_SECTION = "production-mode divergences (drift)"
SECTIONS = (INVARIANT_SECTION, DRIFT_SECTION)


@dataclass(frozen=True)
class Runs:
    """What the checks read: the plan's data and both modes' frozen results (either may be missing)."""

    config: Config
    targets: tuple[Target, ...]
    trials: Mapping[int, Trial]  # every trial run: the schedule's and the shrinker's
    inv: ModeResult | None
    prod: ModeResult | None
    environment: Mapping[str, Any]
    golden: Mapping[str, Any] | None = None
    unformed_probes: tuple[tuple[str, str], ...] = ()  # (`probe:side`, the limit that ruled it out)
    engine_kind: EngineKind | None = None  # the engine kind's row, as the plan resolved it

    def mode(self, name: str) -> ModeResult | None:
        return self.inv if name == "invariant" else self.prod

    @property
    def engine(self) -> EngineKind | None:
        """The engine kind's row: the plan's, else a built-in or installed kind's (a `module:Class` a report names
        is not imported to judge it: None)."""
        if self.engine_kind is not None:
            return self.engine_kind
        from oracle.engines.kinds import known_row

        return known_row(self.config.engine.kind)

    @property
    def judged_ids(self) -> list[int]:
        """Trials judged against the solo run: the schedule's, the replayed ones and the search's (not the
        shrinker's candidates, which its own evidence reports)."""
        return [i for i, t in self.trials.items() if t.origin != "shrink"]


@dataclass(frozen=True)
class Judged:
    result: CheckResult
    divergences: tuple[DivergenceRecord, ...] = ()


def record(runs: Runs, check: str, mode: str, trial: Trial | None, target: int, actual: Completion,
           d: Divergence, cause: Cause = "batch", localized: LocalizedOp | None = None,
           **extra: Any) -> DivergenceRecord:
    margin = d.reference_margin
    if d.sampler and cause in ("batch", "nondeterminism"):
        cause = "sampling"  # the logits agree bitwise: the sampler (RNG, top-k/top-p) picked another token
    ev = next((e for e in actual.evidence if e.token_index == d.step), None)
    return DivergenceRecord(
        check=check, mode=mode, target=runs.targets[target].name,  # type: ignore[arg-type]
        trial_id=trial.trial_id if trial else None,
        trial=TrialRecord.model_validate(trial.to_json()) if trial else None,
        request_id=actual.request_id, step=d.step, kind=d.kind,  # type: ignore[arg-type]
        expected_token=d.expected_token, actual_token=d.actual_token,
        expected_logprob=d.expected_logprob, actual_logprob=d.actual_logprob, ulp=d.ulp,
        max_abs_logits_diff=d.max_abs_logits_diff, reference_margin=margin,
        near_tie=None if margin is None else margin < runs.config.checks.fidelity.near_tie,
        first_token_step=d.first_token_step, cause=cause,
        evidence={**(asdict(ev) if ev else {}), **extra}, localized_op=localized,
    )


def within(value: float | None, tolerance: float, strict: bool = False) -> bool:
    """value <= tolerance (< when strict) for a finite value; NaN, infinities and None are never within."""
    if value is None or not math.isfinite(value):
        return False
    return value < tolerance if strict else value <= tolerance


class CheckContext(Protocol):
    """What a check's own runs may use of a mode's execution, and nothing else.

    `fresh` and `generate` run on the mode's engine (a cold prefix cache first for `fresh`); a hang's message
    names the check's phase. `keep` stores what the check ran (its row's `data` type) as it goes, so an engine
    that dies part way leaves what completed. `run_again` starts an engine of the check's own (after the mode's
    has closed) and runs every reference and `trials` on it."""

    @property
    def mode(self) -> Mode: ...

    @property
    def plan(self) -> Plan: ...

    @property
    def solo(self) -> Mapping[int, Completion]: ...  # the references: target -> its solo run

    @property
    def describe(self) -> Mapping[str, Any]: ...  # the mode's engine's self-description

    @property
    def per_target(self) -> bool: ...  # False in a shard other than 0 (which leaves per-target checks to 0)

    @property
    def schedule(self) -> Sequence[Trial]: ...  # the whole schedule's trials, also in a shard (of which it runs a slice)

    def can_reset_prefix_cache(self) -> bool: ...

    def reset_prefix_cache(self) -> None: ...

    def fresh(self, requests: Sequence[Request]) -> list[Completion]: ...

    def generate(self, requests: Sequence[Request]) -> list[Completion]: ...

    def keep(self, data: Any) -> None: ...

    def advance(self) -> None: ...  # one progress step

    def localize(self, key: Any, expected: RunSpec, actual: RunSpec) -> None: ...

    def build_second(self) -> Engine: ...  # the mode's engine, started again separately

    def run_again(self, label: str, build: Callable[[], Engine], trials: Sequence[Trial],
                  keep: Callable[[InstanceRun], None],
                  then: Callable[[Engine, InstanceRun], InstanceRun] | None = None) -> None: ...

    def repro_dir(self, name: str) -> Path | None: ...  # the report folder's repro-NAME/ (None: no report folder)


@dataclass(frozen=True)
class CheckRun:
    """What a check runs of its own in a mode's execution, beside the schedule's trials; the execution runs it
    when the check is on.

    `run(context)` keeps what it ran through `context.keep`, of type `data`: a shard's results write and read it
    by that type (oracle.shards.results). `wanted(context)`: whether it runs in this mode (and shard). On the
    mode's engine once its trials are done, a hang there named `phase`; or with `after_close` once that engine
    has closed (a check that starts engines of its own). Timed as `timed_as` (the check's name when empty).
    `units`: the progress steps it adds to the mode's (0: it shows none)."""

    data: Any
    run: Callable[[CheckContext], None]
    wanted: Callable[[CheckContext], bool]
    after_close: bool = False
    phase: str = ""
    timed_as: str = ""
    units: Callable[[CheckContext], int] = lambda context: 0


def invariant_per_target(context: CheckContext) -> bool:
    """Invariant mode, and not a shard other than 0 (which leaves the per-target checks to shard 0)."""
    return context.mode == "invariant" and context.per_target


CheckFn = Callable[[Runs, str], Judged]


@dataclass(frozen=True)
class Check:
    """A check's row: its name (its field of `checks:`), its function, the modes it cannot be judged without,
    the modes a run must execute for it, and the runs it makes of its own beside the schedule's trials.

    `section`: the views' divergence section its records are listed in ("" for a check that writes none).
    `applies(runs)`: judged at all (golden: only with a golden file read). `self_compared`: it compares one
    mode's engine against the other's, so with one server for both it says so (vacuous). `reads_also(config)`:
    modes a run must execute that depend on the check's options."""

    name: str
    judge: CheckFn
    needs: tuple[Mode, ...]
    reads: tuple[Mode, ...]
    runs: CheckRun | None = None
    section: str = ""
    applies: Callable[[Runs], bool] = lambda runs: True
    self_compared: bool = False
    reads_also: Callable[[Config], tuple[Mode, ...]] = lambda config: ()
