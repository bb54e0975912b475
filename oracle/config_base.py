"""What every section of the config shares: the strict base model, a check's requirement levels, and the bounds on
values and on the config file itself."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator

from oracle.strict_numbers import refuse_bools

Requirement = Literal["required", "warn", "off"]

# Sane upper bounds: a value beyond them is a typo, and would allocate terabytes or idle forever.
MAX_SEED = 2**63 - 1  # torch and vLLM take 64-bit seeds
MAX_TOKENS = 1 << 20  # tokens per prompt or completion (1M, beyond any model's context)
MAX_ARRIVAL_STEP = 10_000  # engine steps a request may wait before it arrives
MAX_TRIALS = 1_000_000
MAX_BATCH = 65_536  # sequences in one forward pass
MAX_BUDGET = 1 << 24  # tokens in one forward pass
MAX_TIMEOUT_S = 7 * 24 * 3600.0
# What a config file may be: its size, YAML aliases (an alias bomb expands exponentially) and nodes
# once aliases are expanded.
MAX_CONFIG_BYTES = 8 << 20
MAX_SET_DEPTH = 64  # `--set a.b.c=VALUE`: names plus VALUE's nesting (a config is a few levels deep)
MAX_YAML_ALIASES = 1000
MAX_YAML_NODES = 1_000_000


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    _no_bools = field_validator("*", mode="before")(classmethod(refuse_bools))  # `trials: true` is no count
