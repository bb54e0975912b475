"""The native engine's device-side sampler: tokens, logprobs, top-2 and digests of a whole step at once.

Compared: each row's outputs alone vs inside a batch (bitwise), greedy tokens against argmax,
logprobs against log_softmax, and digests for bitwise sensitivity (one flipped bit, -0.0 vs +0.0). The
one-read CUDA path of invariant mode is checked under the interpreter (triton_interpreter_sampling_cases.py)
and on a GPU; here, that the CPU keeps torch's ops and that the engine passes its mode.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from oracle.engines.contract import Request, SamplingParams
from oracle.engines.native import sampler
from oracle.engines.native.sampler import (
    _gumbel,
    choose,
    draw,
    fingerprint,
    queue_rows,
    request_generator,
    sample_rows,
    truncate,
)

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


def _choose_as_before(logits: torch.Tensor, sampling: list[SamplingParams],
                      generators: list[torch.Generator | None]) -> torch.Tensor:
    """The tokens as the sampler chose them before `draw`: one argmax over the logits with drawn rows replaced."""
    drawn = [i for i, g in enumerate(generators) if g is not None]
    scores = logits.clone()
    rows = torch.tensor(drawn)
    temperature = torch.tensor([sampling[i].temperature for i in drawn])
    gumbel = torch.stack([_gumbel(g, logits.shape[-1]) for g in generators if g is not None])
    scores[rows] = truncate(logits[rows] / temperature[:, None], [sampling[i] for i in drawn]) + gumbel
    return torch.argmax(scores, dim=-1)


def test_choose_gives_the_tokens_of_one_argmax_over_the_drawn_scores() -> None:
    logits = rows(8, seed=4)
    logits[2, 5] = float("nan")
    logits[3] = float("-inf")
    sampling = [SamplingParams(1, 0.9, seed=i, top_k=i) if i % 3 else GREEDY_DIGEST for i in range(8)]

    def gens() -> list[torch.Generator | None]:
        return [request_generator(s) for s in sampling]

    assert torch.equal(choose(logits, sampling, gens()), _choose_as_before(logits, sampling, gens()))
    assert draw(logits, [GREEDY_DIGEST] * 8, [None] * 8) is None


def test_the_cpu_keeps_torch_s_ops_in_invariant_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU `invariant` changes nothing: no one-read kernel (it needs triton and CUDA), the same bits."""
    logits = rows(6, seed=5)
    sampling = [SamplingParams(1, 0.8, seed=i) if i % 2 else GREEDY_DIGEST for i in range(6)]

    def gens() -> list[torch.Generator | None]:
        return [request_generator(s) for s in sampling]

    production = queue_rows(logits, sampling, gens()).result()

    def one_read(*args: object) -> torch.Tensor:
        raise AssertionError("the one-read kernel ran on the CPU")

    monkeypatch.setattr(sampler, "invariant_columns", one_read)
    invariant = queue_rows(logits, sampling, gens(), invariant=True).result()
    assert (invariant.tokens, invariant.top2, invariant.digests) == (production.tokens, production.top2,
                                                                     production.digests)
    assert np.array_equal(np.array(invariant.logprobs), np.array(production.logprobs))
    lp = torch.log_softmax(logits, dim=-1)
    assert invariant.logprobs == [float(lp[i, t]) for i, t in enumerate(invariant.tokens)]


@pytest.mark.parametrize("mode", ["invariant", "production"])
def test_the_engine_tells_the_sampler_its_mode(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from oracle.bench import random_decoder
    from oracle.config import EngineConfig
    from oracle.engines.native import NativeEngine, engine

    seen: list[bool] = []

    def recording(*args: Any, invariant: bool = False, **kwargs: Any) -> sampler.PendingRows:
        seen.append(invariant)
        return queue_rows(*args, invariant=invariant, **kwargs)

    monkeypatch.setattr(engine, "queue_rows", recording)
    native = NativeEngine(random_decoder("tiny-qwen3", "float32", "cpu"), mode,  # type: ignore[arg-type]
                          EngineConfig.of("native", dtype="float32"))
    native.generate([Request("r", (1, 2, 3), SamplingParams(2, logits="none"))])
    assert seen and set(seen) == {mode == "invariant"}
