"""Turn a model spec from a config or the command line into a checkpoint directory.

A spec is `preset:NAME` (made into a cache on first use), a checkpoint directory, or a Hugging
Face hub id `org/name` (fetched into the hub cache, see `oracle.models.hub`). A directory on
disk wins over a hub id of the same spelling.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from oracle.errors import ModelError
from oracle.models.checkpoint import checkpoint_problem
from oracle.models.facts import CONFIG_FILE

if TYPE_CHECKING:
    from oracle.models.facts import ModelFacts

PRESET_PREFIX = "preset:"
def resolve_model(spec: str, *, seed: int = 0, cache_dir: Path | None = None, revision: str | None = None,
                  weights: bool = True) -> Path:
    """The checkpoint directory for `spec`: a directory path, `preset:NAME` (made on first use), or a hub id.

    Raises ModelError naming the path or id and what is missing, ConfigError for an unknown preset.
    `revision` applies to hub ids only; `weights=False` accepts a directory without weights.
    """
    return read_checkpoint(spec, seed=seed, cache_dir=cache_dir, revision=revision, weights=weights).model_dir


def read_checkpoint(spec: str, *, seed: int = 0, cache_dir: Path | None = None, revision: str | None = None,
                    weights: bool = True) -> ModelFacts:
    """`resolve_model`'s checkpoint with its facts (oracle.models.facts), its config.json read once."""
    from oracle.models.facts import read_model_facts

    if spec.startswith(PRESET_PREFIX):
        from oracle.models.cache import ensure_model  # torch is imported only when a model is made

        return read_model_facts(ensure_model(spec[len(PRESET_PREFIX) :], cache_dir=cache_dir, seed=seed))
    from oracle.models.hub import fetch, is_hub_id

    if is_hub_id(spec):
        path = fetch(spec, revision, weights=weights)
        facts = read_model_facts(path)
        problem = checkpoint_problem(path, weights, facts)
        if problem is not None:
            raise ModelError(f"model {spec}: the hub snapshot {path} {problem}")
        return facts
    path = Path(spec).expanduser().absolute()
    facts = read_model_facts(path)
    problem = checkpoint_problem(path, weights, facts)
    if problem is not None:
        raise ModelError(
            f"model {path} {problem}; give a directory with {CONFIG_FILE} and model.safetensors, "
            f"a hub id (org/name), make one with `oracle model make PRESET DIR`, or use `preset:NAME`"
        )
    return facts
