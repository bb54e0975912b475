"""The native engine on a real tiny checkpoint: invariant mode is bitwise batch-invariant, production is not."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from native_batches import TARGET, batch_around_target, solo

from oracle.compare import first_divergence
from oracle.config import EngineConfig
from oracle.engines.contract import Request, SamplingParams
from oracle.engines.native import NativeEngine


@pytest.fixture(scope="module")
def engines(tiny_qwen3: Path) -> dict[str, NativeEngine]:
    inv = NativeEngine(tiny_qwen3, "invariant", EngineConfig.of("native", max_num_batched_tokens=4096, num_threads=1))
    prod = NativeEngine(inv.decoder, "production", EngineConfig.of("native", max_num_batched_tokens=4096, num_threads=1))
    return {"invariant": inv, "production": prod}







# Every batch size to 33 at three places; the default run checks native invariance through the schedule
# (tests/integration/test_native_schedule.py: batch 1-17 and its boundary sizes, full logits rows).
@pytest.mark.slow
def test_invariant_mode_is_bitwise_equal_to_solo_for_batch_1_to_33(engines: dict[str, NativeEngine]) -> None:
    ref = solo(engines["invariant"])
    for size in range(1, 34):
        for position in sorted({0, size // 2, size - 1}):
            out = engines["invariant"].generate(batch_around_target(size, position, seed=size))[position]
            assert first_divergence(ref, out) is None, (size, position)
            assert out.max_batch == size  # all arrived at step 0, so the prefill pass held every sequence
            assert ref.logits is not None and out.logits is not None
            assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(ref.logits, out.logits, strict=True))


def test_production_mode_differs_somewhere(engines: dict[str, NativeEngine]) -> None:
    ref = solo(engines["production"])
    diverged = [
        size for size in range(2, 34)
        if first_divergence(ref, engines["production"].generate(batch_around_target(size, size - 1, seed=size))[size - 1])
    ]
    assert diverged, "production mode never diverged from its solo run"


def test_invariant_under_chunked_prefill_and_staggered_arrival(engines: dict[str, NativeEngine]) -> None:
    ref = solo(engines["invariant"])
    rng = random.Random(5)
    for budget in (7, 16, 33, 100):
        reqs = batch_around_target(9, 4, seed=budget)
        reqs = [Request(r.request_id, r.prompt_token_ids, r.sampling, arrival_step=rng.randint(0, 4)) for r in reqs]
        out = engines["invariant"].generate(reqs, max_num_batched_tokens=budget)[4]
        assert first_divergence(ref, out) is None, budget
        if budget < len(TARGET):
            assert any(e.chunked for e in out.evidence)


def test_evidence_counts_shared_passes(engines: dict[str, NativeEngine]) -> None:
    out = engines["invariant"].generate(batch_around_target(5, 2, seed=3))
    target = out[2]
    assert target.evidence[0].is_prefill and target.evidence[0].num_seqs == 5
    assert [e.token_index for e in target.evidence if e.token_index is not None] == list(range(8))


def test_seeded_sampling_is_reproducible_and_batch_invariant(engines: dict[str, NativeEngine]) -> None:
    sampling = SamplingParams(max_tokens=8, temperature=1.0, seed=11, logits="digest")
    alone = engines["invariant"].generate([Request("t", TARGET, sampling)])[0]
    reqs = batch_around_target(6, 3, seed=2)
    reqs[3] = Request("t", TARGET, sampling)
    batched = engines["invariant"].generate(reqs)[3]
    assert first_divergence(alone, batched) is None
    other = engines["invariant"].generate([Request("t", TARGET, SamplingParams(8, 1.0, 12, "digest"))])[0]
    assert other.token_ids != alone.token_ids
