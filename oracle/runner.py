"""run(config) -> Report: draw the schedule, run it in both modes, compare bitwise, judge the checks.

Each mode gets its own engine, built once and closed before the next (a process-wide mode such
as vLLM's never shares a process with the other). Solo references are computed once per
target and mode. Drift and the negative control compare production batched against production
solo: against the invariant reference every row would differ in its last bits merely because
the kernels differ, which is fidelity's business, not the batch's.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oracle import __version__
from oracle.checks import Judge, ModeRuns, golden_path
from oracle.compare import first_divergence
from oracle.config import Config
from oracle.engines import build_engine, check_engine_config
from oracle.engines.base import Completion, Engine, Mode, Request, SamplingParams
from oracle.environment import collect_environment
from oracle.errors import EngineError, OracleError
from oracle.golden import compare_golden, environment_changes, make_golden, read_golden, write_golden
from oracle.prompts import Target, check_prompts, load_targets, vocab_size_of
from oracle.report import CheckResult, Report
from oracle.schedule import Trial, draw_schedule, filler_tokens, trial_strategy
from oracle.search import search, trial_key


class Observer:
    """Hooks the CLI uses to show progress; the default does nothing."""

    def seed(self, seed: int) -> None: ...

    def phase(self, name: str, total: int) -> None: ...

    def advance(self, divergences: int) -> None: ...

    def done(self) -> None: ...


@dataclass
class Plan:
    config: Config
    model_dir: Path
    targets: list[Target]
    trials: list[Trial]
    seed: int
    vocab_size: int


def resolve_model(config: Config) -> Path:
    """`preset:NAME`, a checkpoint directory or a hub id, checked against the engine; ModelError otherwise."""
    from oracle.models.resolve import resolve_for_run

    return resolve_for_run(config)


def plan_run(config: Config, seed: int | None = None) -> Plan:
    if seed is None:
        seed = config.schedule.seed if config.schedule.seed is not None else random.SystemRandom().randrange(2**32)
    check_engine_config(config.engine)
    check_prompts(config)
    if config.checks.golden.requirement != "off":
        read_golden(golden_path(config))  # type: ignore[arg-type]
    model_dir = resolve_model(config)
    targets = load_targets(config, model_dir)
    trials = draw_schedule(config.schedule, len(targets), seed)
    return Plan(config, model_dir, targets, trials, seed, vocab_size_of(model_dir))


def trial_requests(plan: Plan, trial: Trial) -> tuple[list[Request], int]:
    """The requests of a trial and the index of its target among them."""
    s = plan.config.sampling
    target = plan.targets[trial.target]
    fillers = [
        Request(f"trial{trial.trial_id}-filler{j}", filler_tokens(f, plan.vocab_size),
                SamplingParams(f.max_tokens, s.temperature, f.seed, "none"), arrival_step=f.arrival_step)
        for j, f in enumerate(trial.fillers)
    ]
    req = Request(f"trial{trial.trial_id}-{target.name}", target.token_ids, target_sampling(plan.config),
                  arrival_step=trial.target_arrival_step)
    return fillers[: trial.position] + [req] + fillers[trial.position :], trial.position


def target_sampling(config: Config, max_tokens: int | None = None) -> SamplingParams:
    s = config.sampling
    return SamplingParams(max_tokens or s.max_tokens, s.temperature, s.seed, s.logits)


def generate(engine: Engine, requests: Sequence[Request], budget: int | None = None) -> list[Completion]:
    """engine.generate with every failure turned into EngineError (exit 3)."""
    try:
        out = engine.generate(requests, budget) if budget else engine.generate(requests)
    except OracleError:
        raise
    except Exception as e:  # noqa: BLE001 - any engine failure becomes exit 3 with a partial report
        raise EngineError(f"engine raised {type(e).__name__}: {e}") from e
    if len(out) != len(requests):
        raise EngineError(f"engine returned {len(out)} completions for {len(requests)} requests")
    return out


class ModeRunner:
    """Runs one mode's share of the work on one engine; what completed stays in `runs`."""

    def __init__(self, plan: Plan, mode: Mode, runs: ModeRuns, observer: Observer, report_dir: Path) -> None:
        self.plan, self.mode, self.runs, self.observer, self.report_dir = plan, mode, runs, observer, report_dir
        self.engine: Engine | None = None
        self.cache: dict[tuple[Any, ...], Completion] = {}
        self.scheduled = {trial_key(t): t for t in plan.trials}
        self.divergent = 0

    def fresh(self, requests: Sequence[Request], budget: int | None = None) -> list[Completion]:
        """generate() from a cold prefix cache, so a trial's result does not hang on earlier trials."""
        assert self.engine is not None
        reset = getattr(self.engine, "reset_prefix_cache", None)
        if reset is not None:
            reset()
        return generate(self.engine, requests, budget)

    def run_trial(self, trial: Trial) -> Completion:
        key = trial_key(trial)
        if key not in self.cache:
            requests, at = trial_requests(self.plan, trial)
            self.cache[key] = self.fresh(requests, trial.max_num_batched_tokens)[at]
        return self.cache[key]

    def diverges(self, trial: Trial) -> bool:
        out = self.run_trial(trial)
        scheduled = self.scheduled.get(trial_key(trial))
        if scheduled is not None:  # while nothing fails, the search walks the schedule itself
            self.runs.trials[scheduled.trial_id] = out
        self.runs.extra[trial.trial_id] = out
        return first_divergence(self.runs.solo[trial.target], out) is not None

    def run(self) -> None:
        cfg = self.plan.config
        checks = cfg.checks
        n_repeat = min(cfg.schedule.repeat_trials, len(self.plan.trials))
        invariant = self.mode == "invariant"
        n_prefill = len(self.plan.targets) * checks.prefill_decode.steps if invariant else 0
        if checks.prefill_decode.requirement == "off":
            n_prefill = 0
        self.observer.phase(self.mode, len(self.plan.targets) + len(self.plan.trials) + n_repeat + n_prefill)
        t0 = time.perf_counter()
        self.engine = build_engine(cfg.engine, self.plan.model_dir, self.mode)
        self.runs.engine = self.engine.describe()
        try:
            for i, target in enumerate(self.plan.targets):
                self.runs.solo[i] = self.fresh([Request(f"solo-{target.name}", target.token_ids,
                                                        target_sampling(cfg))])[0]
                self.observer.advance(0)
            if invariant and cfg.schedule.shrink and checks.invariance.requirement != "off":
                self.runs.search = search(
                    trial_strategy(cfg.schedule, len(self.plan.targets)), self.diverges, seed=self.plan.seed,
                    max_examples=len(self.plan.trials), max_shrink_runs=cfg.schedule.max_shrink_runs,
                    database_dir=self.report_dir / "hypothesis", first_trial_id=len(self.plan.trials),
                )
            for trial in self.plan.trials:
                out = self.runs.trials[trial.trial_id] = self.run_trial(trial)
                self.divergent += first_divergence(self.runs.solo[trial.target], out) is not None
                self.observer.advance(self.divergent)
            for trial in self.plan.trials[:n_repeat]:
                requests, at = trial_requests(self.plan, trial)
                self.runs.repeats[trial.trial_id] = self.fresh(requests, trial.max_num_batched_tokens)[at]
                self.observer.advance(self.divergent)
            if n_prefill:
                self._prefill_decode(checks.prefill_decode.steps)
            if invariant and checks.prefix_cache.requirement != "off":
                self._prefix_cache()
        finally:
            self.runs.seconds = time.perf_counter() - t0
            # Again at the end: what an engine learns while running (which products took which path).
            with contextlib.suppress(Exception):  # an engine that died keeps its first description
                self.runs.engine = self.engine.describe()
            self.engine.close()
            self.observer.done()

    def _prefix_cache(self) -> None:
        """Per target: reset the cache, run cold, run again warm (the prompt's blocks now cached).

        Every other run starts cold (`fresh`), so this is where warm caches are exercised.
        """
        assert self.engine is not None
        reset = getattr(self.engine, "reset_prefix_cache", None)
        if reset is None or not self.runs.engine.get("enable_prefix_caching"):
            self.runs.prefix_note = "the engine runs without prefix caching (engine.enable_prefix_caching)"
            return
        for t, target in enumerate(self.plan.targets):
            reset()
            req = Request(f"prefix-{target.name}", target.token_ids, target_sampling(self.plan.config))
            cold = generate(self.engine, [req])[0]
            warm = generate(self.engine, [req])[0]
            self.runs.prefix[t] = (cold, warm)

    def _prefill_decode(self, steps: int) -> None:
        assert self.engine is not None
        for t, target in enumerate(self.plan.targets):
            ref = self.runs.solo[t]
            n = len(ref.token_ids)
            for i in sorted({round(k * (n - 1) / max(1, steps - 1)) for k in range(steps)})[:steps]:
                prompt = target.token_ids + tuple(ref.token_ids[:i])
                req = Request(f"prefill-{target.name}-{i}", prompt, target_sampling(self.plan.config, 1))
                self.runs.prefill[(t, i)] = self.fresh([req])[0]
                self.observer.advance(self.divergent)


