"""Hugging Face transformers as an engine, on a real tiny checkpoint."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from oracle.compare import first_divergence
from oracle.engines.base import Request, SamplingParams
from oracle.engines.native import NativeEngine

pytest.importorskip("transformers")
from oracle.engines.transformers_engine import TransformersEngine  # noqa: E402

SAMPLING = SamplingParams(max_tokens=6, logits="full")
TARGET = tuple(random.Random(3).randrange(500) for _ in range(12))


def _fillers(n: int, length: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    return [Request(f"f{i}", tuple(rng.randrange(500) for _ in range(length)), SamplingParams(6, logits="none"))
            for i in range(n)]


@pytest.fixture(scope="module")
def engines(tiny_qwen3: Path) -> dict[str, TransformersEngine]:
    return {m: TransformersEngine(tiny_qwen3, m) for m in ("invariant", "production")}  # type: ignore[misc]


def test_solo_greedy_matches_native_engine(engines: dict[str, TransformersEngine], tiny_qwen3: Path) -> None:
    ours = NativeEngine(tiny_qwen3, "invariant").generate([Request("t", TARGET, SAMPLING)])[0]
    theirs = engines["invariant"].generate([Request("t", TARGET, SAMPLING)])[0]
    assert theirs.token_ids == ours.token_ids
    assert max(abs(a - b) for a, b in zip(theirs.logprobs, ours.logprobs, strict=True)) < 1e-4


def test_invariant_mode_without_padding_is_bitwise_equal_to_solo(engines: dict[str, TransformersEngine]) -> None:
    """Fillers as long as the target: no padding, so only the batch differs, and the kernels hide it."""
    solo = engines["invariant"].generate([Request("t", TARGET, SAMPLING)])[0]
    for size in (2, 5, 9):
        reqs = _fillers(size - 1, len(TARGET), seed=size)
        reqs.insert(size // 2, Request("t", TARGET, SAMPLING))
        out = engines["invariant"].generate(reqs)[size // 2]
        assert first_divergence(solo, out) is None, size
        assert out.max_batch == size


def test_repeatable_with_padding(engines: dict[str, TransformersEngine]) -> None:
    reqs = _fillers(4, 30, seed=1) + [Request("t", TARGET, SAMPLING)]
    a = engines["production"].generate(reqs)[-1]
    b = engines["production"].generate(reqs)[-1]
    assert first_divergence(a, b) is None


def test_sampling_is_refused(engines: dict[str, TransformersEngine]) -> None:
    from oracle.errors import ConfigError

    with pytest.raises(ConfigError, match="greedy only"):
        engines["production"].generate([Request("t", TARGET, SamplingParams(4, temperature=1.0))])
