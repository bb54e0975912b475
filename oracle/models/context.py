"""The model's context window against the config: checked once the model is known, before any run."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from oracle.config import Config
    from oracle.prompts import Target

# Keys Hugging Face configs use for the context length, most common first.
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def model_context(model_dir: Path) -> int | None:
    """The context length config.json declares, or None when it declares none (or is unreadable)."""
    try:
        raw: Any = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict):
        return None
    for key in CONTEXT_KEYS:
        value = raw.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def check_context(config: Config, model_dir: Path, targets: Sequence[Target]) -> None:
    """Every sequence a run makes (prompt plus generated tokens) fits the model's context.

    Raises ConfigError `file:line: field: ...` blaming sampling.max_tokens (or the prompts, when a
    prompt alone is too long) and schedule.filler_len for fillers.
    """
    context = model_context(model_dir)
    if context is None:
        return
    where = f"the model's context of {context} tokens (max_position_embeddings in {model_dir / 'config.json'})"
    max_tokens = config.sampling.max_tokens
    if targets:
        longest = max(targets, key=lambda t: len(t.token_ids))
        n = len(longest.token_ids)
        if n >= context:
            raise config.error(("prompts",), f"prompt {longest.name!r} has {n} tokens: not below {where}")
        if n + max_tokens > context:
            raise config.error(("sampling", "max_tokens"), f"prompt {longest.name!r} ({n} tokens) + max_tokens "
                               f"{max_tokens} = {n + max_tokens} exceeds {where}")
    filler = config.schedule.filler_len[1] + config.schedule.filler_max_tokens[1]
    if filler > context:
        raise config.error(("schedule", "filler_len"), f"the longest filler (filler_len max + filler_max_tokens "
                           f"max = {filler} tokens) exceeds {where}")
