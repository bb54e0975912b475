"""Write a preset as a Hugging Face checkpoint directory, atomically.

Everything is written into a hidden temporary directory beside the target and renamed into
place at the end, so a directory with the target's name is always complete. The same preset
and seed give byte-identical files: JSON keys are sorted, the safetensors header is fixed,
weights come from per-tensor seeded generators, and tokenizer training is deterministic.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from oracle.errors import ConfigError, ModelError
from oracle.models.hf_config import dump_json, make_config_dict, make_generation_config_dict
from oracle.models.layout import tensor_layout
from oracle.models.presets import ModelPreset, get_preset
from oracle.models.safetensors_file import write_safetensors
from oracle.models.tokenizer import make_tokenizer_config_dict, tokenizer_json
from oracle.models.weights import TORCH_DTYPES, iter_weights

# Bump when the same preset and seed would give different files (new init, new corpus, new
# keys): cached models made by an older oracle are then remade rather than reused.
MODEL_FORMAT_VERSION = 1
MARKER_FILE = "oracle_model.json"
WEIGHTS_FILE = "model.safetensors"

# (bytes written so far, total bytes of tensor data)
ProgressCallback = Callable[[int, int], None]


def as_preset(preset: str | ModelPreset) -> ModelPreset:
    return preset if isinstance(preset, ModelPreset) else get_preset(preset)


def marker_dict(preset: ModelPreset, seed: int) -> dict[str, Any]:
    """What oracle_model.json holds: enough to tell whether a cached model is still current.

    The description is left out: rewording it must not invalidate every cached model."""
    dims = {k: v for k, v in preset.to_dict().items() if k != "description"}
    return {"format_version": MODEL_FORMAT_VERSION, "preset": dims, "seed": seed}


def read_marker(model_dir: Path) -> dict[str, Any] | None:
    """The marker of a model made by oracle, or None (absent, unreadable, or not oracle's)."""
    try:
        data = json.loads((model_dir / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def check_seed(seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"model seed must be an integer, got {seed!r}")


def _counted(
    weights: Iterator[tuple[str, torch.Tensor]], total: int, progress: ProgressCallback | None
) -> Iterator[tuple[str, torch.Tensor]]:
    done = 0
    for name, tensor in weights:
        yield name, tensor
        done += tensor.numel() * tensor.element_size()
        if progress is not None:
            progress(done, total)


def write_checkpoint(
    preset: ModelPreset, directory: Path, seed: int = 0, progress: ProgressCallback | None = None
) -> None:
    """Write every file of the checkpoint into an existing, empty `directory` (not atomic)."""
    files = {
        "config.json": dump_json(make_config_dict(preset)),
        "generation_config.json": dump_json(make_generation_config_dict(preset)),
        "tokenizer_config.json": dump_json(make_tokenizer_config_dict(preset)),
        "tokenizer.json": tokenizer_json(preset.vocab_size),
    }
    for name, text in files.items():
        (directory / name).write_text(text, encoding="utf-8")
    metadata = {"format": "pt", "oracle_preset": preset.name, "oracle_seed": str(seed)}
    weights = _counted(iter_weights(preset, seed), preset.num_bytes, progress)
    write_safetensors(
        directory / WEIGHTS_FILE, tensor_layout(preset), weights, TORCH_DTYPES[preset.torch_dtype], metadata
    )
    # Last, so that a marker vouches for a directory whose other files are all written.
    (directory / MARKER_FILE).write_text(dump_json(marker_dict(preset, seed)), encoding="utf-8")


def _is_nonempty_dir_error(exc: OSError) -> bool:
    return exc.errno in (errno.ENOTEMPTY, errno.EEXIST)


def publish(staging: Path, target: Path, replace: bool) -> bool:
    """Rename the finished `staging` directory to `target`.

    Returns False, leaving `staging` in place, when `target` is a non-empty directory and
    `replace` is off (or another process published there first while we replaced): the caller
    decides whether what is there will do. An empty directory at `target` is replaced.
    """
    try:
        os.rename(staging, target)
        return True
    except OSError as exc:
        if not _is_nonempty_dir_error(exc):
            raise
    if not replace:
        return False
    # Move the old directory aside first: rename cannot replace a non-empty directory.
    retired = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
    with contextlib.suppress(FileNotFoundError):  # someone else retired it already
        os.rename(target, retired)
    try:
        os.rename(staging, target)
        return True
    except OSError as exc:
        if _is_nonempty_dir_error(exc):
            return False
        raise
    finally:
        shutil.rmtree(retired, ignore_errors=True)


def make_staging_dir(target: Path) -> Path:
    """A fresh hidden directory beside `target` (same filesystem, so rename is atomic)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    # mkdtemp makes the directory private (0700); a published model is as readable as any other.
    staging.chmod(0o755)
    return staging


def make_model(
    preset: str | ModelPreset,
    out_dir: Path,
    seed: int = 0,
    *,
    overwrite: bool = False,
    progress: ProgressCallback | None = None,
) -> Path:
    """Write the preset with seeded random weights as an HF checkpoint at `out_dir`; return it.

    Files: config.json, generation_config.json, model.safetensors, tokenizer.json,
    tokenizer_config.json and oracle_model.json (what made it). Raises ModelError when
    `out_dir` is a file, or a non-empty directory and `overwrite` is off.
    """
    resolved = as_preset(preset)
    check_seed(seed)
    target = Path(out_dir).expanduser().absolute()
    if target.exists() and not target.is_dir():
        raise ModelError(f"cannot write a model to {target}: it is a file")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise ModelError(f"cannot write a model to {target}: the directory is not empty (remove it first)")
    staging = make_staging_dir(target)
    try:
        write_checkpoint(resolved, staging, seed, progress)
        if not publish(staging, target, replace=overwrite):
            raise ModelError(f"cannot write a model to {target}: another process wrote there meanwhile")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
