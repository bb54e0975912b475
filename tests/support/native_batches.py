"""Batches around one target request, shared by the CPU and CUDA tests of the native engine."""

from __future__ import annotations

import random

from oracle.engines.contract import Completion, Engine, Request, SamplingParams

SAMPLING = SamplingParams(max_tokens=8, logits="full")
TARGET = tuple(random.Random(1).randrange(512) for _ in range(41))


def random_prompt(rng: random.Random, lo: int = 4, hi: int = 60) -> tuple[int, ...]:
    return tuple(rng.randrange(512) for _ in range(rng.randint(lo, hi)))


def batch_around_target(size: int, position: int, seed: int) -> list[Request]:
    """`size` requests: seeded random fillers, the target at `position`."""
    rng = random.Random(seed)
    reqs = [Request(f"f{i}", random_prompt(rng), SamplingParams(max_tokens=rng.randint(1, 10), logits="none"))
            for i in range(size - 1)]
    reqs.insert(position, Request("target", TARGET, SAMPLING))
    return reqs


def solo(engine: Engine) -> Completion:
    return engine.generate([Request("target", TARGET, SAMPLING)])[0]
