"""What one mode's execution produced, frozen: the judge reads it, a shard's results file carries it.

Declared apart from `oracle.execute` so that the checks (oracle.checks) read it without the execution, and
the execution hands its checks a context (oracle.checks.base.CheckContext) without the checks' verdicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from oracle.engines.contract import Completion, Mode
from oracle.schedule import Trial
from oracle.search import SearchOutcome
from oracle.shrink import ShrinkResult


@dataclass(frozen=True)
class InstanceRun:
    """What a second, separately started engine of the same mode gave (cross_instance): every reference
    and the first trials of the schedule, with its self-description."""

    engine: Mapping[str, Any] = field(default_factory=dict)
    solo: Mapping[int, Completion] = field(default_factory=dict)
    trials: Mapping[int, Completion] = field(default_factory=dict)
    note: str = ""  # why it could not run, or why it is not a second instance
    localized: dict[str, Any] | None = None  # tp_parity: where the sizes part (a LocalizedOp's JSON)
    localize_note: str = ""  # tp_parity: why no op was named


@dataclass(frozen=True)
class ModeResult:
    """Everything one mode produced, target outputs only. Read-only once the mode has run."""

    mode: Mode
    engine: Mapping[str, Any] = field(default_factory=dict)
    solo: Mapping[int, Completion] = field(default_factory=dict)  # target -> its solo run
    trials: Mapping[int, Completion] = field(default_factory=dict)  # trial id -> the target's outputs
    repeats: Mapping[int, Completion] = field(default_factory=dict)  # trial id -> the same trial again
    shrink: ShrinkResult | None = None
    shrink_trials: tuple[Trial, ...] = ()  # candidates the shrinker ran (ids after the schedule's)
    # trial id, ("prefill", target, step) or ("prefix", target) -> LocalizedOp, or a note why not
    localized: Mapping[Any, Any] = field(default_factory=dict)
    localize_notes: tuple[str, ...] = ()
    seconds: float = 0.0
    search: SearchOutcome | None = None  # the guided search (schedule.search), invariant mode
    search_trials: tuple[Trial, ...] = ()  # its trials (ids after the schedule's and the replayed ones)
    timings: Mapping[str, float] = field(default_factory=dict)  # phase -> seconds (oracle.timings)
    # check name -> what the check's own runs gave (its row's `CheckRun`: prefill_decode, prefix_cache, ...)
    checks: Mapping[str, Any] = field(default_factory=dict)
    # Before a failing invariant trial is blamed on the batch (oracle.execute.RECHECKED): trial id -> the trial
    # run again as is, and target -> its solo run again. Either moving is run-to-run nondeterminism.
    reruns: Mapping[int, Completion] = field(default_factory=dict)
    solo_again: Mapping[int, Completion] = field(default_factory=dict)
