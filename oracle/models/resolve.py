"""Turn a model spec from a config or the command line into a checkpoint directory.

A spec is `preset:NAME` (made into a cache on first use), a checkpoint directory, or a Hugging
Face hub id `org/name` (fetched into the hub cache, see `oracle.models.hub`). A directory on
disk wins over a hub id of the same spelling.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from oracle.errors import ConfigError, ModelError

if TYPE_CHECKING:
    from oracle.config import Config

PRESET_PREFIX = "preset:"
CONFIG_FILE = "config.json"
# Single-file and sharded safetensors checkpoints; the native engine reads nothing else.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


def checkpoint_problem(path: Path, weights: bool = True) -> str | None:
    """Why `path` is not a loadable checkpoint directory, or None when it is one.

    With `weights=False` a config.json is enough (engines that do not run the model themselves).
    """
    if not path.exists():
        return "does not exist"
    if not path.is_dir():
        return "is not a directory"
    config = path / CONFIG_FILE
    if not config.is_file():
        return f"has no {CONFIG_FILE}"
    try:
        parsed = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"has an unreadable {CONFIG_FILE} ({exc})"
    if not isinstance(parsed, dict):
        return f"has a {CONFIG_FILE} that is not a JSON object"
    if weights and not any((path / name).is_file() for name in WEIGHT_FILES):
        return f"has no weights ({' or '.join(WEIGHT_FILES)})"
    return None


def is_checkpoint_dir(path: Path) -> bool:
    """True when `path` holds config.json and safetensors weights."""
    return checkpoint_problem(Path(path)) is None


def resolve_model(spec: str, *, seed: int = 0, cache_dir: Path | None = None, revision: str | None = None,
                  weights: bool = True) -> Path:
    """The checkpoint directory for `spec`: a directory path, `preset:NAME` (made on first use), or a hub id.

    Raises ModelError naming the path or id and what is missing, ConfigError for an unknown preset.
    `revision` applies to hub ids only; `weights=False` accepts a directory without weights.
    """
    if spec.startswith(PRESET_PREFIX):
        from oracle.models.cache import ensure_model  # torch is imported only when a model is made

        return ensure_model(spec[len(PRESET_PREFIX) :], cache_dir=cache_dir, seed=seed)
    from oracle.models.hub import fetch, is_hub_id

    if is_hub_id(spec):
        path = fetch(spec, revision, weights=weights)
        problem = checkpoint_problem(path, weights)
        if problem is not None:
            raise ModelError(f"model {spec}: the hub snapshot {path} {problem}")
        return path
    path = Path(spec).expanduser().absolute()
    problem = checkpoint_problem(path, weights)
    if problem is not None:
        raise ModelError(
            f"model {path} {problem}; give a directory with {CONFIG_FILE} and model.safetensors, "
            f"a hub id (org/name), make one with `oracle model make PRESET DIR`, or use `preset:NAME`"
        )
    return path


def resolve_for_run(config: Config) -> Path:
    """The model directory of a run, checked against its engine before anything runs.

    A relative directory resolves against the config's folder. Engines that only talk to a server
    (`openai`) or are a user's own need no weights; the native engine's architecture is checked
    from config.json here, so an unsupported model fails before the first trial.
    """
    from oracle.engines import check_model, needs_weights
    from oracle.models.hub import is_hub_id

    spec = config.model
    if not spec.startswith(PRESET_PREFIX):
        local = config.resolve_path(spec)
        if local.exists() or not is_hub_id(spec):
            spec = str(local)
    if config.model_revision is not None and not is_hub_id(spec):
        raise ConfigError(f"model_revision: applies to hub ids (org/name) only, not to {config.model!r}")
    path = resolve_model(spec, seed=config.model_seed, revision=config.model_revision,
                         weights=needs_weights(config.engine))
    check_model(config.engine, path)
    return path
