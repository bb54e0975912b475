"""The native sampler's seeded draws with top-k / top-p: truncation row by row, a row's draw its own."""

from __future__ import annotations

import pytest
import torch

from oracle.engines.contract import SamplingParams
from oracle.engines.native.sampler import sample_rows, truncate

VOCAB = 50


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3  # [rows, vocab]


def _gens(seeds: list[int]) -> list[torch.Generator | None]:
    return [torch.Generator().manual_seed(s) for s in seeds]


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0, top_k=1), SamplingParams(temperature=1.0, top_p=1e-6)])
def test_a_set_of_one_token_samples_the_argmax_whatever_the_seed(params: SamplingParams) -> None:
    logits = _logits(6)
    rows = sample_rows(logits, [params] * 6, _gens(list(range(6))))
    assert rows.tokens == torch.argmax(logits, dim=-1).tolist()


def test_top_k_draws_stay_within_the_k_most_likely_tokens() -> None:
    logits = _logits(1)
    top = set(torch.topk(logits[0], 4).indices.tolist())
    g = torch.Generator().manual_seed(7)
    drawn = {sample_rows(logits, [SamplingParams(temperature=2.0, top_k=4)], [g]).tokens[0] for _ in range(200)}
    assert drawn <= top and len(drawn) > 1


def test_top_p_keeps_the_smallest_prefix_that_reaches_p() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    kept = truncate(probs.log(), [SamplingParams(temperature=1.0, top_p=0.8)])
    assert torch.isfinite(kept).tolist() == [[True, True, False, False]]
    kept = truncate(probs.log(), [SamplingParams(temperature=1.0, top_p=0.81)])
    assert torch.isfinite(kept).tolist() == [[True, True, True, False]]


def test_a_rows_draw_does_not_depend_on_the_other_rows() -> None:
    """Row 0 alone and beside rows with other seeds and other truncations: the same token, draw after draw."""
    logits = _logits(3, seed=1)
    mine = SamplingParams(temperature=1.0, top_p=0.9)
    others = [SamplingParams(temperature=0.5, top_k=3), SamplingParams(temperature=1.5)]
    alone_g, batch_g = _gens([11])[0], _gens([11])[0]
    assert alone_g is not None and batch_g is not None
    other_g = _gens([12, 13])
    for _ in range(20):
        alone = sample_rows(logits[:1], [mine], [alone_g])
        batch = sample_rows(logits, [mine, *others], [batch_g, *other_g])
        assert alone.tokens[0] == batch.tokens[0] and alone.logprobs[0] == batch.logprobs[0]


def test_greedy_rows_are_untouched_by_truncation_settings() -> None:
    logits = _logits(2)
    rows = sample_rows(logits, [SamplingParams(top_k=3, top_p=0.5)] * 2, [None, None])
    assert rows.tokens == torch.argmax(logits, dim=-1).tolist()
