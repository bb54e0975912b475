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
