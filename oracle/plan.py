"""plan: what a run will do, before any engine starts: the model, the targets, the schedule.

Everything here is checked before the first forward pass (config, engine kind, prompts, golden
file, model), so a mistake in any of them costs seconds, not a run.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oracle.config import Config
from oracle.engines.contract import Request, SamplingParams
from oracle.errors import ConfigError
from oracle.prompts import Target
from oracle.schedule import Trial, filler_tokens
from oracle.shards.assign import Shard, make_shard

if TYPE_CHECKING:
    from oracle.engines.kinds import EngineKind
    from oracle.models.facts import ModelFacts
    from oracle.posture.hazards import HazardMatch


@dataclass(frozen=True)
class Plan:
    config: Config
    model: ModelFacts  # the checkpoint's facts, its config.json read once (oracle.models.facts)
    targets: tuple[Target, ...]
    trials: tuple[Trial, ...]  # the schedule: trial ids 0..N-1
    seed: int
    vocab_size: int
    # Failing trials of earlier runs from the example database (oracle.example_db), run first in invariant
    # mode: ids after the schedule's.
    replayed: tuple[Trial, ...] = ()
    # `oracle run --shard i/N`: `trials` holds this shard's slice of the schedule (oracle.shards.assign).
    shard: Shard | None = None
    # Known hazards of the posture the config asks for (matches or possible), whose probes the schedule holds,
    # and the probe sides the engine's limits ruled out: (`probe:side`, the limit).
    hazards: tuple[HazardMatch, ...] = ()
    unformed_probes: tuple[tuple[str, str], ...] = ()
    # The engine kind's row, resolved once when the run is planned (`oracle.engines.resolve_engine`).
    engine_kind: EngineKind | None = None
    # The golden file's contents (oracle.golden), read once when the run is planned; None with the check off.
    golden: dict[str, Any] | None = None

    @property
    def model_dir(self) -> Path:
        return self.model.model_dir

    @property
    def engine(self) -> EngineKind:
        """The engine kind's row: the one the plan resolved (a plan made by hand resolves it here)."""
        if self.engine_kind is not None:
            return self.engine_kind
        from oracle.engines.kinds import kind_of

        return kind_of(self.config.engine)


def resolve_model(config: Config, engine: EngineKind | None = None) -> ModelFacts:
    """The model of a run (`preset:NAME`, a checkpoint directory or a hub id): its directory and its facts,
    config.json read once here, checked against its engine before anything runs; ModelError otherwise.

    A relative directory resolves against the config's folder. Engines that only talk to a server
    (`openai`) need no weights, nor a user's own whose class says `needs_weights = False`; the native engine's architecture is checked
    from config.json here, so an unsupported model fails before the first trial, and so is the size
    of the weights (oracle.models.size): absurd dimensions are refused before anything is allocated.
    `engine`: the engine kind's row, when the caller resolved it.
    """
    from oracle.engines import check_model, check_model_size, needs_weights
    from oracle.models.hub import is_hub_id
    from oracle.models.resolve import PRESET_PREFIX, read_checkpoint

    spec = config.model
    if not spec.startswith(PRESET_PREFIX):
        local = config.resolve_path(spec)
        if local.exists() or not is_hub_id(spec):
            spec = str(local)
    if config.model_revision is not None and not is_hub_id(spec):
        raise ConfigError(f"model_revision: applies to hub ids (org/name) only, not to {config.model!r}")
    facts = read_checkpoint(spec, seed=config.model_seed, revision=config.model_revision,
                            weights=needs_weights(config.engine, engine))
    check_model(config.engine, facts, engine)
    check_model_size(config.engine, facts, row=engine)  # the weights alone: absurd dimensions stop here
    return facts


def draw_seed(config: Config, seed: int | None) -> int:
    if seed is not None:
        return seed
    return config.schedule.seed if config.schedule.seed is not None else random.SystemRandom().randrange(2**32)


def plan_run(config: Config, seed: int | None = None) -> Plan:
    from oracle.engines import check_model_size, resolve_engine
    from oracle.golden import golden_path, read_golden
    from oracle.models.context import check_context
    from oracle.posture.probes import make_probes
    from oracle.prompts import check_prompts, load_targets
    from oracle.schedule import draw_schedule

    seed = draw_seed(config, seed)
    engine = resolve_engine(config.engine)  # the engine's row, once for the run
    check_prompts(config)
    golden = read_golden(golden_path(config)) if config.checks.golden.requirement != "off" else None  # type: ignore[arg-type]
    model = resolve_model(config, engine)
    targets = tuple(load_targets(config, model))
    check_context(config, model, targets)
    trials = tuple(draw_schedule(config.schedule, [len(t.token_ids) for t in targets], seed))
    vocab = model.require_vocab_size()
    hazards = tuple(declared_hazard_matches(config, model, engine))
    specs = [spec for m in hazards for spec in m.hazard.probes]
    probes = make_probes(config, targets, model, seed, len(trials), vocab, specs)  # after the drawn trials
    targets, trials = targets + probes.targets, trials + probes.trials
    check_model_size(config.engine, model, kv_tokens(config, targets, trials), row=engine)
    return Plan(config, model, targets, trials, seed, vocab, hazards=hazards, unformed_probes=probes.unformed,
                engine_kind=engine, golden=golden)


