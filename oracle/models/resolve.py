"""Turn a model spec from a config or the command line into a checkpoint directory."""

from __future__ import annotations

import json
from pathlib import Path

from oracle.errors import ModelError

PRESET_PREFIX = "preset:"
CONFIG_FILE = "config.json"
# Single-file and sharded safetensors checkpoints; the native engine reads nothing else.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


def checkpoint_problem(path: Path) -> str | None:
    """Why `path` is not a loadable checkpoint directory, or None when it is one."""
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
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        return f"has no weights ({' or '.join(WEIGHT_FILES)})"
    return None


def is_checkpoint_dir(path: Path) -> bool:
    """True when `path` holds config.json and safetensors weights."""
    return checkpoint_problem(Path(path)) is None


def resolve_model(spec: str, *, seed: int = 0, cache_dir: Path | None = None) -> Path:
    """The checkpoint directory for `spec`: a directory path, or `preset:NAME` (made on first use).

    Raises ModelError naming the path and what is missing, ConfigError for an unknown preset.
    Hub ids are not fetched: oracle assumes no network.
    """
    if spec.startswith(PRESET_PREFIX):
        from oracle.models.cache import ensure_model  # torch is imported only when a model is made

        return ensure_model(spec[len(PRESET_PREFIX) :], cache_dir=cache_dir, seed=seed)
    path = Path(spec).expanduser().absolute()
    problem = checkpoint_problem(path)
    if problem is not None:
        raise ModelError(
            f"model {path} {problem}; give a directory with {CONFIG_FILE} and model.safetensors, "
            f"make one with `oracle model make PRESET DIR`, or use `preset:NAME`"
        )
    return path
