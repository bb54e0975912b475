"""A check's narrow view of a mode's execution (`oracle.checks.base.CheckContext`), as `oracle.execute` hands it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oracle.checks.base import CheckContext, CheckRun
from oracle.engine_calls import fresh, generate
from oracle.engines.contract import (
    Completion,
    Engine,
    Mode,
    Request,
    ResetsPrefixCache,
    RunSpec,
    capabilities,
)
from oracle.mode_result import InstanceRun
from oracle.plan import Plan
from oracle.schedule import Trial


class ExecutionContext:
    """One check's view of a mode's execution (oracle.checks.base.CheckContext): what its runs may use."""

    def __init__(self, execution: Any, name: str, own: CheckRun) -> None:  # an oracle.execute.ModeExecution
        self._ex, self._name, self._phase = execution, name, own.phase or name

    @property
    def mode(self) -> Mode:
        return self._ex.mode

    @property
    def plan(self) -> Plan:
        return self._ex.plan

    @property
    def solo(self) -> Mapping[int, Completion]:
        return self._ex.solo

    @property
    def describe(self) -> Mapping[str, Any]:
        return self._ex.describe

    @property
    def per_target(self) -> bool:
        return self._ex.per_target

    @property
    def schedule(self) -> Sequence[Trial]:
        shard = self._ex.shard
        return shard.schedule if shard is not None else self._ex.plan.trials

    def _engine(self) -> Engine:
        assert self._ex.engine is not None
        return self._ex.engine

    def can_reset_prefix_cache(self) -> bool:
        engine = self._engine()
        return capabilities(engine).reset_prefix_cache and isinstance(engine, ResetsPrefixCache)

    def reset_prefix_cache(self) -> None:
        engine = self._engine()
        assert isinstance(engine, ResetsPrefixCache)
        engine.reset_prefix_cache()

    def fresh(self, requests: Sequence[Request]) -> list[Completion]:
        return fresh(self._engine(), requests, phase=self._phase)

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        return generate(self._engine(), requests, phase=self._phase)

    def keep(self, data: Any) -> None:
        self._ex.checks[self._name] = data

    def advance(self) -> None:
        self._ex.observer.advance(self._ex.divergent)

    def localize(self, key: Any, expected: RunSpec, actual: RunSpec) -> None:
        self._ex.localize(key, expected, actual)

    def build_second(self) -> Engine:
        return self._ex.build_second(self._ex.mode)

    def run_again(self, label: str, build: Callable[[], Engine], trials: Sequence[Trial],
                  keep: Callable[[InstanceRun], None],
                  then: Callable[[Engine, InstanceRun], InstanceRun] | None = None) -> None:
        self._ex.run_again(label, build, trials, keep, then)

    def repro_dir(self, name: str) -> Path | None:
        folder = getattr(self._ex.localizer, "folder", None)
        return folder.parent / f"repro-{name}" if isinstance(folder, Path) else None


if TYPE_CHECKING:
    _: type[CheckContext] = ExecutionContext  # the context meets the protocol the checks are written against
