"""Localize on an engine: name the op where a target's bits first moved (`oracle localize REPORT.json`).

The engine captures itself (`Capturable.capture(run, rows)`, oracle.engines.contract) or, when its model
runs in a worker process, localizes there (`LocalizesInWorker.localize(expected, actual, repro_dir)`, vLLM);
`oracle.capture` holds the capture, the rule, the confirmation and the repro. This module is the
entry the runner and the CLI use, beside `oracle.replay`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from oracle.capture import LocalizedOp, localize_with
from oracle.engines.contract import (
    CAPTURE_HOW,
    Capturable,
    Engine,
    LocalizesInWorker,
    Mode,
    Request,
    RunSpec,
    capabilities,
)
from oracle.errors import ConfigError, EngineError

__all__ = ["LocalizedOp", "RunSpec", "can_localize", "localize_from_report", "localize_runs", "localize_trial"]


def can_localize(engine: object) -> bool:
    """True for engines that capture themselves (native, transformers) or localize in their worker (vLLM):
    `Capabilities.localizes` (oracle.engines.contract)."""
    return capabilities(engine).localizes


def localize_runs(engine: Engine, expected: RunSpec, actual: RunSpec,
                  repro_dir: Path | None = None) -> LocalizedOp | None:
    """Capture both runs on `engine`, name where the target's rows first differ (None: nowhere), confirm it.

    Both runs start from a reset prefix cache. The engine keeps its mode: pass the engine whose
    runs diverged (the invariant one for an invariance failure).
    """
    declared = capabilities(engine)
    if declared.localize and isinstance(engine, LocalizesInWorker):
        return engine.localize(expected, actual, repro_dir)
    if not (declared.capture and isinstance(engine, Capturable)):
        raise EngineError(f"localize: cannot capture ops of engine {type(engine).__name__} "
                          "(native, transformers and vLLM engines can)")
    return localize_with(engine.capture, expected, actual, repro_dir=repro_dir, imports=declared.op_packages)


def localize_trial(engine: Engine, solo_requests: Sequence[Request], trial_requests: Sequence[Request],
                   target_index: int, max_num_batched_tokens: int | None = None,
                   repro_dir: Path | None = None) -> LocalizedOp | None:
    """Where the target of a failing trial departs from its solo run.

    `solo_requests`: the target alone (its first request is the target), run with the engine's
    default budget, as the reference is; `trial_requests[target_index]` is the target within the
    trial, run with the trial's per-pass token budget `max_num_batched_tokens`.
    """
    return localize_runs(engine, RunSpec(tuple(solo_requests), 0),
                         RunSpec(tuple(trial_requests), target_index, max_num_batched_tokens), repro_dir)


def localize_from_report(report_path: Path, trial_id: int, repro_dir: Path | None = None, *,
                         trusted: bool = False) -> LocalizedOp | None:
    """`oracle localize REPORT.json --trial ID`: rebuild the trial from the report and localize it.

    Writes the one-op repro to `repro_dir` when given. Runs on a fresh engine in the mode the report's divergence for that trial was found in
    (invariant when the report holds none); ConfigError when the trial is not in the report, and when
    the engine declares no capture capability (saying how to add one). Under the watchdog as `oracle run` is: the
    engine's start, the captured runs and close each have their deadline (oracle.lifecycle.watchdog), so a
    hang is an EngineError (exit 3) naming the phase.
    """
    from oracle.lifecycle.watchdog import LOCALIZE_CALLS, start_engine
    from oracle.plan import Plan, resolve_model, solo_request, trial_requests
    from oracle.prompts import load_targets
    from oracle.replay import find_trial, report_config, require_trials
    from oracle.report import load_report

    report = load_report(report_path)
    require_trials(report, report_path)
    config = report_config(report, report_path, trusted=trusted)  # a config that loads code needs `trusted`
    trial, recorded = find_trial(report, trial_id)
    mode: Mode = recorded.mode if recorded else "invariant"
    model = resolve_model(config)
    plan = Plan(config, model, tuple(load_targets(config, model)), (trial,), report.seed,
                model.require_vocab_size())
    if not 0 <= trial.target < len(plan.targets):  # a hand-edited trial: exit 2 naming it, as replay says
        raise ConfigError(f"--trial: trial {trial_id} names target {trial.target}, the config has "
                          f"{len(plan.targets)}")
    engine = start_engine(config.engine, plan.model_dir, mode)
    try:
        if not can_localize(engine):  # a capability the engine does not declare: not an engine failure
            raise ConfigError(f"localize: engine {config.engine.kind} {CAPTURE_HOW}")
        requests, at = trial_requests(plan, trial)
        solo = [solo_request(plan, trial.target)]
        return engine.guarded(lambda inner: localize_trial(inner, solo, requests, at, trial.max_num_batched_tokens,
                                                           repro_dir=repro_dir), "localize", calls=LOCALIZE_CALLS)
    finally:
        engine.close()
