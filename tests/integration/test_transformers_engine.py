"""Hugging Face transformers as an engine, on a real tiny checkpoint."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from oracle.compare import first_divergence
from oracle.engines.contract import Request, SamplingParams
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


@pytest.mark.parametrize("size", [2, 5, 9])
def test_invariant_mode_is_bitwise_equal_to_solo_beside_longer_and_later_prompts(
        engines: dict[str, TransformersEngine], size: int) -> None:
    """Fillers of other lengths (a padded batch would stretch the target's attention rows) arriving at
    other steps (passes mix prefills and decodes): the target's bits do not move."""
    solo = engines["invariant"].generate([Request("t", TARGET, SAMPLING)])[0]
    rng = random.Random(size)
    reqs = [Request(f"f{i}", tuple(rng.randrange(500) for _ in range(rng.randint(1, 40))),
                    SamplingParams(rng.randint(1, 8), logits="none"), arrival_step=rng.randint(0, 3))
            for i in range(size - 1)]
    reqs.insert(size // 2, Request("t", TARGET, SAMPLING, arrival_step=1))
    out = engines["invariant"].generate(reqs)[size // 2]
    assert first_divergence(solo, out) is None
    assert out.token_ids == solo.token_ids and len(out.token_ids) == SAMPLING.max_tokens
    assert out.max_batch > 1  # the evidence says the target shared passes
    assert all(e.num_tokens >= e.num_seqs for e in out.evidence)


def test_invariant_passes_mix_prefills_and_decodes_in_the_evidence(engines: dict[str, TransformersEngine]) -> None:
    late = Request("late", TARGET[:5], SamplingParams(3, logits="none"), arrival_step=2)
    early = Request("early", TARGET, SamplingParams(6, logits="none"))
    a, b = engines["invariant"].generate([early, late])
    assert [e.num_seqs for e in a.evidence] == [1, 1, 2, 2, 2, 1]
    assert a.evidence[2].num_tokens == 1 + 5  # early's decode token beside late's whole prompt
    assert b.evidence[0].is_prefill and not b.evidence[1].is_prefill
    assert [e.engine_step for e in b.evidence] == [2, 3, 4]


def test_invariant_prefill_equals_decode(engines: dict[str, TransformersEngine]) -> None:
    """A generated token's logits row is bitwise the same when its prefix is prefilled again."""
    ref = engines["invariant"].generate([Request("t", TARGET, SAMPLING)])[0]
    again = engines["invariant"].generate([Request("p", TARGET + tuple(ref.token_ids[:3]), SAMPLING)])[0]
    assert again.token_ids[0] == ref.token_ids[3]
    assert again.logits is not None and ref.logits is not None
    assert again.logits[0].tobytes() == ref.logits[3].tobytes()


def test_describe_names_the_batching(engines: dict[str, TransformersEngine]) -> None:
    assert "packed" in engines["invariant"].describe()["batching"]
    assert "padded" in engines["production"].describe()["batching"]


@pytest.mark.slow
def test_shipped_config_passes_with_batched_evidence(tmp_path: Path, tiny_qwen3: Path) -> None:
    from oracle.config import load_config
    from oracle.runner import run

    root = Path(__file__).parents[2]
    config = load_config(root / "configs" / "transformers.yaml", {"schedule.trials": 8})
    report = run(config, seed=5, report_dir=tmp_path)
    verdicts = {c.name: c for c in report.checks}
    assert report.complete
    assert verdicts["invariance"].verdict == "pass"
    assert verdicts["prefill_decode"].verdict == "pass"
    assert report.exit_code() == 0


def test_repeatable_with_padding(engines: dict[str, TransformersEngine]) -> None:
    reqs = _fillers(4, 30, seed=1) + [Request("t", TARGET, SAMPLING)]
    a = engines["production"].generate(reqs)[-1]
    b = engines["production"].generate(reqs)[-1]
    assert first_divergence(a, b) is None


def test_sampling_is_refused(engines: dict[str, TransformersEngine]) -> None:
    from oracle.errors import ConfigError

    with pytest.raises(ConfigError, match="greedy only"):
        engines["production"].generate([Request("t", TARGET, SamplingParams(4, temperature=1.0))])
