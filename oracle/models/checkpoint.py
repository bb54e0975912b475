"""What makes a folder a checkpoint: config.json and, for engines that run the model, its weights."""

from __future__ import annotations

import json
from pathlib import Path

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
