"""run(config) -> Report: draw the schedule, run it in both modes, compare bitwise, judge the checks.

Each mode gets its own engine, built once and closed before the next (a process-wide mode such
as vLLM's never shares a process with the other). Solo references are computed once per
target and mode. Drift and the negative control compare production batched against production
solo: against the invariant reference every row would differ in its last bits merely because
the kernels differ, which is fidelity's business, not the batch's.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from oracle import __version__
from oracle.compare import Divergence, first_divergence
from oracle.config import Config
from oracle.engines import build_engine, check_engine_config
from oracle.engines.base import Completion, Engine, Mode, Request, SamplingParams
from oracle.environment import collect_environment
from oracle.errors import EngineError, OracleError
from oracle.prompts import Target, check_prompts, load_targets, vocab_size_of
from oracle.report import CheckResult, DivergenceRecord, Report
from oracle.schedule import Trial, draw_schedule, filler_tokens

NEAR_TIE_MARGIN = 1e-2  # reference top-1 minus top-2 logit below which a token flip is a near tie


class Observer:
    """Hooks the CLI uses to show progress; the default does nothing."""

    def seed(self, seed: int) -> None: ...

    def phase(self, name: str, total: int) -> None: ...

    def advance(self, divergences: int) -> None: ...

    def done(self) -> None: ...


@dataclass
class ModeRuns:
    """Everything one mode produced: solo references, trial runs and repeats (target outputs only)."""

    solo: dict[int, Completion] = field(default_factory=dict)
    trials: dict[int, Completion] = field(default_factory=dict)
    repeats: dict[int, Completion] = field(default_factory=dict)
    seconds: float = 0.0
    engine: dict[str, Any] = field(default_factory=dict)


@dataclass
class Plan:
    config: Config
    model_dir: Path
    targets: list[Target]
    trials: list[Trial]
    seed: int
    vocab_size: int


def resolve_model(config: Config) -> Path:
    from oracle.errors import ModelError

    if config.model.startswith("preset:"):
        from oracle.models import ensure_model

        return ensure_model(config.model.removeprefix("preset:"), seed=config.model_seed)
    path = config.resolve_path(config.model)
    if not (path / "config.json").is_file():
        raise ModelError(f"model: {path} is not a checkpoint directory (no config.json)")
    return path


def plan_run(config: Config, seed: int | None = None) -> Plan:
    if seed is None:
        seed = config.schedule.seed if config.schedule.seed is not None else random.SystemRandom().randrange(2**32)
    check_engine_config(config.engine)
    check_prompts(config)
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
    req = Request(f"trial{trial.trial_id}-{target.name}", target.token_ids, _target_sampling(plan.config),
                  arrival_step=trial.target_arrival_step)
    return fillers[: trial.position] + [req] + fillers[trial.position :], trial.position


def _target_sampling(config: Config) -> SamplingParams:
    s = config.sampling
    return SamplingParams(s.max_tokens, s.temperature, s.seed, s.logits)


def _generate(engine: Engine, requests: Sequence[Request], budget: int | None = None) -> list[Completion]:
    try:
        out = engine.generate(requests, budget) if budget else engine.generate(requests)
    except OracleError:
        raise
    except Exception as e:  # noqa: BLE001 - any engine failure becomes exit 3 with a partial report
        raise EngineError(f"engine raised {type(e).__name__}: {e}") from e
    if len(out) != len(requests):
        raise EngineError(f"engine returned {len(out)} completions for {len(requests)} requests")
    return out


def run_mode(plan: Plan, mode: Mode, runs: ModeRuns, observer: Observer) -> None:
    """Fill `runs` for one mode; on an engine failure what completed stays in `runs`."""
    cfg = plan.config
    n_repeat = min(cfg.schedule.repeat_trials, len(plan.trials))
    observer.phase(mode, len(plan.targets) + len(plan.trials) + n_repeat)
    t0 = time.perf_counter()
    engine = build_engine(cfg.engine, plan.model_dir, mode)
    runs.engine = engine.describe()
    try:
        for i, target in enumerate(plan.targets):
            req = Request(f"solo-{target.name}", target.token_ids, _target_sampling(cfg))
            runs.solo[i] = _generate(engine, [req])[0]
            observer.advance(0)
        divergent = 0
        for trial in plan.trials:
            requests, at = trial_requests(plan, trial)
            out = _generate(engine, requests, trial.max_num_batched_tokens)[at]
            runs.trials[trial.trial_id] = out
            divergent += first_divergence(runs.solo[trial.target], out) is not None
            observer.advance(divergent)
        for trial in plan.trials[:n_repeat]:
            requests, at = trial_requests(plan, trial)
            runs.repeats[trial.trial_id] = _generate(engine, requests, trial.max_num_batched_tokens)[at]
            observer.advance(divergent)
    finally:
        runs.seconds = time.perf_counter() - t0
        engine.close()
        observer.done()


def _evidence_at(c: Completion, step: int) -> dict[str, Any]:
    ev = next((e for e in c.evidence if e.token_index == step), None)
    return asdict(ev) if ev is not None else {}


def _record(check: str, mode: str, plan: Plan, trial: Trial | None, target: int, actual: Completion,
            d: Divergence) -> DivergenceRecord:
    margin = d.reference_margin
    return DivergenceRecord(
        check=check, mode=mode, target=plan.targets[target].name,
        trial_id=trial.trial_id if trial else None, trial=trial.to_json() if trial else None,
        request_id=actual.request_id, step=d.step, kind=d.kind,
        expected_token=d.expected_token, actual_token=d.actual_token,
        expected_logprob=d.expected_logprob, actual_logprob=d.actual_logprob, ulp=d.ulp,
        max_abs_logits_diff=d.max_abs_logits_diff, reference_margin=margin,
        near_tie=None if margin is None else margin < NEAR_TIE_MARGIN,
        first_token_step=d.first_token_step, evidence=_evidence_at(actual, d.step),
    )


def _batch_evidence(plan: Plan, completions: dict[int, Completion]) -> dict[str, Any]:
    """How often targets really shared forward passes: without this a pass can be vacuous."""
    by_id = {t.trial_id: t for t in plan.trials}
    shared = {tid: c.max_batch for tid, c in completions.items()}
    batched = [tid for tid, m in shared.items() if m >= 2]
    chunked = sum(any(e.chunked for e in c.evidence) for c in completions.values())
    return {
        "trials_batched": len(batched),
        "max_seqs_shared": max(shared.values(), default=0),
        "seqs_shared_histogram": dict(sorted(Counter(shared.values()).items())),
        "scheduled_batch_sizes": sorted({by_id[t].batch_size for t in completions}),
        "trials_chunked_prefill": chunked,
    }


def judge_against_solo(
    name: str, requirement: str, plan: Plan, mode: Mode, runs: ModeRuns, report: Report
) -> CheckResult:
    """Every trial's target vs that target's solo run in the same mode, bitwise."""
    by_id = {t.trial_id: t for t in plan.trials}
    ev = _batch_evidence(plan, runs.trials)
    divergent: list[DivergenceRecord] = []
    for tid, actual in runs.trials.items():
        trial = by_id[tid]
        if trial.target not in runs.solo:
            continue
        d = first_divergence(runs.solo[trial.target], actual)
        if d is not None:
            divergent.append(_record(name, mode, plan, trial, trial.target, actual, d))
    report.divergences += divergent
    n = len(runs.trials)
    if divergent:
        token_steps = [r.first_token_step for r in divergent if r.first_token_step is not None]
        ev.update({
            "divergent_fraction": len(divergent) / n,
            "first_divergence_steps": dict(sorted(Counter(r.step for r in divergent).items())),
            "first_token_divergence_steps": dict(sorted(Counter(token_steps).items())),
            "max_ulp": max((r.ulp or 0) for r in divergent),
        })
    if name == "drift":
        verdict = "vacuous" if ev["trials_batched"] == 0 else "pass"
        msg = (f"{len(divergent)} of {n} production trials diverged from production solo"
               if divergent else f"no production divergence in {n} trials")
    elif divergent:
        verdict, msg = "fail", f"{len(divergent)} of {n} trials diverged from the solo reference"
    elif ev["trials_batched"] == 0:
        verdict, msg = "vacuous", "no trial put a target in a forward pass with another sequence"
    else:
        verdict, msg = "pass", f"{n} trials bitwise equal to the solo reference, {ev['trials_batched']} batched"
    return CheckResult(name, requirement, verdict, n, len(divergent), ev, msg)  # type: ignore[arg-type]


def judge_repeatability(requirement: str, plan: Plan, all_runs: dict[Mode, ModeRuns], report: Report) -> CheckResult:
    by_id = {t.trial_id: t for t in plan.trials}
    n = 0
    divergent = 0
    for mode, runs in all_runs.items():
        for tid, again in runs.repeats.items():
            n += 1
            d = first_divergence(runs.trials[tid], again)
            if d is not None:
                divergent += 1
                report.divergences.append(
                    _record("repeatability", mode, plan, by_id[tid], by_id[tid].target, again, d))
    if n == 0:
        return CheckResult("repeatability", requirement, "vacuous", 0, 0, {}, "no trial was repeated")
    verdict = "fail" if divergent else "pass"
    msg = f"{divergent} of {n} repeated trials differed" if divergent else f"{n} repeated trials bitwise equal"
    return CheckResult("repeatability", requirement, verdict, n, divergent,  # type: ignore[arg-type]
                       {"modes": sorted(all_runs)}, msg)


def judge(plan: Plan, all_runs: dict[Mode, ModeRuns], report: Report) -> None:
    checks = plan.config.checks
    if checks.invariance != "off" and "invariant" in all_runs:
        report.checks.append(judge_against_solo("invariance", checks.invariance, plan, "invariant",
                                                all_runs["invariant"], report))
    if checks.repeatability != "off":
        report.checks.append(judge_repeatability(checks.repeatability, plan, all_runs, report))
    if checks.drift != "off" and "production" in all_runs:
        report.checks.append(judge_against_solo("drift", checks.drift, plan, "production",
                                                all_runs["production"], report))


def run(config: Config, *, seed: int | None = None, observer: Observer | None = None,
        report_dir: Path | None = None, on_plan: Callable[[Plan], None] | None = None) -> Report:
    """Run every check of `config`; writes `report.json` (also a partial one on an engine error)."""
    observer = observer or Observer()
    t0 = time.perf_counter()
    plan = plan_run(config, seed)
    observer.seed(plan.seed)
    if on_plan:
        on_plan(plan)
    report = Report(
        oracle_version=__version__, seed=plan.seed, config=config.model_dump(mode="json"),
        config_digest=config.digest(), environment=collect_environment(),
    )
    report.environment["model_dir"] = str(plan.model_dir)
    report.environment["targets"] = len(plan.targets)
    report.environment["trials"] = len(plan.trials)
    out_dir = report_dir or Path(config.report_dir)
    all_runs: dict[Mode, ModeRuns] = {}
    try:
        for mode in ("invariant", "production"):
            runs = all_runs[mode] = ModeRuns()
            try:
                run_mode(plan, mode, runs, observer)
            finally:
                report.timings[f"{mode}_s"] = round(runs.seconds, 3)
        report.complete = True
    except EngineError as e:
        report.error = str(e)
    finally:
        # Judge what completed, so an engine failure or Ctrl-C still leaves a useful report.
        done = {m: r for m, r in all_runs.items() if r.trials or r.solo}
        report.environment["engines"] = {m: r.engine for m, r in all_runs.items()}
        judge(plan, done, report)
        report.timings["total_s"] = round(time.perf_counter() - t0, 3)
        report.write(out_dir)
    return report
