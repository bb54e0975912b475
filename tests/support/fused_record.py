"""Which way a native engine's decoder ran: `decoder.fused` at each eager forward pass (graph replays call none)."""

from __future__ import annotations

from typing import Any

import torch

from oracle.engines.native import NativeEngine


def record_fused(engine: NativeEngine) -> list[bool]:
    """`engine.decoder.fused` at each eager forward pass of `engine` from now on."""
    seen: list[bool] = []
    forward = engine.decoder.forward

    def recording(*args: Any) -> torch.Tensor:
        seen.append(engine.decoder.fused)
        return forward(*args)

    engine.decoder.forward = recording  # type: ignore[method-assign]
    return seen
