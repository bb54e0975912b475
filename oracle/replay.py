"""`oracle replay REPORT.json --trial ID`: rerun one trial of a report and show its divergence again."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oracle.compare import Divergence, first_divergence
from oracle.config import parse_config
from oracle.engines import build_engine
from oracle.engines.base import Mode, Request
from oracle.errors import ConfigError
from oracle.report import load_report
from oracle.runner import Plan, generate, resolve_model, target_sampling, trial_requests
from oracle.schedule import Trial


@dataclass(frozen=True)
class Replay:
    trial: Trial
    mode: Mode
    divergence: Divergence | None
    recorded: dict[str, Any] | None  # the report's divergence record for this trial, if any


def find_trial(report: dict[str, Any], trial_id: int) -> tuple[Trial, dict[str, Any] | None]:
    recorded = next((d for d in report.get("divergences", []) if d.get("trial_id") == trial_id), None)
    if recorded and recorded.get("trial"):
        return Trial.from_json(recorded["trial"]), recorded
    row = next((t for t in report.get("schedule", []) if t["trial_id"] == trial_id), None)
    if row is None:
        raise ConfigError(f"--trial: no trial {trial_id} in this report")
    return Trial.from_json(row), None


def replay(report_path: Path, trial_id: int, mode: Mode | None = None) -> Replay:
    from oracle.prompts import load_targets, vocab_size_of

    report = load_report(report_path)
    config = parse_config(report["config"], source=str(report_path))
    trial, recorded = find_trial(report, trial_id)
    mode = mode or ("production" if recorded and recorded.get("mode") == "production" else "invariant")
    model_dir = resolve_model(config)
    plan = Plan(config, model_dir, load_targets(config, model_dir), [trial], int(report["seed"]),
                vocab_size_of(model_dir))
    engine = build_engine(config.engine, model_dir, mode)
    try:
        target = plan.targets[trial.target]
        solo = generate(engine, [Request(f"solo-{target.name}", target.token_ids, target_sampling(config))])[0]
        requests, at = trial_requests(plan, trial)
        out = generate(engine, requests, trial.max_num_batched_tokens)[at]
    finally:
        engine.close()
    return Replay(trial, mode, first_divergence(solo, out), recorded)
