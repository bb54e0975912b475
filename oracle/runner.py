"""run(config) -> Report: plan, execute both modes, judge, and hand the report to the views.

    plan (oracle.plan)       model, targets, the schedule's trials
    execute (oracle.execute) one engine per mode -> frozen ModeResult
    judge (oracle.judge)     pure check functions -> CheckResults and divergence records
    views                    given by the caller (the CLI and the plugin write every format)

report.json is always written (atomically), also when an engine fails or the run is interrupted:
what completed is judged. Drift and the negative control compare production batched against
production solo: against the invariant reference every row would differ in its last bits
merely because the kernels differ, which is fidelity's business, not the batch's.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oracle import __version__
from oracle.checks.invariance import hazard_probes
from oracle.config import Config
from oracle.engines.contract import Completion, Engine, Mode
from oracle.environment import collect_environment
from oracle.errors import EngineError
from oracle.execute import ModeExecution, ModeResult, RunSpec, generate
from oracle.judge import Runs, check_runs, coverage, judge, modes_read
from oracle.observer import Observer
from oracle.plan import Plan, plan_run, slice_plan, solo_request
from oracle.report import Report, TrialRecord
from oracle.report_sections import ExampleDbRecord, SearchRecord, SearchStopped, ShardSlice

if TYPE_CHECKING:
    from oracle.render.files import ReportWriter
    from oracle.schedule import Trial
from oracle.timings import rounded

# A view writes one more format of a finished (or partial) report into the report folder.
View = Callable[[Report, Path], Any]


def engine_builder(plan: Plan, instance: int = 0, beside: bool = False) -> Callable[[Mode], Engine]:
    """Engines started under the watchdog (`engine.timeout_s`): a hung engine is an engine error. `instance`
    picks the server of a mode given a list of URLs (the openai row's `instance` in oracle.engines.kinds; the cross_instance check's second).
    `beside`: the engine runs while the other mode's does (oracle.overlap; the row's `beside` config)."""
    from oracle.lifecycle.watchdog import start_engine

    cfg, row = plan.config.engine, plan.engine
    if beside:
        cfg = row.beside(cfg)
    return lambda mode: start_engine(row.instance(cfg, mode, instance), plan.model_dir, mode, row)


class OpLocalizer:
    """oracle.localize behind the execute step's Localizer protocol; the first op it names gets `repro/`
    (in `repro_dir`, the report folder's `repro`)."""

    def __init__(self, repro_dir: Path | None = None) -> None:
        self.repro_dir = repro_dir
        self.folder = repro_dir  # where it is, also once written (a check's own repro goes beside it)

    def can_localize(self, engine: Engine) -> bool:
        from oracle.lifecycle.watchdog import GuardedEngine
        from oracle.localize import can_localize

        return can_localize(engine.engine if isinstance(engine, GuardedEngine) else engine)

    def localize(self, engine: Engine, expected: RunSpec, actual: RunSpec) -> Any:
        from oracle.lifecycle.watchdog import GuardedEngine
        from oracle.localize import localize_runs

        def capture(inner: Any) -> Any:
            found = localize_runs(inner, expected, actual, self.repro_dir)
            if found is not None and found.repro is not None:
                self.repro_dir = None  # one repro per run: the first localized divergence's
            return found

        # Both captured runs (and the warm-up of a warm one) on the watchdog's thread, under its limit.
        if isinstance(engine, GuardedEngine):
            return engine.guarded(capture, "localize", calls=3)
        return capture(engine)


def run(config: Config, *, seed: int | None = None, observer: Observer | None = None,
        report_dir: Path | None = None, views: Sequence[View] = (), example_db: Path | None = None,
        shard: tuple[int, int] | None = None, writer: ReportWriter | None = None) -> Report:
    """Run every check of `config`; writes `report.json` (also a partial one on an engine error or signal).

    `example_db`: a folder of failing trials of earlier runs (oracle.example_db), replayed before the
    schedule and updated afterwards; none is read or written without it. `shard` (index, count): run
    only that slice of the schedule and write its results beside the report for `oracle merge`
    (oracle.shards.assign). `writer`: the run's report writer (`oracle run` and the plugin hand theirs,
    which wrote the started report); else one of its own for the report folder, writing `views`."""
    from oracle.render.files import ReportWriter

    observer = observer or Observer()
    t0 = time.perf_counter()
    plan, db = _plan(config, seed, example_db, shard)
    observer.seed(plan.seed)
    report = _started_report(config, plan)
    report.timings["plan_s"] = round(time.perf_counter() - t0, 3)
    out_dir = writer.out_dir if writer is not None else report_dir or Path(config.report_dir)
    writer = writer or ReportWriter(out_dir, views)
    _warn_before_start(plan, db, observer)
    results: dict[Mode, ModeResult] = {}

    def work() -> None:
        _run_modes(plan, observer, OpLocalizer(out_dir / "repro"), results, report)

    def conclude() -> None:
        _conclude(plan, results, report, db, observer, out_dir)
        report.timings["total_s"] = round(time.perf_counter() - t0, 3)

    return finish_run(plan, results, report, work, conclude, writer, views if views else writer.views, t0)


def _plan(config: Config, seed: int | None, example_db: Path | None,
          shard: tuple[int, int] | None) -> tuple[Plan, Any]:
    """The run's plan and its example database (None without one): the database's trials replayed first,
    then (a shard) only its slice."""
    from oracle.example_db import ExampleDB

    plan = plan_run(config, seed)
    db = ExampleDB.open(example_db, config) if example_db is not None else None
    if db is not None:
        plan = dataclasses.replace(plan, replayed=db.replayed(len(plan.targets), len(plan.trials), plan.trials))
    if shard is not None:
        plan = slice_plan(plan, *shard)
    return plan, db


def _warn_before_start(plan: Plan, db: Any, observer: Observer) -> None:
    """Known hazards of the posture the config asks for, said before any engine starts, and the stored trials
    the example database dropped."""
    for line in declared_hazards(plan):
        observer.warn(line)
    for line in db.warnings if db is not None else ():  # stored trials dropped (oracle.example_db)
        observer.warn(line)


def _started_report(config: Config, plan: Plan) -> Report:
    """The report before any engine starts: the config, the seed, the environment and the plan's size."""
    report = Report(
        oracle_version=__version__, seed=plan.seed, config=config.model_dump(mode="json"),
        config_digest=config.digest(), environment=collect_environment(),
    )
    report.environment.update(model_dir=str(plan.model_dir), targets=len(plan.targets), trials=len(plan.trials),
                              target_names=[t.name for t in plan.targets])
    if plan.shard is not None:
        report.shard = ShardSlice(index=plan.shard.index, count=plan.shard.count,
                                  schedule_size=plan.shard.schedule_size, trials=list(plan.shard.trial_ids))
        report.environment["trials"] = plan.shard.schedule_size
    return report


def _run_modes(plan: Plan, observer: Observer, localizer: OpLocalizer, results: dict[Mode, ModeResult],
               report: Report) -> None:
    """Each mode the enabled checks read, in order; its result (also a partial one) into `results`. Production
    mode runs beside invariant mode where it may (a fork of this process: oracle.forked_mode; a thread driving
    engines that live apart: oracle.threaded_mode); else, where the engines live apart, its engine starts while
    invariant mode runs (oracle.overlap)."""
    from oracle.forked_mode import ForkedMode, forks
    from oracle.overlap import EarlyStart, overlaps, production_localizes
    from oracle.threaded_mode import ThreadedMode

    modes = modes_read(plan.config)
    if forks(plan, modes):
        _run_beside(plan, observer, localizer, results, report, False, ForkedMode)
        return
    beside = overlaps(plan, modes)
    together = beside and plan.engine.starts_together(plan.config.engine)
    if beside and not production_localizes(plan):
        _run_beside(plan, observer, localizer, results, report, True,
                    lambda ex, told: ThreadedMode(ex, told, wait_for_first=not together))
        return
    build = engine_builder(plan, beside=beside)
    early = EarlyStart(build, modes[-1]) if beside else None
    try:
        if early is not None and together:
            early.begin()
        for i, mode in enumerate(modes):
            own = build if early is None else early.first(build) if i == 0 else early.take
            execution = ModeExecution(plan, mode, observer, own, localizer, engine_builder(plan, 1, beside),
                                      check_runs=check_runs(plan.config), shard=plan.shard)
            try:
                execution.run()
            finally:
                if early is not None and own == early.take and "engine_start" in execution.clock.seconds:
                    execution.clock.seconds["engine_start"] = early.start_s  # its own start, not the wait
                _keep(report, results, mode, execution.result(), execution.seconds)
    finally:
        if early is not None:
            early.close()
            report.timings.update(early.timings())


def _keep(report: Report, results: dict[Mode, ModeResult], mode: Mode, result: ModeResult, seconds: float) -> None:
    results[mode] = result
    report.timings[f"{mode}_s"] = round(seconds, 3)
    report.timings.update(rounded(dict(result.timings), f"{mode}_"))


def _run_beside(plan: Plan, observer: Observer, localizer: OpLocalizer, results: dict[Mode, ModeResult],
                report: Report, apart: bool, make: Callable[[ModeExecution, Observer], Any]) -> None:
    """Invariant mode here while production mode runs beside it (`make(execution, observer)`: a ForkedMode or a
    ThreadedMode); the results kept, and production's fault raised, as a sequential run would (production's once
    invariant mode is done). `apart`: the engines live in processes of their own (the row's `beside` config)."""
    build = engine_builder(plan, beside=apart)

    def execution(mode: Mode, own: Callable[[Mode], Engine]) -> ModeExecution:
        return ModeExecution(plan, mode, Observer(), own, localizer, engine_builder(plan, 1, apart),
                             check_runs=check_runs(plan.config), shard=plan.shard)

    second = make(execution("production", build), observer)
    second.start()
    try:
        here = execution("invariant", second.first(build))
        here.observer = observer
        try:
            here.run()
        finally:
            _keep(report, results, "invariant", here.result(), here.seconds)
        result, seconds, error = second.join()
        if result is not None:
            _keep(report, results, "production", result, seconds)
        report.timings.update(second.timings())
        if error is not None:
            raise error
    finally:
        second.cancel()


def finish_run(plan: Plan, results: dict[Mode, ModeResult], report: Report, work: Callable[[], None],
               conclude: Callable[[], None], writer: ReportWriter, views: Sequence[View], t0: float) -> Report:
    """The end of every run, `oracle merge`'s included: `work` (the engines' part, filling `results`), then,
    also when it failed or was stopped, judge what completed (`finish`, timed as `judge_s`), `conclude` (the
    caller's own records) and the views' formats and report.json through the run's `writer`. An engine error is
    kept in the report (exit 3); a signal, a model error while loading or sys.exit() is recorded, then raised."""
    try:
        work()
        report.complete = True
    except EngineError as e:
        report.set_error(str(e))
    except BaseException as e:
        report.mark_stopped(e)
        raise
    finally:
        t_judge = time.perf_counter()
        finish(plan, results, report)
        report.timings["judge_s"] = round(time.perf_counter() - t_judge, 3)
        conclude()
        writer.final(report, timed_views(views, report, t0))  # signals held while the files are written
    return report


def _conclude(plan: Plan, results: dict[Mode, ModeResult], report: Report, db: Any, observer: Observer,
              out_dir: Path) -> None:
    """After judging: update the example database and save a shard's results."""
    if db is not None:
        said = len(db.warnings)
        update_db(db, plan, results.get("invariant"), report)
        for line in db.warnings[said:]:  # trials that could not be saved (a read-only folder)
            observer.warn(line)
    if plan.shard is not None:
        from oracle.shards.results import save_results

        save_results(out_dir, plan.shard, plan.seed, report.config_digest, report.oracle_version, plan.targets,
                     results)


def timed_views(views: Sequence[View], report: Report, t0: float) -> list[View]:
    """`views`, then one that records their time as `write_s` and the run's as `total_s` (report.json, written
    after the views, holds both)."""
    started: list[float] = []

    def first(r: Report, path: Path) -> None:
        started.append(time.perf_counter())

    def last(r: Report, path: Path) -> None:
        if started:
            r.timings["write_s"] = round(time.perf_counter() - started[0], 3)
        r.timings["total_s"] = round(time.perf_counter() - t0, 3)

    return [first, *views, last]


def finish(plan: Plan, results: dict[Mode, ModeResult], report: Report) -> None:
    """Fill the report from the frozen results: environment, every trial run, verdicts, coverage."""
    report.environment["engines"] = {m: dict(r.engine) for m, r in results.items()}
    if report.environment["engines"]:
        from oracle.posture import report_posture

        report.environment["posture"] = report_posture(report.environment["engines"])
    inv, prod = results.get("invariant"), results.get("production")
    trials = _trials_run(plan, inv)
    search = _search_summary(plan, inv)
    if search is not None:
        report.search = search
    report.schedule = [TrialRecord.model_validate(t.to_json()) for t in trials.values()]
    golden = plan.golden if inv is not None else None  # read when the run was planned
    match_posture_hazards(plan, report)
    if (differs := plan.model.layout.prefill_decode_differs()) is not None:
        report.environment["prefill_decode_not_applicable"] = differs  # the model's layers: read by its check
    runs = Runs(plan.config, plan.targets, trials, inv, prod, report.environment, golden, plan.unformed_probes,
                plan.engine_kind)
    report.checks, report.divergences = judge(runs)
    report.coverage = coverage(runs)
    report.hazard_probes = hazard_probes(runs, plan.unformed_probes)
    record_hazard_evidence(runs, report)
    from oracle.variance_map import variance_map

    report.variance_map = variance_map(runs)
    record_posture(plan, report)


def _trials_run(plan: Plan, inv: ModeResult | None) -> dict[int, Trial]:
    """trial id -> trial for every trial run: the schedule's, then invariant mode's replayed, searched and
    shrunk ones."""
    trials = {t.trial_id: t for t in plan.trials}
    if inv is not None:
        for t in (*plan.replayed, *inv.search_trials, *inv.shrink_trials):
            trials[t.trial_id] = t
    return trials


def _search_summary(plan: Plan, inv: ModeResult | None) -> SearchRecord | SearchStopped | None:
    """The guided search's summary for the report; a search stopped before it finished says so."""
    if inv is None:
        return None
    if inv.search is not None:
        return inv.search.summary()
    if inv.search_trials:
        return SearchStopped(asked=plan.config.schedule.search.trials, run=len(inv.search_trials), stopped=True)
    return None


def declared_hazards(plan: Plan) -> list[str]:
    """'invariance claimed, known not to hold: ...' for each hazard the config's own posture matches, and the
    probes added for them (or why one could not be formed)."""
    from oracle.posture.hazards import warning_lines

    lines = warning_lines(list(plan.hazards))
    for m in plan.hazards:
        if m.hazard.probes and plan.config.schedule.probes == "none":
            lines.append(f"{m.hazard.id}: schedule.probes is none, so its threshold ({m.hazard.threshold}) "
                         "is crossed only by chance; invariance cannot pass untested")
    lines += [f"hazard probe {side} not formed: {limit}" for side, limit in plan.unformed_probes]
    return lines


def match_posture_hazards(plan: Plan, report: Report) -> None:
    """The hazards the engines' real invariant posture matches (shipped and the config's own), into
    `environment.hazards`, before the checks read them."""
    from oracle.plan import hazard_inputs
    from oracle.posture.hazards import hazards_for, match_hazards

    posture = report.posture
    invariant = posture.modes.get("invariant") if posture is not None else None
    if invariant is None:
        return
    model, sampling = hazard_inputs(plan.config, plan.model)
    report.environment["hazards"] = [m.record() for m in match_hazards(invariant.model_dump(), model, sampling,
                                                                       hazards_for(plan.config))]


def record_hazard_evidence(runs: Runs, report: Report) -> None:
    """Each matched hazard's evidence class (verified, failed, not verified) into `environment.posture.hazards`,
    from the judged trials' pass evidence and invariant mode's divergences (oracle.posture.evidence)."""
    from oracle.posture.evidence import ProbeRuns, hazard_evidence

    posture = report.posture
    if posture is None or not report.hazards:
        return
    left_out = "no trial of it ran: the probe was left out of the schedule" + (
        " (schedule.probes is none)" if runs.config.schedule.probes == "none" else "")
    divergent = frozenset(d.trial_id for d in report.divergences if d.mode == "invariant" and d.trial_id is not None
                          and d.check in ("invariance", "repeatability"))
    probe_runs = ProbeRuns({tid: runs.trials[tid] for tid in runs.judged_ids},
                           runs.inv.trials if runs.inv is not None else None, runs.unformed_probes, divergent, left_out)
    crossed = {r.id: r.crossed_by for r in report.hazard_probes}
    report.environment["posture"] = posture.model_copy(update={"hazards": [
        hazard_evidence(h, crossed.get(h.id, ()), probe_runs) for h in report.hazards]})


def record_posture(plan: Plan, report: Report) -> None:
    """Cite the hazards the invariant posture matched (`environment.hazards`) on every invariant-mode
    divergence (`evidence.known_hazards`)."""
    cited = [h.cite() for h in report.hazards]
    for d in report.divergences if cited else ():
        if d.mode == "invariant":
            d.evidence["known_hazards"] = cited


def update_db(db: Any, plan: Plan, inv: ModeResult | None, report: Report) -> None:
    """Save this run's failing invariance trials (the shrunk one included) and forget replayed ones that
    passed; the report says what was replayed and done."""
    from oracle.schedule import Trial

    found = [d for d in report.divergences if d.check == "invariance"]
    failing = [Trial.from_json(d.trial.model_dump()) for d in found if d.trial is not None]
    done = db.update(failing, _passed_replays(plan, inv, {d.trial_id for d in found}))
    report.example_db = ExampleDbRecord(path=str(db.path), key=db.key, replayed=[t.trial_id for t in plan.replayed],
                                        **done)


def _passed_replays(plan: Plan, inv: ModeResult | None, failed_ids: set[int | None]) -> list[Trial]:
    """The replayed trials that ran in invariant mode without an invariance divergence."""
    ran = inv.trials if inv is not None else {}
    return [t for t in plan.replayed if t.trial_id in ran and t.trial_id not in failed_ids]


def record_golden(config: Config, golden_file: Path, observer: Observer | None = None) -> dict[str, Any]:
    """Run the invariant solo references only and write them, with the environment, to `golden_file`."""
    from oracle.golden import make_golden, write_golden
    from oracle.lifecycle.watchdog import start_engine
    from oracle.posture import report_posture

    observer = observer or Observer()
    plan = plan_run(config.model_copy(update={"checks": config.checks.model_copy(
        update={"golden": config.checks.golden.model_copy(update={"requirement": "off"})})}))
    engine = start_engine(config.engine, plan.model_dir, "invariant")
    env = collect_environment()
    env["engines"] = {"invariant": engine.describe()}
    env["posture"] = report_posture(env["engines"]).model_dump(mode="json")  # a golden file holds plain JSON
    refs: dict[str, Completion] = {}
    observer.phase("record", len(plan.targets))
    try:
        for i, t in enumerate(plan.targets):
            refs[t.name] = generate(engine, [solo_request(plan, i)])[0]
            observer.advance(0)
    finally:
        engine.close()
        observer.done()
    golden = make_golden(refs, {t.name: t.token_ids for t in plan.targets}, env, config.digest())
    write_golden(golden_file, golden)
    return golden

