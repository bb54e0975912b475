"""The one-read sampling kernel (kernels/triton/sampling.py) under Triton's CPU interpreter.

Not collected on its own: test_kernels_triton_interpret.py runs this file in a child pytest with
TRITON_INTERPRET=1 (see triton_interpreter_cases.py for why). Run it by hand with

    TRITON_INTERPRET=1 pytest tests/unit/triton_interpreter_sampling_cases.py

What today's invariant path computes on CUDA is the composition torch.argmax, reduction.log_softmax
(the override of torch.log_softmax) gathered at the token, and torch.topk(k=2); the kernel must give
its int64 columns bitwise, for the block the kernel and reduction.log_softmax share. On the CPU,
torch.topk leaves the order of -0.0 and +0.0 open, where CUDA's radix select puts +0.0 first: rows
with that tie are checked against the radix order instead.
"""

from __future__ import annotations

import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs TRITON_INTERPRET=1 (run through test_kernels_triton_interpret.py)", allow_module_level=True)
pytest.importorskip("triton")

from oracle_kernels.triton import reduction, sampling  # noqa: E402
from oracle_kernels.triton.config import row_tiles  # noqa: E402
from sampling_rows import special_rows  # noqa: E402

from oracle.engines.contract import SamplingParams  # noqa: E402
from oracle.engines.native import sampler  # noqa: E402

# Odd vocabularies: a partial last block, one block, several blocks, one column.
VOCABS = [1, 2, 3, 17, 31, 50, 1537]


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32).long()


def composed(logits: torch.Tensor, tokens: torch.Tensor, block: int | None) -> torch.Tensor:
    """[R, 4] int64 as sampler._columns computes it with reduction.log_softmax for torch.log_softmax."""
    logprobs = reduction.log_softmax(logits, -1, block=block).gather(1, tokens[:, None])  # [R, 1]
    top2 = torch.topk(logits, 2, dim=-1).values if logits.shape[1] > 1 else logits[:, :1].expand(-1, 2)
    return torch.cat([tokens[:, None], _bits(logprobs), _bits(top2)], dim=1)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("block", [16, None])
def test_greedy_rows_match_the_composition_bitwise(vocab: int, block: int | None) -> None:
    x = special_rows(vocab, seed=vocab)
    out = sampling.sampled_rows(x, block=block)
    expected = composed(x, torch.argmax(x, dim=-1), block)
    assert torch.equal(out, expected), (out != expected).nonzero().tolist()


def test_the_default_block_is_the_log_softmax_block() -> None:
    # A vocabulary longer than the largest block: several loop iterations with a partial last one.
    vocab = row_tiles(10**6).block * 3 + 5
    x = special_rows(vocab, seed=1)
    out = sampling.sampled_rows(x)
    assert torch.equal(out, composed(x, torch.argmax(x, dim=-1), None))


def test_a_row_does_not_depend_on_the_batch() -> None:
    x = special_rows(37, seed=3)
    alone = torch.cat([sampling.sampled_rows(x[i : i + 1], block=16) for i in range(x.shape[0])])
    assert torch.equal(sampling.sampled_rows(x, block=16), alone)


def test_signed_zeros_in_the_top_2_follow_the_radix_order() -> None:
    x = torch.full((3, 21), -1.0)
    x[0, 4], x[0, 9] = -0.0, 0.0  # +0.0 ranks above -0.0 although they compare equal
    x[1, 4], x[1, 9] = 0.0, -0.0
    x[2, 2], x[2, 7] = -0.0, -0.0
    out = sampling.sampled_rows(x, block=16)
    zero, neg_zero = _bits(torch.tensor(0.0)).item(), _bits(torch.tensor(-0.0)).item()
    assert out[:, 2:].tolist() == [[zero, neg_zero], [zero, neg_zero], [neg_zero, neg_zero]]
    assert out[:, 0].tolist() == [4, 4, 2]  # torch.argmax: equal values, the first index


def test_drawn_tokens_get_the_log_softmax_of_their_column() -> None:
    x = special_rows(50, seed=7)
    drawn = torch.tensor([-1, 3, -1, 0, 49, -1, 7, 20, 5, 1, 2, -1, 8])
    out = sampling.sampled_rows(x, drawn, block=16)
    tokens = torch.where(drawn >= 0, drawn, torch.argmax(x, dim=-1))
    assert torch.equal(out, composed(x, tokens, 16))


def test_the_logprob_comparison_sees_the_reduction_order() -> None:
    """The bitwise check can fail: another block sums the exponentials in another order, other bits."""
    x = torch.randn(64, 1000, generator=torch.Generator().manual_seed(0)) * 3
    tokens = torch.argmax(x, dim=-1)
    other = sampling.sampled_rows(x, block=64)[:, 1]
    assert not torch.equal(other, composed(x, tokens, 16)[:, 1])


def test_the_sampler_s_invariant_columns_match_its_torch_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """sampler.invariant_columns against sampler._columns with torch.log_softmax as invariant mode runs it."""
    monkeypatch.setattr(torch, "log_softmax", lambda x, dim: reduction.log_softmax(x, dim))
    x = special_rows(1537, seed=11)
    params = [SamplingParams(), SamplingParams(temperature=0.8, top_k=5, seed=1), SamplingParams(logits="full")]
    rows = [params[i % 3] for i in range(x.shape[0])]

    def generators() -> list[torch.Generator | None]:
        return [sampler.request_generator(p) for p in rows]

    ours = sampler.invariant_columns(x, rows, generators())
    assert torch.equal(ours, sampler._columns(x, rows, generators()))
    greedy = sampler.invariant_columns(x, [SamplingParams()] * len(rows), [None] * len(rows))
    drawn = torch.tensor([g is not None for g in generators()])
    assert torch.equal(ours[~drawn], greedy[~drawn])
    assert not torch.equal(ours[drawn, 0], greedy[drawn, 0])  # the drawn rows took their own tokens