def run(config: Config, *, seed: int | None = None, observer: Observer | None = None,
        report_dir: Path | None = None) -> Report:
    """Run every check of `config`; writes `report.json` (also a partial one on an engine error or Ctrl-C)."""
    observer = observer or Observer()
    t0 = time.perf_counter()
    plan = plan_run(config, seed)
    observer.seed(plan.seed)
    report = Report(
        oracle_version=__version__, seed=plan.seed, config=config.model_dump(mode="json"),
        config_digest=config.digest(), environment=collect_environment(),
    )
    report.environment.update(model_dir=str(plan.model_dir), targets=len(plan.targets), trials=len(plan.trials),
                              target_names=[t.name for t in plan.targets])
    report.schedule = [t.to_json() for t in plan.trials]
    out_dir = report_dir or Path(config.report_dir)
    all_runs: dict[Mode, ModeRuns] = {}
    try:
        for mode in ("invariant", "production"):
            runs = all_runs[mode] = ModeRuns()
            try:
                ModeRunner(plan, mode, runs, observer, out_dir).run()
            finally:
                report.timings[f"{mode}_s"] = round(runs.seconds, 3)
        report.complete = True
    except EngineError as e:
        report.error = str(e)
    except KeyboardInterrupt:
        report.error = "interrupted"
        raise
    finally:
        # Judge what completed, so an engine failure or Ctrl-C still leaves a useful report.
        report.environment["engines"] = {m: r.engine for m, r in all_runs.items()}
        judge(plan, all_runs, report)
        report.timings["total_s"] = round(time.perf_counter() - t0, 3)
        write_all(report, out_dir)
    return report


