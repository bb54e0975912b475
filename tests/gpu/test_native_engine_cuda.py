"""The native engine on CUDA with tiny-qwen3: invariant mode is bitwise batch-invariant, production is not.

The GPU twin of tests/integration/test_native_engine.py: the Triton kernels replace torch's CUDA
kernels for every op the model reaches (mm, softmax, RMS norm, silu, paged attention). Compared
bitwise: a target request's tokens, sampled-token logprobs and full float32 logits at every step,
alone vs beside 0..32 other requests at the start, middle and end of the batch, in bf16 and fp32.
Run with `pytest -m gpu tests/gpu/test_native_engine_cuda.py`.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from native_batches import SAMPLING, batch_around_target, solo

from oracle.compare import first_divergence
from oracle.config import EngineConfig
from oracle.engines.contract import Completion, Request
from oracle.engines.native import NativeEngine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

DTYPES = ["bfloat16", "float32"]


@pytest.fixture(scope="module", params=DTYPES)
def engines(request: pytest.FixtureRequest, tiny_qwen3: Path) -> dict[str, NativeEngine]:
    pytest.importorskip("triton")
    inv = NativeEngine(tiny_qwen3, "invariant",
                       EngineConfig.of("native", device="cuda", dtype=request.param, max_num_batched_tokens=4096))
    prod = NativeEngine(inv.decoder, "production",
                        EngineConfig.of("native", device="cuda", max_num_batched_tokens=4096))
    return {"invariant": inv, "production": prod}





def _same_logits(a: Completion, b: Completion) -> bool:
    assert a.logits is not None and b.logits is not None
    return len(a.logits) == len(b.logits) and all(
        np.array_equal(x.view(np.uint32), y.view(np.uint32)) for x, y in zip(a.logits, b.logits, strict=True))


def test_engine_runs_on_cuda(engines: dict[str, NativeEngine]) -> None:
    assert engines["invariant"].decoder.device.type == "cuda"
    out = solo(engines["invariant"])
    assert len(out.token_ids) == SAMPLING.max_tokens and all(np.isfinite(x).all() for x in out.logits or [])


def test_invariant_mode_is_bitwise_equal_to_solo_for_batch_1_to_33(engines: dict[str, NativeEngine]) -> None:
    ref = solo(engines["invariant"])
    for size in range(1, 34):
        for position in sorted({0, size // 2, size - 1}):
            out = engines["invariant"].generate(batch_around_target(size, position, seed=size))[position]
            assert first_divergence(ref, out) is None, (size, position)
            assert out.max_batch == size
            assert _same_logits(ref, out), (size, position)


def test_invariant_under_chunked_prefill_and_staggered_arrival(engines: dict[str, NativeEngine]) -> None:
    ref = solo(engines["invariant"])
    rng = random.Random(5)
    for budget in (7, 16, 33, 100):
        reqs = batch_around_target(9, 4, seed=budget)
        reqs = [Request(r.request_id, r.prompt_token_ids, r.sampling, arrival_step=rng.randint(0, 4)) for r in reqs]
        out = engines["invariant"].generate(reqs, max_num_batched_tokens=budget)[4]
        assert first_divergence(ref, out) is None, budget
        assert _same_logits(ref, out), budget


def test_production_mode_differs_somewhere(engines: dict[str, NativeEngine]) -> None:
    ref = solo(engines["production"])
    diverged = [
        size for size in range(2, 34)
        if not _same_logits(ref, engines["production"].generate(batch_around_target(size, size - 1, seed=size))[size - 1])
    ]
    if not diverged:
        pytest.xfail(f"production mode on {torch.cuda.get_device_name()} gave the solo logits for every batch "
                     f"size 2..33 (tiny-qwen3, {engines['production'].decoder.dtype}): nothing to detect here")
    assert diverged


def test_decode_graphs_give_the_eager_bits(engines: dict[str, NativeEngine]) -> None:
    """Invariant mode with CUDA graphs (padded buckets, captured kernels) vs without: every output bitwise."""
    graphs = engines["invariant"]
    assert graphs.cuda_graphs
    eager = NativeEngine(graphs.decoder, "invariant",
                         EngineConfig.of("native", device="cuda", max_num_batched_tokens=4096, cuda_graphs=False))
    for size in (1, 3, 9, 17, 33):
        reqs = batch_around_target(size, size // 2, seed=100 + size)
        with_graphs, without = graphs.generate(reqs), eager.generate(reqs)
        assert graphs._graphs is not None and graphs._graphs.graphs  # decode steps did replay graphs
        for a, b in zip(with_graphs, without, strict=True):
            assert first_divergence(b, a) is None, (size, a.request_id)
            if a.logits is not None:
                assert _same_logits(a, b), (size, a.request_id)


def test_production_mode_runs_with_and_without_graphs(engines: dict[str, NativeEngine]) -> None:
    prod = engines["production"]
    eager = NativeEngine(prod.decoder, "production",
                         EngineConfig.of("native", device="cuda", max_num_batched_tokens=4096, cuda_graphs=False))
    reqs = batch_around_target(12, 5, seed=7)
    for a, b in zip(prod.generate(reqs), eager.generate(reqs), strict=True):
        assert len(a.token_ids) == len(b.token_ids) and np.isfinite(a.logprobs).all()
