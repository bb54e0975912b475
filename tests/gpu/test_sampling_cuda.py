"""The native sampler's one-read invariant path on CUDA against the composition it replaces, bitwise.

Ran on an H100 (torch 2.11, Triton 3.6): every case bitwise torch's but the signed-zero one, where torch.topk
ranked a -0.0/+0.0 tie [-0.0, +0.0] for a single row; that case now states the kernel's own order (+0.0 first in
every row) and has not run on a GPU as rewritten.

With oracle_kernels enabled (invariant mode), `sampler.invariant_columns` (kernels/triton/sampling.py)
against `sampler._columns` (torch.argmax, torch.log_softmax run by our Triton log-softmax, torch.topk):
the int64 columns (token, logprob, top-1 and top-2 as float32 bits) must be equal. Batches of 1, 7 (torch's
topk sorts the whole row for up to 10 rows of 100000 columns or more) and 300 rows, the seed workload's
vocabulary and an odd one, greedy and mixed with seeded rows. Run with `pytest -m gpu tests/gpu/test_sampling_cuda.py`.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import oracle_kernels
import pytest
import torch
from sampling_rows import special_rows

from oracle.engines.contract import SamplingParams
from oracle.engines.native import sampler

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CUDA = torch.device("cuda")
VOCABS = [151936, 1537]
BATCH_SIZES = [1, 7, 300]


@pytest.fixture(autouse=True)
def invariant_kernels() -> Iterator[None]:
    pytest.importorskip("triton")
    with oracle_kernels.batch_invariant():
        yield


def _logits(num_rows: int, vocab: int) -> torch.Tensor:
    """[num_rows, vocab] float32 on the GPU: the special rows first, then random ones."""
    special = special_rows(vocab, seed=vocab, device=CUDA)
    g = torch.Generator(device=CUDA).manual_seed(num_rows)
    extra = torch.randn(max(num_rows - special.shape[0], 0), vocab, generator=g, device=CUDA) * 4
    return torch.cat([special, extra])[:num_rows]


def _generators(sampling: list[SamplingParams]) -> list[torch.Generator | None]:
    return [sampler.request_generator(s) for s in sampling]


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("num_rows", BATCH_SIZES)
def test_greedy_rows_match_the_composition_bitwise(vocab: int, num_rows: int) -> None:
    logits = _logits(num_rows, vocab)
    sampling = [SamplingParams()] * num_rows
    ours = sampler.invariant_columns(logits, sampling, _generators(sampling))
    theirs = sampler._columns(logits, sampling, _generators(sampling))
    assert torch.equal(ours, theirs), (ours != theirs).nonzero().tolist()[:20]


def test_mixed_rows_match_the_composition_bitwise() -> None:
    logits = _logits(40, VOCABS[0])
    sampling = [SamplingParams(temperature=0.7, top_k=50, seed=i) if i % 3 else SamplingParams() for i in range(40)]
    ours = sampler.invariant_columns(logits, sampling, _generators(sampling))
    assert torch.equal(ours, sampler._columns(logits, sampling, _generators(sampling)))


def test_queue_rows_gives_the_same_host_rows_in_either_path() -> None:
    logits = _logits(20, VOCABS[1])
    sampling = [SamplingParams(logits=("digest", "full", "none")[i % 3]) for i in range(20)]
    fused = sampler.queue_rows(logits, sampling, _generators(sampling), invariant=True).result()
    plain = sampler.queue_rows(logits, sampling, _generators(sampling), invariant=False).result()
    assert (fused.tokens, fused.digests.keys(), fused.full.keys()) == (plain.tokens, plain.digests.keys(),
                                                                       plain.full.keys())
    assert fused.digests == plain.digests
    for a, b in ((fused.logprobs, plain.logprobs), (fused.top2, plain.top2)):
        assert np.array_equal(np.array(a, np.float32).view(np.uint32), np.array(b, np.float32).view(np.uint32))


def test_signed_zeros_rank_in_one_order_whatever_the_rows() -> None:
    """+0.0 and -0.0 compare equal; the kernel ranks +0.0 above -0.0 (radix order) in every row, whatever the
    number of rows. torch.topk does not keep one order for that tie: on an H100 (torch 2.11) a single 151,936-wide
    row came back [-0.0, +0.0]. Every other column is torch's."""
    for num_rows in (1, 7, 300):  # torch's paths for few and many rows
        logits = torch.full((num_rows, VOCABS[0]), -1.0, device=CUDA)
        logits[:, 10], logits[:, 2000] = -0.0, 0.0
        sampling = [SamplingParams()] * num_rows
        ours = sampler.invariant_columns(logits, sampling, [None] * num_rows)
        theirs = sampler._columns(logits, sampling, [None] * num_rows)
        assert torch.equal(ours[:, :2], theirs[:, :2]), num_rows  # token 10 (the first maximum) and its logprob
        assert (ours[:, 2] == 0).all() and (ours[:, 3] == -(2**31)).all(), (num_rows, ours[:3])  # +0.0, then -0.0
        assert sorted(theirs[0, 2:].tolist()) == [-(2**31), 0], theirs[0]  # torch: the same two, in its order