def judge(plan: Plan, all_runs: dict[Mode, ModeRuns], report: Report) -> None:
    checks = plan.config.checks
    j = Judge(plan.config, plan.targets, {t.trial_id: t for t in plan.trials}, report)
    inv, prod = all_runs.get("invariant"), all_runs.get("production")
    add = report.checks.append
    if checks.invariance.requirement != "off" and inv:
        add(j.against_solo("invariance", checks.invariance.requirement, "invariant", inv))
    if checks.repeatability.requirement != "off":
        add(j.repeatability(checks.repeatability.requirement, all_runs))
    if checks.fidelity.requirement != "off" and inv and prod:
        add(j.fidelity(checks.fidelity.requirement, inv, prod))
    drift: CheckResult | None = None
    if prod and (checks.drift.requirement != "off" or checks.negative_control.requirement != "off"):
        drift = j.against_solo("drift", checks.drift.requirement, "production", prod)
        if checks.drift.requirement != "off":
            add(drift)
    if checks.negative_control.requirement != "off":
        add(j.negative_control(checks.negative_control.requirement, drift))
    if checks.prefill_decode.requirement != "off" and inv:
        add(j.prefill_decode(checks.prefill_decode.requirement, inv))
    if checks.prefix_cache.requirement != "off" and inv:
        add(j.prefix_cache(checks.prefix_cache.requirement, inv))
    if checks.golden.requirement != "off" and inv:
        add(judge_golden(plan, inv, report))


def judge_golden(plan: Plan, inv: ModeRuns, report: Report) -> CheckResult:
    requirement = plan.config.checks.golden.requirement
    golden = read_golden(golden_path(plan.config))  # type: ignore[arg-type]
    refs = {plan.targets[i].name: c for i, c in inv.solo.items()}
    prompts = {t.name: t.token_ids for t in plan.targets}
    diffs = compare_golden(golden, refs, prompts)
    changed = environment_changes(golden.get("environment", {}), report.environment)
    changed = {k: v for k, v in changed.items()
               if not k.startswith(("model_dir", "trials", "targets", "target_names", "engines.production"))}
    ev = {"targets": len(refs), "differing": diffs, "environment_changes": changed}
    if not refs:
        return CheckResult("golden", requirement, "vacuous", 0, 0, ev, "no reference completed")
    if diffs:
        what = ", ".join(f"{k}: {v[0]} -> {v[1]}" for k, v in list(changed.items())[:4]) or "nothing recorded"
        return CheckResult("golden", requirement, "fail", len(refs), len(diffs), ev,
                           f"{len(diffs)} of {len(refs)} targets differ from the golden file; changed: {what}")
    return CheckResult("golden", requirement, "pass", len(refs), 0, ev,
                       f"{len(refs)} targets bitwise equal to the golden file")


def record_golden(config: Config, golden_file: Path, observer: Observer | None = None) -> dict[str, Any]:
    """Run the invariant solo references only and write them, with the environment, to `golden_file`."""
    observer = observer or Observer()
    plan = plan_run(config.model_copy(update={"checks": config.checks.model_copy(
        update={"golden": config.checks.golden.model_copy(update={"requirement": "off"})})}))
    engine = build_engine(config.engine, plan.model_dir, "invariant")
    env = collect_environment()
    env["engines"] = {"invariant": engine.describe()}
    refs: dict[str, Completion] = {}
    observer.phase("record", len(plan.targets))
    try:
        for t in plan.targets:
            refs[t.name] = generate(engine, [Request(f"solo-{t.name}", t.token_ids, target_sampling(config))])[0]
            observer.advance(0)
    finally:
        engine.close()
        observer.done()
    golden = make_golden(refs, {t.name: t.token_ids for t in plan.targets}, env, config.digest())
    write_golden(golden_file, golden)
    return golden


def write_all(report: Report, out_dir: Path) -> None:
    """report.json plus every other format beside it."""
    report.write(out_dir)
    from oracle.render.files import write_formats

    write_formats(report, out_dir)