def merged_plan(config: Config, model: ModelFacts, targets: Sequence[Target], trials: Sequence[Trial],
                seed: int) -> Plan:
    """The plan `oracle merge` judges by: the shards' config, targets and whole schedule, the model's facts as
    the shards read them; no engine resolved and no tokenizer or weights read (a passing merge needs neither)."""
    from oracle.golden import golden_path, read_golden

    golden = read_golden(golden_path(config)) if config.checks.golden.requirement != "off" else None  # type: ignore[arg-type]
    return Plan(config, model, tuple(targets), tuple(trials), seed, 0, golden=golden)


def hazard_inputs(config: Config, model: ModelFacts) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a hazard's conditions read besides the posture: the model's facts and the sampling."""
    s = config.sampling
    return model.hazard_facts(), {"temperature": s.temperature, "max_tokens": s.max_tokens}


def declared_hazard_matches(config: Config, model: ModelFacts, engine: EngineKind | None = None) -> list[HazardMatch]:
    """The known hazards (shipped and the config's own file) the config's invariant posture matches or may match."""
    from oracle.engines.kinds import declared_posture
    from oracle.posture.hazards import hazards_for, match_hazards

    if config.checks.invariance.requirement == "off":
        return []
    facts, sampling = hazard_inputs(config, model)
    return match_hazards(declared_posture(config.engine, "invariant", engine), facts, sampling, hazards_for(config))


def kv_tokens(config: Config, targets: Sequence[Target], trials: Sequence[Trial]) -> int:
    """The most KV cache tokens one generate call of the run holds: its sequences' prompts and generated
    tokens together, each rounded up to whole blocks (a solo reference, or the largest trial)."""
    block = config.engine.block_size
    new = config.sampling.max_tokens

    def blocks(n: int) -> int:
        return -(-n // block) * block

    solo = max((blocks(len(t.token_ids) + new) for t in targets), default=0)
    largest = max((blocks(len(targets[t.target].token_ids) + new) + sum(blocks(f.length + f.max_tokens)
                                                                         for f in t.fillers)
                   for t in trials), default=0)
    return max(solo, largest)


def target_sampling(config: Config, max_tokens: int | None = None) -> SamplingParams:
    s = config.sampling
    return SamplingParams(max_tokens or s.max_tokens, s.temperature, s.seed, s.logits)


def solo_request(plan: Plan, target: int, prefix: str = "solo") -> Request:
    t = plan.targets[target]
    return Request(f"{prefix}-{t.name}", t.token_ids, target_sampling(plan.config))


def trial_requests(plan: Plan, trial: Trial) -> tuple[list[Request], int]:
    """The requests of a trial and the index of its target among them.

    Request ids say where they come from (`phase_of` reads them back): `trial{id}-...` for a trial
    of the schedule, `shrink{id}-...` for a candidate the shrinker ran.
    """
    s = plan.config.sampling
    target = plan.targets[trial.target]
    prefix = f"{'shrink' if trial.origin == 'shrink' else 'trial'}{trial.trial_id}"
    fillers = [
        Request(f"{prefix}-filler{j}", filler_tokens(f, plan.vocab_size, target.token_ids),
                SamplingParams(f.max_tokens, s.temperature, f.seed, "none"), arrival_step=f.arrival_step)
        for j, f in enumerate(trial.fillers)
    ]
    req = Request(f"{prefix}-{target.name}", target.token_ids, target_sampling(plan.config),
                  arrival_step=trial.target_arrival_step)
    return fillers[: trial.position] + [req] + fillers[trial.position :], trial.position


# Request id prefixes the plan gives (solo_request, trial_requests) -> the phase. A check's runs name their
# phase themselves (their row's `CheckRun.phase`, through oracle.execute.generate).
_PHASES = (("solo-", "references"),)
_NUMBERED = (("shrink", "shrinking (trial {n})"), ("trial", "trial {n}"))


def phase_of(request_ids: Sequence[str]) -> str:
    """Which phase of a run a generate call belongs to, read from its request ids (for a hang's message):
    references, trial N, shrinking (trial N); else the first request's id."""
    if not request_ids:
        return "generate call with no requests"
    first = request_ids[0]  # a trial's requests share its prefix
    for prefix, phase in _PHASES:
        if first.startswith(prefix):
            return f"{phase} (request {first})"
    for word, phase in _NUMBERED:
        number, dash, _ = first.removeprefix(word).partition("-")
        if first.startswith(word) and dash and number.isdigit():
            return phase.format(n=int(number))
    return f"run of request {first}"


def slice_plan(plan: Plan, index: int, count: int) -> Plan:
    """`plan` with only shard `index` of `count`'s trials (ConfigError for what a shard cannot run)."""
    schedule = plan.config.schedule
    if schedule.search.trials:
        raise ConfigError("--shard: schedule.search runs after the whole schedule and steers by its results; "
                          "set schedule.search.trials to 0 for a sharded run")
    if plan.replayed:
        raise ConfigError("--shard: --db replays earlier failures before the schedule; run them unsharded")
    shard = make_shard(plan.trials, plan.targets, plan.config.sampling.max_tokens, schedule.repeat_trials,
                       index, count)
    keep = set(shard.trial_ids)
    return replace(plan, trials=tuple(t for t in plan.trials if t.trial_id in keep), shard=shard)
