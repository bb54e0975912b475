"""The native engine with a planted fault at a declared hazard's threshold, for the known-hazard tests.

`HazardEngine` is `PlantedEngine` (tests/support/planted.py: invariant mode moves `aten.mm` of
`model.layers.1.mlp.down_proj` by one ULP in forward passes of more than `min_tokens` tokens) that
reports itself as the native engine, and states that posture as a class attribute, so a hazard
declared for `engine: native` matches it before it starts (its probes are scheduled) and after.
"""

from __future__ import annotations

from typing import Any, ClassVar

from planted import PlantedEngine


class HazardEngine(PlantedEngine):
    posture: ClassVar[dict[str, Any]] = {"engine": "native", "engine_version": "oracle"}

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "engine": "native"}


class BudgetBlindEngine(HazardEngine):
    """`HazardEngine` that ignores a trial's own token budget: every trial runs under the engine's
    `max_num_batched_tokens`, so a probe side planned by a budget (short_budget's `above`: a budget below the
    target's prompt) runs but does not form, and its pass evidence says so."""

    def generate(self, requests: Any, max_num_batched_tokens: int | None = None) -> list[Any]:
        return super().generate(requests, None)
