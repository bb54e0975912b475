"""What makes a folder a checkpoint: config.json and, for engines that run the model, its weights."""

from __future__ import annotations

from pathlib import Path

from oracle.models.facts import ModelFacts, read_model_facts

# Single-file and sharded safetensors checkpoints; the native engine reads nothing else.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


def checkpoint_problem(path: Path, weights: bool = True, facts: ModelFacts | None = None) -> str | None:
    """Why `path` is not a loadable checkpoint directory, or None when it is one.

    With `weights=False` a config.json is enough (engines that do not run the model themselves). `facts`:
    the folder's config.json as already read (oracle.models.facts); else it is read here.
    """
    if not path.exists():
        return "does not exist"
    if not path.is_dir():
        return "is not a directory"
    problem = (facts or read_model_facts(path)).checkpoint_problem
    if problem is not None:
        return problem
    if weights and not any((path / name).is_file() for name in WEIGHT_FILES):
        return f"has no weights ({' or '.join(WEIGHT_FILES)})"
    return None


def is_checkpoint_dir(path: Path) -> bool:
    """True when `path` holds config.json and safetensors weights."""
    return checkpoint_problem(Path(path)) is None
