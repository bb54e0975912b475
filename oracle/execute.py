"""execute: run one mode's share of a plan on one engine; the result is frozen data for the judge.

Each mode gets its own engine, built once and closed before the next (a process-wide mode such
as vLLM's never shares a process with the other). Every engine call starts from a cold prefix
cache, so a trial's outcome never hangs on the trials before it; warm caches are exercised
inside trials (fillers that share the target's prefix and arrive first) and by the
prefix_cache check.

In invariant mode the first failing trials are run again as is, and their targets alone again, before
the batch is blamed (`RECHECKED`): either moving is run-to-run nondeterminism, and such a trial is never
shrunk. The first failing trial that reproduced is shrunk (oracle.shrink); every candidate the shrinker
runs is a trial of this run (origin `shrink`) and lands in the report with the rest.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from oracle.check_context import ExecutionContext
from oracle.checks.base import CheckRun
from oracle.compare import Divergence, first_divergence, row_digest
from oracle.engine_calls import Localizer, _step, fresh, keep_rows
from oracle.engine_calls import generate as generate  # re-exported: the runner and bench call it from here
from oracle.engines.contract import (
    CAPTURE_HOW,
    Completion,
    Engine,
    Mode,
    RunSpec,
    localize_parts,
    start_parts,
)
from oracle.errors import EngineError, OracleError
from oracle.mode_result import InstanceRun, ModeResult
from oracle.observer import Observer
from oracle.plan import Plan, solo_request, trial_requests
from oracle.schedule import Trial
from oracle.search import SearchOutcome
from oracle.shrink import ShrinkResult, shrink

if TYPE_CHECKING:
    from oracle.shards.assign import Shard
from oracle.timings import PhaseClock

# Failing invariant trials run again (and their targets alone again) before the batch is blamed for them.
RECHECKED = 8


class ModeExecution:
    """Runs one mode; what completed is kept, so an engine failure or a signal still leaves results."""

    def __init__(self, plan: Plan, mode: Mode, observer: Observer, build: Callable[[Mode], Engine],
                 localizer: Localizer | None = None, build_second: Callable[[Mode], Engine] | None = None, *,
                 check_runs: Mapping[str, CheckRun], shard: Shard | None = None) -> None:
        """`check_runs`: the enabled checks' own runs by check name (`oracle.judge.check_runs`), in order.
        `shard`: the slice of the schedule the plan's trials are (`oracle run --shard`), None unsharded."""
        self.plan, self.mode, self.observer, self.build, self.localizer = plan, mode, observer, build, localizer
        self.shard = shard
        # The cross_instance check's second engine of this mode (the same builder when not given).
        self.build_second = build_second or build
        self.checks: dict[str, Any] = {}
        self.contexts = {name: ExecutionContext(self, name, r) for name, r in check_runs.items()}
        self.check_runs = {name: r for name, r in check_runs.items() if r.wanted(self.contexts[name])}
        self.engine: Engine | None = None
        self.describe: dict[str, Any] = {}
        self.solo: dict[int, Completion] = {}
        self.trials: dict[int, Completion] = {}
        self.repeats: dict[int, Completion] = {}
        self.reruns: dict[int, Completion] = {}
        self.solo_again: dict[int, Completion] = {}
        self.shrink: ShrinkResult | None = None
        self.shrink_trials: list[Trial] = []
        self.localized: dict[Any, Any] = {}
        # While requests remain to run: the localizations asked for, run after the last (`_run_phases`).
        self._deferred: list[tuple[Any, RunSpec, RunSpec, str | None]] | None = None
        self.localize_notes: list[str] = []
        self.seconds = 0.0
        self.search: SearchOutcome | None = None
        self.search_trials: list[Trial] = []
        self.divergent = 0
        self.clock = PhaseClock()

    def result(self) -> ModeResult:
        ro = MappingProxyType
        return ModeResult(
            self.mode, ro(dict(self.describe)), ro(dict(self.solo)), ro(dict(self.trials)), ro(dict(self.repeats)),
            self.shrink, tuple(self.shrink_trials), ro(dict(self.localized)), tuple(self.localize_notes),
            self.seconds, search=self.search, search_trials=tuple(self.search_trials),
            timings=ro(dict(self.clock.seconds)), checks=ro(dict(self.checks)),
            reruns=ro(dict(self.reruns)), solo_again=ro(dict(self.solo_again)),
        )

    def run_trial(self, trial: Trial, repeated: bool = False) -> Divergence | None:
        """Run a trial and compare its target with the solo run as it comes; keep what the judge needs:
        every row's digest and the row at the first divergence. A trial whose repeat is to come keeps
        every row that differs from the solo's (the others are the solo's rows, bit for bit)."""
        assert self.engine is not None
        requests, at = trial_requests(self.plan, trial)
        out = fresh(self.engine, requests, trial.max_num_batched_tokens)[at]
        solo = self.solo[trial.target]
        d = first_divergence(solo, out)
        keep: list[int | None] = [_step(d)]
        if repeated and out.logits is not None:
            ref = solo.logits_digests or []
            keep += [i for i, row in enumerate(out.logits) if i >= len(ref) or row_digest(row) != ref[i]]
        self.trials[trial.trial_id] = keep_rows(out, keep)
        return d

    def diverges(self, trial: Trial, repeated: bool = False) -> bool:
        return self.run_trial(trial, repeated) is not None

    def run_repeat(self, trial: Trial) -> None:
        """The trial again; then both keep their rows only where a divergence reads them."""
        assert self.engine is not None
        requests, at = trial_requests(self.plan, trial)
        again = fresh(self.engine, requests, trial.max_num_batched_tokens)[at]
        again = keep_rows(again, range(len(again.token_ids)))  # digests made as the trial's were
        first, solo = self.trials[trial.trial_id], self.solo[trial.target]
        d_rep = _step(first_divergence(first, again))
        d_solo = _step(first_divergence(solo, first))
        if first.logits is not None and d_rep is not None and d_rep < len(first.logits) \
                and first.logits[d_rep] is None and solo.logits is not None:
            rows = list(first.logits)
            rows[d_rep] = solo.logits[d_rep]  # not kept because bitwise the solo's (same digest)
            first = replace(first, logits=rows)
        self.repeats[trial.trial_id] = keep_rows(again, (d_rep,))
        self.trials[trial.trial_id] = keep_rows(first, (d_solo, d_rep))

    @property
    def per_target(self) -> bool:
        """A shard other than 0 leaves the per-target checks to shard 0; shards leave shrinking to the merge."""
        return self.shard is None or self.shard.runs_per_target_checks

    @property
    def _judges_invariance(self) -> bool:
        """Invariant mode with invariance on: it replays the example database, searches and shrinks."""
        return self.mode == "invariant" and self.plan.config.checks.invariance.requirement != "off"

    def run(self) -> None:
        plan = self.plan
        to_repeat = repeated_trials(plan, self.shard)
        units = sum(r.units(self.contexts[name]) for name, r in self.check_runs.items() if not r.after_close)
        replayed = plan.replayed if self._judges_invariance else ()  # failing trials of earlier runs, first
        self.observer.phase(self.mode, len(plan.targets) + len(replayed) + len(plan.trials) + len(to_repeat)
                            + units)
        t0 = time.perf_counter()
        clock = self.clock.phase
        with clock("engine_start"):
            try:
                self.engine = self.build(self.mode)  # once per run and mode; trials reset its prefix cache (fresh)
            except EngineError as e:
                if type(e) is not EngineError or any(f"{self.mode} {w}" in str(e) for w in ("engine", "mode")):
                    raise
                raise EngineError(f"{self.mode} mode's engine did not start: {e}") from e  # which mode failed
            self.describe = self.engine.describe()
        # TimesItsStart: the parts of the start it measured, beside the whole (`{mode}_engine_start_{part}_s`).
        for part, seconds in start_parts(self.engine).items():
            self.clock.seconds[f"engine_start_{part}"] = seconds
        try:
            self._run_phases(replayed, to_repeat)
        finally:
            # Again at the end: what an engine learns while running (which products took which path).
            with contextlib.suppress(Exception):  # an engine that died keeps its first description
                self.describe = self.engine.describe()
            with clock("close"):
                self.engine.close()
            self.seconds = time.perf_counter() - t0
            self.observer.done()
        for name, own in self.check_runs.items():  # the checks that start engines of their own
            if own.after_close:
                with clock(own.timed_as or name):
                    own.run(self.contexts[name])

    def _run_phases(self, replayed: Sequence[Trial], to_repeat: Sequence[Trial]) -> None:
        """Everything run on the started engine, in order, each phase timed."""
        clock = self.clock.phase
        with clock("references"):
            self._references()
        with clock("trials"):
            self._run_trials(replayed, to_repeat)
        if self._judges_invariance and self.plan.config.schedule.search.trials:
            with clock("search"):
                self._search()
        with clock("repeats"):
            for trial in to_repeat:
                self.run_repeat(trial)
                self.observer.advance(self.divergent)
        # Every localization waits until the last request of the run has been served, in the order asked: a
        # compiled vLLM engine localizes in an eager twin, which it would otherwise start and stop around each
        # one. The requests themselves run in the order they always did.
        self._deferred = []
        try:
            self._localize_failures()
            with clock("checks"):  # the checks that run targets again on this engine
                for name, own in self.check_runs.items():
                    if not own.after_close:
                        own.run(self.contexts[name])
        except Exception:
            # A check failed (its engine error stops the run): what was asked is still localized, as it was
            # before the checks ran, where the engine can (each failure a note; an abandoned engine is refused).
            self._localize_deferred()
            raise
        except BaseException:  # interrupted or stopped: nothing more runs
            self._deferred = None
            raise
        self._localize_deferred()

    def _localize_deferred(self) -> None:
        deferred, self._deferred = self._deferred or [], None
        for args in deferred:
            self.localize(*args)

    def _references(self) -> None:
        """Every target alone: the solo run each trial is compared with."""
        assert self.engine is not None
        for i in range(len(self.plan.targets)):
            solo = fresh(self.engine, [solo_request(self.plan, i)])[0]
            self.solo[i] = keep_rows(solo, range(len(solo.token_ids)))  # every row: fidelity's KL reads them
            self.observer.advance(0)

    def _run_trials(self, replayed: Sequence[Trial], to_repeat: Sequence[Trial]) -> None:
        """The replayed trials, then the schedule's (those to repeat keep what their repeat compares)."""
        for trial in replayed:
            self.divergent += self.diverges(trial)
            self.observer.advance(self.divergent)
        repeated = {t.trial_id for t in to_repeat}
        for trial in self.plan.trials:
            self.divergent += self.diverges(trial, repeated=trial.trial_id in repeated)
            self.observer.advance(self.divergent)

    def _localize_failures(self) -> None:
        """Invariant mode shrinks and localizes its first failure; production localizes drift (unsharded)."""
        checks = self.plan.config.checks
        if self._judges_invariance and self.shard is None:
            self.shrink_and_localize()
        if self.mode == "invariant" or checks.drift.requirement == "off" or checks.drift.localize == "off":
            return
        if self.shard is None:
            self.localize_drift()
        else:  # the merge localizes invariance only: the map says why its trials name no op
            self.localize_notes.append("localize: a shard does not localize drift (run unsharded, or "
                                       "`oracle localize REPORT --trial N`)")

    def _failing(self) -> list[Trial]:
        """Failing trials in the order they ran: replayed from the example database, schedule, search."""
        ran = [*self.plan.replayed, *self.plan.trials, *self.search_trials]
        return [t for t in ran if t.trial_id in self.trials
                and first_divergence(self.solo[t.target], self.trials[t.trial_id]) is not None]

    def _next_id(self) -> int:
        ran = [*self.plan.replayed, *self.plan.trials, *self.search_trials, *self.shrink_trials]
        after = self.shard.schedule_size if self.shard is not None else 0  # a shard's ids: the schedule's
        return max(after, max((t.trial_id for t in ran), default=-1) + 1)

    def _search(self) -> None:
        """The guided search (oracle.search): its trials run here, judged as the schedule's."""
        from oracle.search import run_search

        plan, cfg = self.plan, self.plan.config.schedule

        def observe(trial: Trial) -> tuple[Completion, Divergence | None]:
            self.search_trials.append(trial)
            d = self.run_trial(trial)
            return self.trials[trial.trial_id], d

        def ran(trial: Trial, failed: bool) -> None:
            self.divergent += failed
            self.observer.advance(self.divergent)

        ran_before = [*plan.replayed, *plan.trials]
        prior = [(t, self.trials[t.trial_id]) for t in ran_before if t.trial_id in self.trials]
        self.observer.phase("search", cfg.search.trials)
        try:
            self.search = run_search(cfg, [len(t.token_ids) for t in plan.targets], plan.seed, observe,
                                     self._next_id(), ran_before, prior, ran)
        finally:
            self.observer.done()

    def shrink_and_localize(self) -> None:
        """Run the first failing trials again (`recheck`), shrink the first that reproduced and localize the
        first failing trial (and the smallest), timed as `recheck`, `shrink` and `localize` (`oracle merge`
        through `shrink_merged`)."""
        failing = self._failing()
        if failing:
            with self.clock.phase("recheck"):
                self._recheck(failing[:RECHECKED])
        with self.clock.phase("shrink"):
            self._shrink_and_localize()

    def _recheck(self, failing: Sequence[Trial]) -> None:
        """Each failing trial again as is (one already repeated: not again), and its target alone again."""
        assert self.engine is not None
        self.observer.phase("recheck", len(failing))
        try:
            for trial in failing:
                if trial.target not in self.solo_again:
                    again = fresh(self.engine, [solo_request(self.plan, trial.target)])[0]
                    d = first_divergence(self.solo[trial.target], again)
                    self.solo_again[trial.target] = keep_rows(again, (_step(d),))
                if trial.trial_id not in self.repeats:
                    requests, at = trial_requests(self.plan, trial)
                    again = fresh(self.engine, requests, trial.max_num_batched_tokens)[at]
                    d = first_divergence(self.trials[trial.trial_id], again)
                    self.reruns[trial.trial_id] = keep_rows(again, (_step(d),))
                self.observer.advance(0)
        finally:
            self.observer.done()

    def _reproduced(self, trial: Trial) -> bool:
        """Rechecked, and neither the trial nor its target alone gave other bits run again (run-to-run)."""
        again = self.repeats.get(trial.trial_id) or self.reruns.get(trial.trial_id)
        solo = self.solo_again.get(trial.target)
        return (again is not None and solo is not None
                and first_divergence(self.trials[trial.trial_id], again) is None
                and first_divergence(self.solo[trial.target], solo) is None)

    def _shrink_and_localize(self) -> None:
        failing = self._failing()
        if not failing:
            return
        first = failing[0]
        cfg = self.plan.config.schedule
        # A run-to-run failure is not the batch's: shrinking it would find a batch of 1 by chance.
        start = next((t for t in failing[:RECHECKED] if self._reproduced(t)), None)
        if start is not None and cfg.shrink and cfg.max_shrink_runs > 0:
            next_id = self._next_id()

            def new_id(cand: Trial, parent: int) -> Trial:
                t = replace(cand, trial_id=next_id + len(self.shrink_trials), origin="shrink", parent=parent)
                self.shrink_trials.append(t)
                return t

            self.observer.phase("shrink", cfg.max_shrink_runs)

            def fails(t: Trial) -> bool:
                out = self.diverges(t)
                self.observer.advance(0)
                return out

            try:
                self.shrink = shrink(start, fails, cfg, cfg.max_shrink_runs, new_id)
            finally:
                self.observer.done()
        chosen = failing if self.plan.config.checks.invariance.localize == "all" else [first]
        if self.shrink is not None and self.shrink.smallest is not self.shrink.start:
            chosen = [self.shrink.smallest, *chosen]  # the smallest first: its repro/ is the one to hand over
        for trial in chosen:
            requests, at = trial_requests(self.plan, trial)
            self.localize(trial.trial_id, RunSpec((solo_request(self.plan, trial.target),), 0),
                           RunSpec(tuple(requests), at, trial.max_num_batched_tokens))

    def localize_drift(self) -> None:
        """Production mode: localize the first drifting trial, or every one (`checks.drift.localize`), for the
        report's variance map (oracle.variance_map)."""
        setting = self.plan.config.checks.drift.localize
        failing = self._failing()
        for trial in failing if setting == "all" else failing[:1]:
            requests, at = trial_requests(self.plan, trial)
            self.localize(trial.trial_id, RunSpec((solo_request(self.plan, trial.target),), 0),
                           RunSpec(tuple(requests), at, trial.max_num_batched_tokens), setting)

    def localize(self, key: Any, expected: RunSpec, actual: RunSpec, setting: str | None = None) -> None:
        """Rerun both sides with per-op capture; a failure to localize is a note, never a lost verdict.
        `setting`: the localize option that asked (invariance's unless given)."""
        if self._deferred is not None:  # asked while requests remain: localized after them (`_run_phases`)
            self._deferred.append((key, expected, actual, setting))
            return
        setting = setting or self.plan.config.checks.invariance.localize
        if self.localizer is None or setting == "off":
            return
        assert self.engine is not None
        if not self.localizer.can_localize(self.engine):
            note = f"localize: the {self.describe.get('engine', 'engine')} engine {CAPTURE_HOW}"
            if note not in self.localize_notes:
                self.localize_notes.append(note)
            return
        self.observer.phase("localize", 1)
        try:
            with self.clock.phase("localize"):
                found = self.localized[key] = self.localizer.localize(self.engine, expected, actual)
            self.observer.advance(0)
            self.observer.outcome(f"trial {key}: " + (found.finding() if found is not None
                                                      else "no op differs on the captured rerun"))
        except OracleError as e:
            self.localize_notes.append(f"localize {key}: {e}")
            self.observer.outcome(f"trial {key}: not localized ({e})")
        except Exception as e:  # noqa: BLE001 - the verdict stands without the op
            self.localize_notes.append(f"localize {key}: {type(e).__name__}: {e}")
            self.observer.outcome(f"trial {key}: not localized ({type(e).__name__}: {e})")
        finally:
            # TimesItsLocalize: the call's parts, summed over the mode's localizations (`{mode}_localize_{part}_s`).
            with contextlib.suppress(Exception):
                for part, seconds in localize_parts(self.engine).items():
                    name = f"localize_{part}"
                    self.clock.seconds[name] = self.clock.seconds.get(name, 0.0) + seconds
            self.observer.done()

    def run_again(self, label: str, build: Callable[[], Engine], trials: Sequence[Trial],
                  keep: Callable[[InstanceRun], None],
                  then: Callable[[Engine, InstanceRun], InstanceRun] | None = None) -> None:
        """Another engine of this mode, started after the run's own closed: every reference and `trials` on it,
        from a cold cache. `keep` receives what it gave, also when it stopped part way (then closed); `then`, run
        on the engine before it closes, may add to it."""
        plan = self.plan
        self.observer.phase(label, len(plan.targets) + len(trials))
        engine = build()
        solo: dict[int, Completion] = {}
        ran: dict[int, Completion] = {}
        describe: dict[str, Any] = {}
        done: InstanceRun | None = None
        try:
            describe = dict(engine.describe())
            for i in range(len(plan.targets)):
                solo[i] = keep_rows(fresh(engine, [solo_request(plan, i)])[0])
                self.observer.advance(0)
            for trial in trials:
                requests, at = trial_requests(plan, trial)
                ran[trial.trial_id] = keep_rows(fresh(engine, requests, trial.max_num_batched_tokens)[at])
                self.observer.advance(0)
            done = InstanceRun(describe, MappingProxyType(solo), MappingProxyType(ran))
            if then is not None:
                done = then(engine, done)
        finally:
            keep(done or InstanceRun(describe, MappingProxyType(solo), MappingProxyType(ran)))
            engine.close()
            self.observer.done()

