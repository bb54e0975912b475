"""plan: what a run will do, before any engine starts: the model, the targets, the schedule.

Everything here is checked before the first forward pass (config, engine kind, prompts, golden
file, model), so a mistake in any of them costs seconds, not a run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from oracle.config import Config
from oracle.contract import Request, SamplingParams
from oracle.errors import ConfigError
from oracle.prompts import Target
from oracle.schedule import Trial, filler_tokens


@dataclass(frozen=True)
class Plan:
    config: Config
    model_dir: Path
    targets: tuple[Target, ...]
    trials: tuple[Trial, ...]  # the schedule: trial ids 0..N-1
    seed: int
    vocab_size: int


def resolve_model(config: Config) -> Path:
    """The model directory of a run (`preset:NAME`, a checkpoint directory or a hub id), checked against its
    engine before anything runs; ModelError otherwise.

    A relative directory resolves against the config's folder. Engines that only talk to a server
    (`openai`) or are a user's own need no weights; the native engine's architecture is checked
    from config.json here, so an unsupported model fails before the first trial.
    """
    from oracle.engines import check_model, needs_weights
    from oracle.models.hub import is_hub_id
    from oracle.models.resolve import PRESET_PREFIX
    from oracle.models.resolve import resolve_model as resolve_spec

    spec = config.model
    if not spec.startswith(PRESET_PREFIX):
        local = config.resolve_path(spec)
        if local.exists() or not is_hub_id(spec):
            spec = str(local)
    if config.model_revision is not None and not is_hub_id(spec):
        raise ConfigError(f"model_revision: applies to hub ids (org/name) only, not to {config.model!r}")
    path = resolve_spec(spec, seed=config.model_seed, revision=config.model_revision,
                         weights=needs_weights(config.engine))
    check_model(config.engine, path)
    return path


def draw_seed(config: Config, seed: int | None) -> int:
    if seed is not None:
        return seed
    return config.schedule.seed if config.schedule.seed is not None else random.SystemRandom().randrange(2**32)


def plan_run(config: Config, seed: int | None = None) -> Plan:
    from oracle.engines import check_engine_config
    from oracle.golden import golden_path, read_golden
    from oracle.models.context import check_context
    from oracle.prompts import check_prompts, load_targets, vocab_size_of
    from oracle.schedule import draw_schedule

    seed = draw_seed(config, seed)
    check_engine_config(config.engine)
    check_prompts(config)
    if config.checks.golden.requirement != "off":
        read_golden(golden_path(config))  # type: ignore[arg-type]
    model_dir = resolve_model(config)
    targets = tuple(load_targets(config, model_dir))
    check_context(config, model_dir, targets)
    trials = tuple(draw_schedule(config.schedule, [len(t.token_ids) for t in targets], seed))
    return Plan(config, model_dir, targets, trials, seed, vocab_size_of(model_dir))


def target_sampling(config: Config, max_tokens: int | None = None) -> SamplingParams:
    s = config.sampling
    return SamplingParams(max_tokens or s.max_tokens, s.temperature, s.seed, s.logits)


def solo_request(plan: Plan, target: int, prefix: str = "solo") -> Request:
    t = plan.targets[target]
    return Request(f"{prefix}-{t.name}", t.token_ids, target_sampling(plan.config))


def trial_requests(plan: Plan, trial: Trial) -> tuple[list[Request], int]:
    """The requests of a trial and the index of its target among them."""
    s = plan.config.sampling
    target = plan.targets[trial.target]
    fillers = [
        Request(f"trial{trial.trial_id}-filler{j}", filler_tokens(f, plan.vocab_size, target.token_ids),
                SamplingParams(f.max_tokens, s.temperature, f.seed, "none"), arrival_step=f.arrival_step)
        for j, f in enumerate(trial.fillers)
    ]
    req = Request(f"trial{trial.trial_id}-{target.name}", target.token_ids, target_sampling(plan.config),
                  arrival_step=trial.target_arrival_step)
    return fillers[: trial.position] + [req] + fillers[trial.position :], trial.position
