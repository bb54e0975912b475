"""Seeded random Hugging Face checkpoints made from named presets, and model path resolution.

Importing this package is cheap: presets and path checks load at once, while the names that need
torch or tokenizers (making weights, tokenizers, the cache) load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from oracle.models.checkpoint import checkpoint_problem, is_checkpoint_dir
from oracle.models.presets import PRESETS, ModelPreset, get_preset
from oracle.models.resolve import PRESET_PREFIX, resolve_model

if TYPE_CHECKING:
    from oracle.models.cache import cached_model_dir, default_cache_dir, ensure_model
    from oracle.models.hf_config import make_config_dict, make_generation_config_dict
    from oracle.models.make import make_model
    from oracle.models.tokenizer import build_tokenizer, make_tokenizer_config_dict
    from oracle.models.weights import build_state_dict, iter_weights

_LAZY = {
    "cached_model_dir": "oracle.models.cache",
    "default_cache_dir": "oracle.models.cache",
    "ensure_model": "oracle.models.cache",
    "make_config_dict": "oracle.models.hf_config",
    "make_generation_config_dict": "oracle.models.hf_config",
    "make_model": "oracle.models.make",
    "build_tokenizer": "oracle.models.tokenizer",
    "make_tokenizer_config_dict": "oracle.models.tokenizer",
    "build_state_dict": "oracle.models.weights",
    "iter_weights": "oracle.models.weights",
}

__all__ = [
    "PRESETS",
    "PRESET_PREFIX",
    "ModelPreset",
    "build_state_dict",
    "build_tokenizer",
    "cached_model_dir",
    "checkpoint_problem",
    "default_cache_dir",
    "ensure_model",
    "get_preset",
    "is_checkpoint_dir",
    "iter_weights",
    "make_config_dict",
    "make_generation_config_dict",
    "make_model",
    "make_tokenizer_config_dict",
    "resolve_model",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
