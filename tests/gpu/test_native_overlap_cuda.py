"""Overlapping steps on CUDA (engine option `overlap_steps`): the next step launched from the last one's tokens on
the device, through CUDA graph replays and eager prefill passes alike, gives what one step at a time gives, bit
for bit, in both modes. Run with `pytest -m gpu tests/gpu/test_native_overlap_cuda.py`.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from bitwise import assert_same_bits

from oracle.config import EngineConfig
from oracle.engines.contract import Mode, Request, SamplingParams
from oracle.engines.native import NativeEngine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _engine(model: Any, mode: Mode, overlap: bool, dtype: str) -> NativeEngine:
    pytest.importorskip("triton")
    return NativeEngine(model, mode, EngineConfig.of(
        "native", device="cuda", dtype=dtype, max_num_batched_tokens=48, enable_prefix_caching=True,
        overlap_steps=overlap))


def _requests(seed: int) -> list[Request]:
    """Greedy and seeded rows, full rows and digests, arrivals while others decode, prompts over the budget."""
    rng = random.Random(seed)
    shared = tuple(rng.randrange(512) for _ in range(24))
    kinds = ["full", "digest", "none"]
    return [Request(f"r{i}", (shared if i % 2 else ()) + tuple(rng.randrange(512) for _ in range(rng.randint(3, 60))),
                    SamplingParams(max_tokens=rng.randint(1, 12), temperature=0.0 if i % 3 else 0.7, seed=i,
                                   logits=kinds[i % 3]),  # type: ignore[arg-type]
                    arrival_step=rng.randint(0, 5))
            for i in range(11)]


@pytest.mark.parametrize("mode", ["invariant", "production"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_overlapping_steps_give_one_step_at_a_time_bits(tiny_qwen3: Path, mode: Mode, dtype: str) -> None:
    serial = _engine(tiny_qwen3, mode, False, dtype)
    overlapped = _engine(serial.decoder, mode, True, dtype)
    assert overlapped.describe()["overlap_steps"] is True and overlapped.cuda_graphs
    for seed in (1, 2):
        reqs = _requests(seed)
        expected, actual = serial.generate(reqs), overlapped.generate(reqs)
        assert_same_bits(expected, actual)
        for x, y in zip(expected, actual, strict=True):
            assert x.token_ids == y.token_ids and x.evidence == y.evidence and x.top2 == y.top2
    assert overlapped._graphs is not None and overlapped._graphs.graphs  # decode steps did replay graphs
