"""The model's context window against the config: checked once the model is known, before any run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from oracle.config import Config
    from oracle.models.facts import ModelFacts
    from oracle.prompts import Target


def check_context(config: Config, facts: ModelFacts, targets: Sequence[Target]) -> None:
    """Every sequence a run makes (prompt plus generated tokens) fits the model's context.

    Raises ConfigError `file:line: field: ...` blaming sampling.max_tokens (or the prompts, when a
    prompt alone is too long) and schedule.filler_len for fillers.
    """
    context = facts.context
    if context is None:
        return
    where = f"the model's context of {context} tokens (max_position_embeddings in {facts.path})"
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
