"""A native engine with a planted fault that needs a prefix-cache hit: a target whose prompt started from
cached blocks gets its first logprob (and logits row) one ULP off, in invariant mode only."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from oracle.config import EngineConfig
from oracle.engines.contract import Completion, Mode, Request
from oracle.engines.native import NativeEngine


class CacheHitFaultEngine(NativeEngine):
    def __init__(self, model: Path, mode: Mode, **options: Any) -> None:
        super().__init__(model, mode, EngineConfig.of("native", **options))

    def generate(self, requests: Sequence[Request], max_num_batched_tokens: int | None = None) -> list[Completion]:
        outs = super().generate(requests, max_num_batched_tokens)
        for c in outs if self.mode == "invariant" else ():
            if c.logprobs and any(e.num_cached_tokens > 0 for e in c.evidence):
                c.logprobs[0] = float(np.nextafter(np.float32(c.logprobs[0]), np.float32(0)))
                if c.logits is not None:
                    c.logits[0] = np.nextafter(c.logits[0], np.float32(np.inf)).astype(np.float32)
        return outs
