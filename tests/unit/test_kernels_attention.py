"""oracle_kernels.paged_attention: the invariant path bitwise, the production path for accuracy.

Invariant path (kernels enabled): a token's output is compared bitwise across a full prefill, a
chunked prefill and token-by-token decode, and alone vs batched with other sequences at any
place in the batch. Production path (kernels disabled): close to the float64 reference, and
batch-variant through num_kv_splits. Unused cache slots hold NaN, so reading one shows up.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import oracle_kernels
import pytest
import torch
from oracle_kernels.attention import production_attention

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 4, 2, 16, 8
SCALE = HEAD_DIM**-0.5
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOLERANCES = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


@dataclass(frozen=True)
class Seq:
    """One sequence's per-position queries, keys and values: [L, H, D]."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor


@dataclass(frozen=True)
class Work:
    """One sequence's part of a step: queries for positions start..end-1 (end = context length)."""

    seq: Seq
    start: int
    end: int


def make_seq(length: int, seed: int, dtype: torch.dtype, heads: int = HEADS, kv_heads: int = KV_HEADS) -> Seq:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(length, h, HEAD_DIM, generator=g).to(dtype) for h in (heads, kv_heads, kv_heads))
    return Seq(q, k, v)


def step_inputs(work: Sequence[Work], seed: int) -> tuple[torch.Tensor, ...]:
    """The paged-attention inputs of one step, blocks placed at random in a NaN-filled cache."""
    rng = random.Random(seed)
    dtype, kv_heads = work[0].seq.k.dtype, work[0].seq.k.shape[1]
    blocks_per_seq = [-(-w.end // BLOCK_SIZE) for w in work]
    num_blocks = sum(blocks_per_seq) + 3
    free = list(range(num_blocks))
    rng.shuffle(free)
    k_cache = torch.full((num_blocks, BLOCK_SIZE, kv_heads, HEAD_DIM), float("nan"), dtype=dtype)
    v_cache = torch.full_like(k_cache, float("nan"))
    max_blocks = max(blocks_per_seq) + 1
    block_tables = torch.full((len(work), max_blocks), -1, dtype=torch.int32)  # -1: no block
    for b, (w, n) in enumerate(zip(work, blocks_per_seq, strict=True)):
        table = [free.pop() for _ in range(n)]
        block_tables[b, :n] = torch.tensor(table, dtype=torch.int32)
        for pos in range(w.end):
            k_cache[table[pos // BLOCK_SIZE], pos % BLOCK_SIZE] = w.seq.k[pos]
            v_cache[table[pos // BLOCK_SIZE], pos % BLOCK_SIZE] = w.seq.v[pos]
    q = torch.cat([w.seq.q[w.start : w.end] for w in work])
    seq_lens = torch.tensor([w.end for w in work], dtype=torch.int32)
    lengths = torch.tensor([0] + [w.end - w.start for w in work])
    query_start_loc = torch.cumsum(lengths, 0).to(torch.int32)
    return q, k_cache, v_cache, block_tables, seq_lens, query_start_loc


def attend(work: Sequence[Work], seed: int = 0, num_kv_splits: int = 4) -> list[torch.Tensor]:
    """Run one step through the op; returns each sequence's output rows [end - start, Hq, D]."""
    inputs = step_inputs(work, seed)
    out = oracle_kernels.paged_attention(*inputs, SCALE, num_kv_splits)
    qsl = inputs[-1].tolist()
    return [out[qsl[b] : qsl[b + 1]] for b in range(len(work))]


def reference(work: Sequence[Work]) -> list[torch.Tensor]:
    inputs = step_inputs(work, 0)
    out = oracle_kernels.reference_attention(*inputs, SCALE)
    qsl = inputs[-1].tolist()
    return [out[qsl[b] : qsl[b + 1]] for b in range(len(work))]


def schedule(seq: Seq, chunks: Sequence[int]) -> torch.Tensor:
    """The sequence's outputs computed in steps of `chunks` queries each, concatenated."""
    outputs, start = [], 0
    for size in chunks:
        outputs.append(attend([Work(seq, start, start + size)], seed=start)[0])
        start += size
    return torch.cat(outputs)


@pytest.fixture
def kernels() -> Iterator[None]:
    with oracle_kernels.batch_invariant():
        yield


# --- invariant path -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prefill_chunked_prefill_and_decode_agree_bitwise(kernels: None, dtype: torch.dtype) -> None:
    length = 101  # crosses three 32-position chunk boundaries
    seq = make_seq(length, seed=1, dtype=dtype)
    prefill = schedule(seq, [length])
    runs = {
        "chunked by 7": schedule(seq, [7] * 14 + [3]),
        "chunked by 33 and 5": schedule(seq, [33, 5, 33, 30]),
        "decode": schedule(seq, [1] * length),
        "prefill 40 then decode": schedule(seq, [40] + [1] * (length - 40)),
    }
    for name, out in runs.items():
        differing = (out != prefill).reshape(length, -1).any(dim=1).nonzero().flatten().tolist()
        assert differing == [], f"{name}: tokens {differing} differ from the full prefill"


@pytest.mark.parametrize("mode", ["decode", "prefill chunk"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_sequence_is_the_same_alone_and_batched(kernels: None, dtype: torch.dtype, mode: str) -> None:
    rng = random.Random(7)
    target = make_seq(90, seed=2, dtype=dtype)
    work = Work(target, 89, 90) if mode == "decode" else Work(target, 45, 90)
    alone = attend([work])[0]
    for others in range(1, 34):
        batch = []
        for i in range(others):
            length = rng.randint(1, 120)
            start = rng.choice([length - 1, rng.randint(0, length - 1)])  # decode or prefill chunk
            batch.append(Work(make_seq(length, seed=100 + i, dtype=dtype), start, length))
        place = rng.randint(0, others)
        batch.insert(place, work)
        batched = attend(batch, seed=others, num_kv_splits=others)[place]
        assert torch.equal(batched, alone), f"differs beside {others} other sequences at place {place}"


def test_sequences_without_queries_are_allowed(kernels: None) -> None:
    seq = make_seq(20, seed=3, dtype=torch.float32)
    alone = attend([Work(seq, 19, 20)])[0]
    outputs = attend([Work(make_seq(5, 4, torch.float32), 5, 5), Work(seq, 19, 20)])
    assert outputs[0].shape[0] == 0 and torch.equal(outputs[1], alone)


@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (8, 2), (3, 1)], ids=lambda h: f"Hq{h[0]}-Hkv{h[1]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_invariant_path_is_accurate(kernels: None, dtype: torch.dtype, heads: tuple[int, int]) -> None:
    work = [
        Work(make_seq(70, 5, dtype, *heads), 0, 70),
        Work(make_seq(33, 6, dtype, *heads), 32, 33),
        Work(make_seq(64, 7, dtype, *heads), 50, 64),
    ]
    for actual, expected in zip(attend(work), reference(work), strict=True):
        torch.testing.assert_close(actual, expected, rtol=TOLERANCES[dtype], atol=TOLERANCES[dtype])


def test_invariant_path_ignores_num_kv_splits(kernels: None) -> None:
    work = [Work(make_seq(77, 8, torch.float32), 76, 77)]
    first = attend(work, num_kv_splits=1)[0]
    assert all(torch.equal(attend(work, num_kv_splits=s)[0], first) for s in (2, 3, 16, 128))


# --- production path and the reference -------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_production_path_is_accurate(dtype: torch.dtype) -> None:
    work = [Work(make_seq(70, 9, dtype), 0, 70), Work(make_seq(50, 10, dtype), 49, 50)]
    expected = reference(work)
    for splits in (1, 2, 3, 8, 64):
        for actual, exp in zip(attend(work, num_kv_splits=splits), expected, strict=True):
            torch.testing.assert_close(actual, exp, rtol=TOLERANCES[dtype], atol=TOLERANCES[dtype])


def test_production_path_takes_a_mixed_batch_at_once() -> None:
    # Prefill, chunked prefill, decode and a sequence without queries in one vectorized call.
    work = [Work(make_seq(40, 20, torch.float32), 0, 40), Work(make_seq(9, 21, torch.float32), 9, 9),
            Work(make_seq(70, 22, torch.float32), 50, 61), Work(make_seq(33, 23, torch.float32), 32, 33)]
    for splits in (1, 4):
        actual = attend(work, num_kv_splits=splits)
        assert actual[1].shape[0] == 0
        for a, e in zip(actual, reference(work), strict=True):
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


def test_production_path_varies_with_num_kv_splits() -> None:
    # The engine picks num_kv_splits from the batch size: this is its batch variance.
    seq = make_seq(300, 11, torch.float32)
    decodes = {s: torch.cat([attend([Work(seq, p - 1, p)], num_kv_splits=s)[0] for p in range(200, 300)])
               for s in (1, 2, 5, 8)}
    assert any(not torch.equal(decodes[1], decodes[s]) for s in (2, 5, 8))


def test_the_op_switches_between_production_and_invariant() -> None:
    inputs = step_inputs([Work(make_seq(90, 12, torch.float32), 89, 90)], 0)
    default = oracle_kernels.paged_attention(*inputs, SCALE, 5)
    assert torch.equal(default, production_attention(*inputs, SCALE, 5))
    assert oracle_kernels.audit(oracle_kernels.paged_attention, *inputs, SCALE, 5).uncovered == (
        "oracle_kernels::paged_attention",
    )
    with oracle_kernels.batch_invariant():
        invariant = oracle_kernels.paged_attention(*inputs, SCALE, 5)
        assert "oracle_kernels::paged_attention" in oracle_kernels.audit(
            oracle_kernels.paged_attention, *inputs, SCALE, 5
        ).covered
    assert not torch.equal(default, invariant)
    assert torch.equal(oracle_kernels.paged_attention(*inputs, SCALE, 5), default)


def test_reference_matches_a_direct_reading_of_the_contract() -> None:
    # Query i of a sequence sits at position seq_len - q_len + i, sees keys 0..position, and
    # query head h reads kv head h // (Hq // Hkv): written out one query and one head at a time.
    seq = make_seq(12, 13, torch.float64, heads=6, kv_heads=2)
    work = [Work(seq, 8, 12)]
    out = reference(work)[0]
    for i, pos in enumerate(range(8, 12)):
        for h in range(6):
            kvh = h // 3
            scores = (seq.k[: pos + 1, kvh] @ seq.q[pos, h]) * SCALE  # [pos + 1]
            expected = torch.softmax(scores, dim=0) @ seq.v[: pos + 1, kvh]
            torch.testing.assert_close(out[i, h], expected)


def test_bad_inputs_raise_a_clear_error() -> None:
    q, k_cache, v_cache, block_tables, seq_lens, qsl = step_inputs([Work(make_seq(9, 14, torch.float32), 0, 9)], 0)
    with pytest.raises(ValueError, match="multiple of Hkv"):
        oracle_kernels.paged_attention(q[:, :3], k_cache, v_cache, block_tables, seq_lens, qsl, SCALE, 1)
    with pytest.raises(ValueError, match="query_start_loc"):
        oracle_kernels.paged_attention(q, k_cache, v_cache, block_tables, seq_lens, qsl[:1], SCALE, 1)


def test_the_production_op_runs_without_importing_dynamo() -> None:
    """A custom_op kernel imports torch._dynamo on its first call (about 0.8 s on the CPU); ours must not."""
    import subprocess
    import sys

    code = (
        "import sys, torch, oracle_kernels\n"
        "from oracle_kernels.attention import production_attention\n"
        "q = torch.randn(2, 2, 4); kv = torch.randn(2, 4, 1, 4)\n"
        "bt = torch.tensor([[0], [1]], dtype=torch.int32); lens = torch.tensor([3, 2], dtype=torch.int32)\n"
        "qsl = torch.tensor([0, 1, 2], dtype=torch.int32)\n"
        "out = oracle_kernels.paged_attention(q, kv, kv, bt, lens, qsl, 0.5, 2)\n"
        "assert torch.equal(out, production_attention(q, kv, kv, bt, lens, qsl, 0.5, 2))\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_the_op_is_defined_once_when_the_kernels_are_imported_under_two_names() -> None:
    """From a checkout's root the folder is also importable as `kernels`: the second import finds the op
    `oracle_kernels::paged_attention` and both names call the same kernel (defining it twice would raise)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = (
        "import sys, torch, oracle_kernels\n"
        f"sys.path.insert(0, {str(root)!r})\n"
        "import kernels\n"
        "assert kernels is not oracle_kernels\n"
        "q = torch.randn(2, 2, 4); kv = torch.randn(2, 4, 1, 4)\n"
        "bt = torch.tensor([[0], [1]], dtype=torch.int32); lens = torch.tensor([3, 2], dtype=torch.int32)\n"
        "qsl = torch.tensor([0, 1, 2], dtype=torch.int32)\n"
        "a = oracle_kernels.paged_attention(q, kv, kv, bt, lens, qsl, 0.5, 2)\n"
        "b = kernels.paged_attention(q, kv, kv, bt, lens, qsl, 0.5, 2)\n"
        "print(torch.equal(a, b))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
