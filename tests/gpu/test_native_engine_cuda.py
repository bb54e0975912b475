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

from oracle.compare import first_divergence
from oracle.engines.base import Completion, Request, SamplingParams
from oracle.engines.native import NativeEngine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SAMPLING = SamplingParams(max_tokens=8, logits="full")
TARGET = tuple(random.Random(1).randrange(512) for _ in range(41))
DTYPES = ["bfloat16", "float32"]


@pytest.fixture(scope="module", params=DTYPES)
def engines(request: pytest.FixtureRequest, tiny_qwen3: Path) -> dict[str, NativeEngine]:
    pytest.importorskip("triton")
    inv = NativeEngine(tiny_qwen3, "invariant", device="cuda", dtype=request.param, max_num_batched_tokens=4096)
    prod = NativeEngine(inv.decoder, "production", device="cuda", max_num_batched_tokens=4096)
    return {"invariant": inv, "production": prod}


def _prompt(rng: random.Random, lo: int = 4, hi: int = 60) -> tuple[int, ...]:
    return tuple(rng.randrange(512) for _ in range(rng.randint(lo, hi)))


def _batch(size: int, position: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    reqs = [Request(f"f{i}", _prompt(rng), SamplingParams(max_tokens=rng.randint(1, 10), logits="none"))
            for i in range(size - 1)]
    reqs.insert(position, Request("target", TARGET, SAMPLING))
    return reqs


def _solo(engine: NativeEngine) -> Completion:
    return engine.generate([Request("target", TARGET, SAMPLING)])[0]


def _same_logits(a: Completion, b: Completion) -> bool:
    assert a.logits is not None and b.logits is not None
    return len(a.logits) == len(b.logits) and all(
        np.array_equal(x.view(np.uint32), y.view(np.uint32)) for x, y in zip(a.logits, b.logits, strict=True))


def test_engine_runs_on_cuda(engines: dict[str, NativeEngine]) -> None:
    assert engines["invariant"].decoder.device.type == "cuda"
    out = _solo(engines["invariant"])
    assert len(out.token_ids) == SAMPLING.max_tokens and all(np.isfinite(x).all() for x in out.logits or [])


def test_invariant_mode_is_bitwise_equal_to_solo_for_batch_1_to_33(engines: dict[str, NativeEngine]) -> None:
    ref = _solo(engines["invariant"])
    for size in range(1, 34):
        for position in sorted({0, size // 2, size - 1}):
            out = engines["invariant"].generate(_batch(size, position, seed=size))[position]
            assert first_divergence(ref, out) is None, (size, position)
            assert out.max_batch == size
            assert _same_logits(ref, out), (size, position)


def test_invariant_under_chunked_prefill_and_staggered_arrival(engines: dict[str, NativeEngine]) -> None:
    ref = _solo(engines["invariant"])
    rng = random.Random(5)
    for budget in (7, 16, 33, 100):
        reqs = _batch(9, 4, seed=budget)
        reqs = [Request(r.request_id, r.prompt_token_ids, r.sampling, arrival_step=rng.randint(0, 4)) for r in reqs]
        out = engines["invariant"].generate(reqs, max_num_batched_tokens=budget)[4]
        assert first_divergence(ref, out) is None, budget
        assert _same_logits(ref, out), budget


def test_production_mode_differs_somewhere(engines: dict[str, NativeEngine]) -> None:
    ref = _solo(engines["production"])
    diverged = [
        size for size in range(2, 34)
        if not _same_logits(ref, engines["production"].generate(_batch(size, size - 1, seed=size))[size - 1])
    ]
    if not diverged:
        pytest.xfail(f"production mode on {torch.cuda.get_device_name()} gave the solo logits for every batch "
                     f"size 2..33 (tiny-qwen3, {engines['production'].decoder.dtype}): nothing to detect here")
    assert diverged
