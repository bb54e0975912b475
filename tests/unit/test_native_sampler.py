"""The native engine's device-side sampler: tokens, logprobs, top-2 and digests of a whole step at once.

Compared: each row's outputs alone vs inside a batch (bitwise), greedy tokens against argmax,
logprobs against log_softmax, and digests for bitwise sensitivity (one flipped bit, -0.0 vs +0.0).
"""

from __future__ import annotations

import numpy as np
import torch

from oracle.engines.contract import SamplingParams
from oracle.engines.native.sampler import fingerprint, sample_rows

VOCAB = 300
GREEDY_DIGEST = SamplingParams(max_tokens=1, logits="digest")


def rows(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(seed))


def test_greedy_tokens_logprobs_and_top2_match_torch() -> None:
    logits = rows(5)
    out = sample_rows(logits, [GREEDY_DIGEST] * 5, [None] * 5)
    assert out.tokens == torch.argmax(logits, dim=-1).tolist()
    lp = torch.log_softmax(logits, dim=-1)
    assert out.logprobs == [float(lp[i, t]) for i, t in enumerate(out.tokens)]
    assert out.top2 == [tuple(float(x) for x in torch.topk(logits[i], 2).values) for i in range(5)]


def test_a_rows_outputs_do_not_depend_on_the_batch() -> None:
    logits = rows(9, seed=1)
    sampling = [SamplingParams(1, 0.7, seed=i, logits="digest") if i % 2 else GREEDY_DIGEST for i in range(9)]

    def gens() -> list[torch.Generator | None]:
        return [torch.Generator().manual_seed(s.seed) if s.temperature > 0 else None for s in sampling]

    batched = sample_rows(logits, sampling, gens())
    for i in range(9):
        alone = sample_rows(logits[i : i + 1], [sampling[i]], [gens()[i]])
        assert (alone.tokens[0], alone.logprobs[0], alone.top2[0], alone.digests[0]) == (
            batched.tokens[i], batched.logprobs[i], batched.top2[i], batched.digests[i])


def test_seeded_draws_follow_the_generator_not_the_row() -> None:
    logits = torch.zeros(2, VOCAB)  # flat: the token is the Gumbel noise's argmax
    sampling = [SamplingParams(1, 1.0, seed=5, logits="none")] * 2
    same = sample_rows(logits, sampling, [torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)])
    other = sample_rows(logits, sampling, [torch.Generator().manual_seed(5), torch.Generator().manual_seed(6)])
    assert same.tokens[0] == same.tokens[1] == other.tokens[0]
    assert other.tokens[1] != other.tokens[0]


def test_digest_changes_with_any_single_bit_and_only_then() -> None:
    logits = rows(1, seed=2)
    base = sample_rows(logits, [GREEDY_DIGEST], [None]).digests[0]
    assert sample_rows(logits.clone(), [GREEDY_DIGEST], [None]).digests[0] == base
    bits = logits.view(torch.int32)
    rng = np.random.default_rng(0)
    for _ in range(40):
        flipped = bits.clone()
        col, bit = int(rng.integers(VOCAB)), int(rng.integers(32))
        flipped[0, col] ^= torch.tensor(1 << bit if bit < 31 else -(2**31), dtype=torch.int32)
        assert sample_rows(flipped.view(torch.float32), [GREEDY_DIGEST], [None]).digests[0] != base, (col, bit)


def test_negative_zero_has_another_digest_than_zero() -> None:
    a = torch.zeros(1, VOCAB)
    b = a.clone()
    b[0, 17] = -0.0
    assert fingerprint(a).tolist() != fingerprint(b).tolist()


def test_full_rows_only_where_asked() -> None:
    logits = rows(3, seed=3)
    sampling = [SamplingParams(1, logits="full"), SamplingParams(1, logits="none"), GREEDY_DIGEST]
    out = sample_rows(logits, sampling, [None] * 3)
    assert set(out.full) == {0} and set(out.digests) == {2}
    assert np.array_equal(out.full[0].view(np.uint32), logits[0].numpy().view(np.uint32))
