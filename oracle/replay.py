"""`oracle replay REPORT.json --trial ID`: rerun one trial of a report and show its divergence again.

The trial runs exactly as `oracle run` ran it: the solo reference and the trial each from a cold
prefix cache, with the trial's own token budget, so a replay agrees with the report (shrink
candidates included: they are trials of the report like any other).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oracle.compare import Divergence, first_divergence
from oracle.config import Config, parse_config
from oracle.engines.contract import Mode
from oracle.errors import ConfigError
from oracle.report import DivergenceRecord, Report, load_report
from oracle.schedule import Trial
from oracle.trust import named_server


@dataclass(frozen=True)
class Replay:
    trial: Trial
    mode: Mode
    divergence: Divergence | None
    recorded: DivergenceRecord | None  # the report's divergence record for this trial, if any


def find_trial(report: Report, trial_id: int, check: str | None = None) -> tuple[Trial, DivergenceRecord | None]:
    recorded = _recorded(report, trial_id, check)
    row = report.trial(trial_id)
    if row is None and recorded is not None:
        row = recorded.trial
    if row is None:
        ids = [t.trial_id for t in report.schedule]
        span = f" (it has trials {min(ids)}..{max(ids)})" if ids else ""
        raise ConfigError(f"--trial: no trial {trial_id} in this report{span}")
    return Trial.from_json(row.model_dump()), recorded


def _recorded(report: Report, trial_id: int, check: str | None) -> DivergenceRecord | None:
    """The report's first divergence record of the trial (of `check`, when given) that holds the trial."""
    return next((d for d in report.divergences if d.trial_id == trial_id and d.trial is not None
                 and (check is None or d.check == check)), None)


def credentials_sent(config: Mapping[str, Any], environ: Mapping[str, str]) -> list[str]:
    """What of the user's environment a re-run of `config` would send to its named server: each redacted
    field (restored from the environment) and OPENAI_API_KEY, which the openai engine sends when the
    config gives no api_key."""
    from oracle.redaction import redacted_paths

    if named_server(config) is None:
        return []
    sent = [".".join(str(p) for p in path) for path, _ in redacted_paths(config)]
    options = config["engine"]["options"]
    if not options.get("api_key") and environ.get("OPENAI_API_KEY"):
        sent.append("OPENAI_API_KEY")
    return sent


def require_trials(report: Report, source: Path) -> None:
    """ConfigError (exit 2) for a partial report that holds no trial (the run stopped before any ran: a config
    or command-line error, an engine that did not start): there is nothing to replay or localize."""
    if report.complete or report.schedule or any(d.trial is not None for d in report.divergences):
        return
    why = (report.error or "no reason recorded").splitlines()[0][:300]
    raise ConfigError(f"{source}: a partial report (the run stopped before any trial ran: {why}); it has no "
                      "trials to replay")


def report_config(report: Report, source: Path, *, trusted: bool) -> Config:
    """The report's config, to run again: refused (ConfigError, exit 2, naming the fields) when it would
    load or run code (oracle.trust) and `trusted` is off; the secrets redacted when it was written are
    taken from the environment (oracle.redaction.restore_secrets): ConfigError naming each variable to
    set, never a run with `<redacted: ...>` as a key."""
    from oracle.redaction import restore_secrets
    from oracle.trust import require_trust

    require_trust(source, report.config, trusted)
    # A credential never goes to a server that only a report names: the report may come from someone
    # else's CI and its base_url be their server. Refused rather than sent without a key: a run without
    # it would fail at the server (or reach another tier of it) and read as the server's fault.
    sent = credentials_sent(report.config, os.environ)
    if sent and not trusted:
        raise ConfigError(f"{source}: its config sends requests to {named_server(report.config)} "
                          f"(engine.options.base_url, named by the report) with credentials from your environment "
                          f"({', '.join(sent)}); pass --trust-report if you trust where this report came from")
    return parse_config(restore_secrets(report.config, source=str(source)), source=str(source))


def replay(report_path: Path, trial_id: int, mode: Mode | None = None, *, trusted: bool = False) -> Replay:
    """Rerun trial `trial_id` of the report at `report_path`. `trusted`: the report's config may load code
    (`--trust-report`); without it such a config is refused before anything runs."""
    from oracle.execute import fresh
    from oracle.plan import Plan, resolve_model, solo_request, trial_requests
    from oracle.prompts import load_targets

    report = load_report(report_path)
    require_trials(report, report_path)
    config = report_config(report, report_path, trusted=trusted)
    trial, recorded = find_trial(report, trial_id)
    mode = mode or (recorded.mode if recorded else "invariant")
    model = resolve_model(config)
    plan = Plan(config, model, tuple(load_targets(config, model)), (trial,), report.seed,
                model.require_vocab_size())
    if not 0 <= trial.target < len(plan.targets):
        raise ConfigError(f"--trial: trial {trial_id} names target {trial.target}, the config has "
                          f"{len(plan.targets)}")
    from oracle.lifecycle.watchdog import start_engine

    engine = start_engine(config.engine, plan.model_dir, mode)  # under the watchdog, as `oracle run` is
    try:
        solo = fresh(engine, [solo_request(plan, trial.target)])[0]
        requests, at = trial_requests(plan, trial)
        out = fresh(engine, requests, trial.max_num_batched_tokens)[at]
    finally:
        engine.close()
    return Replay(trial, mode, first_divergence(solo, out), recorded)
