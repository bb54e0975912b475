"""Native engines with planted faults for the seeded_sampling and cross_instance checks.

`SharedSeedEngine` seeds every request's sampler with the seed of the batch's first request (vLLM
#50440: one seed for a batch gives every prompt the same noise). Greedy decoding is unaffected, and a
request alone is sampled correctly: only batches of requests with different seeds show it.

`InstanceFaultEngine` differs between instances: every other instance built in the process (odd ordinal)
gets its first logprob one float32 ULP off, as an engine whose start picks a kernel configuration
(autotuning, a different fusion) would.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from oracle.config import EngineConfig
from oracle.engines.contract import Completion, Mode, Request
from oracle.engines.native import NativeEngine


class SharedSeedEngine(NativeEngine):
    def __init__(self, model: Path, mode: Mode, **options: Any) -> None:
        super().__init__(model, mode, EngineConfig.of("native", **options))
        self._batch_seed = 0

    def generate(self, requests: Sequence[Request], max_num_batched_tokens: int | None = None) -> list[Completion]:
        self._batch_seed = requests[0].sampling.seed if requests else 0
        return super().generate(requests, max_num_batched_tokens)

    def _generator(self, r: Request) -> torch.Generator | None:
        if r.sampling.temperature <= 0:
            return None
        return torch.Generator(device="cpu").manual_seed(self._batch_seed)


class InstanceFaultEngine(NativeEngine):
    _ordinals: ClassVar[itertools.count[int]] = itertools.count()

    def __init__(self, model: Path, mode: Mode, **options: Any) -> None:
        super().__init__(model, mode, EngineConfig.of("native", **options))
        self.ordinal = next(InstanceFaultEngine._ordinals)

    def generate(self, requests: Sequence[Request], max_num_batched_tokens: int | None = None) -> list[Completion]:
        outs = super().generate(requests, max_num_batched_tokens)
        for c in outs if self.ordinal % 2 else ():
            if c.logprobs:
                c.logprobs[0] = float(np.nextafter(np.float32(c.logprobs[0]), np.float32(0)))
        return outs
