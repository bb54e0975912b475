"""Made-on-first-use models in a cache directory, safe when processes race to make them."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from oracle.errors import ModelError
from oracle.models.checkpoint import is_checkpoint_dir
from oracle.models.make import (
    as_preset,
    check_seed,
    make_staging_dir,
    marker_dict,
    publish,
    read_marker,
    write_checkpoint,
)
from oracle.models.presets import ModelPreset


def default_cache_dir() -> Path:
    """Where cached models live: `$ORACLE_CACHE_DIR`, else `$XDG_CACHE_HOME/oracle/models`,
    else `~/.cache/oracle/models`. Each model is a `<preset>-seed<seed>` directory in it."""
    configured = os.environ.get("ORACLE_CACHE_DIR")
    if configured:
        return Path(configured).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "oracle" / "models"


def cached_model_dir(preset: str | ModelPreset, cache_dir: Path | None = None, seed: int = 0) -> Path:
    """Where ensure_model keeps this preset and seed (whether or not it is made yet)."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return root.absolute() / f"{as_preset(preset).name}-seed{seed}"


def _is_current(model_dir: Path, preset: ModelPreset, seed: int) -> bool:
    return is_checkpoint_dir(model_dir) and read_marker(model_dir) == marker_dict(preset, seed)


def ensure_model(preset: str | ModelPreset, cache_dir: Path | None = None, seed: int = 0) -> Path:
    """The directory of this preset made with this seed under the cache, made on first use.

    A cached directory is reused only when its oracle_model.json matches the preset and seed and
    the current format version; otherwise it is remade and replaced. When several processes
    race, each makes its own copy in a staging directory and the first rename wins; the others
    keep the winner's (they are byte-identical) and delete their own.
    """
    resolved = as_preset(preset)
    check_seed(seed)
    target = cached_model_dir(resolved, cache_dir, seed)
    if _is_current(target, resolved, seed):
        return target
    # Said, so a first run's pause (and a new folder in the cache) is never a surprise.
    print(f"oracle: making the {resolved.name} model (seed {seed}) on first use, into {target}", file=sys.stderr)
    staging = make_staging_dir(target)
    try:
        write_checkpoint(resolved, staging, seed)
        stale = target.exists() and not _is_current(target, resolved, seed)
        publish(staging, target, replace=stale)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if not _is_current(target, resolved, seed):
        raise ModelError(f"cached model {target} is not the one just made; another process changed it")
    return target