def repeated_trials(plan: Plan, shard: Shard | None = None) -> tuple[Trial, ...]:
    """The trials run twice: the schedule's first `repeat_trials` (a shard: those of them it holds)."""
    if shard is not None:
        return tuple(t for t in plan.trials if t.trial_id in shard.repeat_ids)
    return plan.trials[: min(plan.config.schedule.repeat_trials, len(plan.trials))]


def shrink_merged(plan: Plan, inv: ModeResult, observer: Observer, build: Callable[[Mode], Engine],
                  localizer: Localizer, timings: MutableMapping[str, float]) -> ModeResult:
    """`oracle merge`: the unsharded run's shrink and localization of its first failing trial, on an invariant
    engine started here. `inv`: every shard's invariant results laid side by side; returned with the shrinker's
    trials and result and the ops localized added. Each phase's seconds go into `timings`, also when the engine
    fails (the error is then raised and `inv` stays as it was)."""
    # Shrinking and localizing only: the checks' own runs were shard 0's.
    execution = ModeExecution(plan, "invariant", observer, build, localizer, check_runs={})
    execution.solo.update(inv.solo)
    execution.trials.update(inv.trials)
    execution.repeats.update(inv.repeats)
    try:
        with execution.clock.phase("engine_start"):
            execution.engine = execution.build("invariant")
            execution.describe = execution.engine.describe()
        try:
            execution.shrink_and_localize()
        finally:
            execution.engine.close()
    finally:
        timings.update(execution.clock.seconds)
    done = execution.result()
    return replace(inv, trials=done.trials, shrink=done.shrink, shrink_trials=done.shrink_trials,
                   reruns=done.reruns, solo_again=done.solo_again, localized={**done.localized, **inv.localized},
                   localize_notes=tuple(dict.fromkeys((*done.localize_notes, *inv.localize_notes))))
