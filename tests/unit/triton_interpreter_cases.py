"""The Triton kernels run by Triton's CPU interpreter: invariance and accuracy on tiny shapes.

Not collected on its own (the name does not start with test_): test_kernels_triton_interpret.py
runs this file in a child pytest with TRITON_INTERPRET=1, because the interpreter must be chosen
before triton decorates the kernels, and choosing it in the main test process would turn every
later Triton kernel of that process into interpreted Python. Run it by hand with

    TRITON_INTERPRET=1 pytest tests/unit/triton_interpreter_cases.py

The launchers are called directly on CPU tensors (the CUDA dispatch key is not involved). The
interpreter runs each tl.dot tile as one numpy matmul of the tile's fixed shape, so these tests
check the kernels' indexing, masking, tiling and merge order, and that no row's arithmetic sees
the batch; the tensor-core arithmetic itself is checked on a GPU (tests/gpu/test_kernels_cuda.py).

Three interpreter quirks are handled here, not in the kernels: it multiplies bf16 dot operands as
their raw uint16 bits (we patch its dot to widen them to fp32 first, as the GPU does), its dot is
the host BLAS, which may round a tile's rows by their position (we patch it to multiply one row
at a time), and it truncates fp32 -> bf16 conversions instead of rounding to nearest (bf16
tolerances allow 1 ulp).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Sequence

import pytest
import torch
import torch.nn.functional as F

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs TRITON_INTERPRET=1 (run through test_kernels_triton_interpret.py)", allow_module_level=True)
pytest.importorskip("triton")

import numpy as np  # noqa: E402
import triton.language as tl  # noqa: E402
from oracle_kernels.attention import reference_attention  # noqa: E402
from oracle_kernels.triton import attention, matmul, pointwise, reduction  # noqa: E402
from oracle_kernels.triton.config import AttentionTiles, MatmulTiles  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

_interpreter_dot = interpreter.InterpreterBuilder.create_dot


def _widen_bf16(x):  # type: ignore[no-untyped-def]
    if x.dtype.scalar == tl.bfloat16 and x.data.dtype == np.uint16:  # the bits, not the values
        return interpreter.TensorHandle((x.data.astype(np.uint32) << 16).view(np.float32), tl.float32)
    return x


def _dot_row_by_row(self, a, b, d, *args, **kwargs):  # type: ignore[no-untyped-def]
    """The interpreter's dot, one row of the tile at a time.

    It runs numpy's matmul, that is the host's BLAS, whose fp32 kernels may round a row by where it
    sits in the tile (OpenBLAS on an AVX2 EPYC gave rows 6..11 of a 16-row tile other bits): that
    would be the host's batch variance, not the kernel's. One [1, K] @ [K, N] product per row gives
    every row the same code path, as a GPU's instruction does.
    """
    a, b = _widen_bf16(a), _widen_bf16(b)
    rows = a.data.shape[-2]
    out = [_interpreter_dot(self, interpreter.TensorHandle(a.data[..., i:i + 1, :], a.dtype.scalar), b,
                            interpreter.TensorHandle(d.data[..., i:i + 1, :], d.dtype.scalar), *args, **kwargs)
           for i in range(rows)]
    return interpreter.TensorHandle(np.concatenate([o.data for o in out], axis=-2), d.dtype.scalar)


interpreter.InterpreterBuilder.create_dot = _dot_row_by_row

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Max error relative to max |reference|: bf16 allows the interpreter's truncation (1 ulp = 2^-7).
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3, torch.float64: 1e-12}
# Small tiles: several tiles per product, several tiles per program of the persistent grid.
SMALL_MM = MatmulTiles(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_stages=1)


def _randn(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    scale = expected.double().abs().max().clamp(min=1e-30)
    return float((actual.double() - expected.double()).abs().max() / scale)


def _differing_batch_sizes(op: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, sizes: Sequence[int]) -> list[int]:
    """Batch sizes M for which row 0 of op(x[:M]) differs in any bit from op(x[:1])."""
    solo = op(x[:1])
    return [m for m in sizes if not torch.equal(op(x[:m])[:1], solo)]


def _differing_rows(op: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> list[int]:
    """Rows i of op(x) that differ in any bit from op(x[i:i + 1])."""
    full = op(x)
    return [i for i in range(x.shape[0]) if not torch.equal(full[i : i + 1], op(x[i : i + 1]))]


# --- matmul --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [40, 80])  # one partial K block; a full one and a partial one (BLOCK_K = 64)
@pytest.mark.parametrize("dtype", [*DTYPES, torch.float64], ids=str)
def test_mm_row_zero_across_batch_sizes_and_tiers(dtype: torch.dtype, k: int) -> None:
    x, w = _randn(70, k, dtype=dtype, seed=1), _randn(24, k, dtype=dtype, seed=2)
    # 64 -> 65 crosses from the decode tier to the next one for bf16/fp16.
    sizes = [1, 2, 3, 5, 8, 13, 31, 63, 64, 65, 70]
    assert _differing_batch_sizes(lambda a: matmul.mm(a, w.t()), x, sizes) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_mm_small_tiles_every_row_and_batch_size(dtype: torch.dtype) -> None:
    x, w = _randn(35, 40, dtype=dtype, seed=3), _randn(40, 40, dtype=dtype, seed=4)
    op = lambda a: matmul.mm(a, w.t(), SMALL_MM)  # noqa: E731
    assert _differing_batch_sizes(op, x, [2, 16, 17, 35]) == []
    assert _differing_rows(op, x[:20]) == []


def test_mm_runs_shallower_where_shared_memory_runs_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU with less shared memory than the tiles' stages need gets the same tiles with fewer stages."""
    from triton.runtime.errors import OutOfResources

    real = matmul.matmul_kernel
    tried: list[int] = []

    class SmallSharedMemory:
        def __getitem__(self, grid):  # type: ignore[no-untyped-def]
            def launch(*args, num_stages: int, **kwargs):  # type: ignore[no-untyped-def]
                tried.append(num_stages)
                if num_stages > 2:
                    raise OutOfResources(num_stages * 1000, 2000, "shared memory")
                return real[grid](*args, num_stages=num_stages, **kwargs)
            return launch

    x, w = _randn(5, 40, dtype=torch.float32, seed=7), _randn(24, 40, dtype=torch.float32, seed=8)
    tiles = MatmulTiles(block_m=16, block_n=16, block_k=16, group_m=1, num_warps=4, num_stages=4)
    expected = matmul.mm(x, w.t(), tiles)
    monkeypatch.setattr(matmul, "matmul_kernel", SmallSharedMemory())
    monkeypatch.setattr(matmul, "_STAGES_THAT_FIT", {})
    assert torch.equal(matmul.mm(x, w.t(), tiles), expected)
    assert tried == [4, 3, 2]
    assert torch.equal(matmul.mm(x, w.t(), tiles), expected)
    assert tried == [4, 3, 2, 2]  # the depth that fitted is remembered


@pytest.mark.parametrize("dtype", [*DTYPES, torch.float64], ids=str)
def test_mm_accuracy(dtype: torch.dtype) -> None:
    x, w = _randn(33, 80, dtype=dtype, seed=5), _randn(48, 80, dtype=dtype, seed=6)
    expected = x.double() @ w.double().t()
    assert _rel_error(matmul.mm(x, w.t()), expected) < TOLERANCE[dtype]
    assert _rel_error(matmul.mm(x, w.t(), SMALL_MM), expected) < TOLERANCE[dtype]


def test_addmm_epilogue_matches_torch() -> None:
    x, w = _randn(5, 40, dtype=torch.float32, seed=7), _randn(24, 40, dtype=torch.float32, seed=8)
    bias = _randn(24, dtype=torch.float32, seed=9)
    for beta, alpha in ((1, 1), (0.5, 2.0), (0, 1)):
        expected = torch.addmm(bias, x, w.t(), beta=beta, alpha=alpha)
        torch.testing.assert_close(matmul.addmm(bias, x, w.t(), beta, alpha), expected, rtol=1e-5, atol=1e-5)
    # beta = 0 ignores the bias, NaN included, as torch does.
    out = matmul.addmm(torch.full((24,), float("nan")), x, w.t(), beta=0)
    assert torch.isfinite(out).all()
    # addmm is mm plus an exact epilogue: a row gets the bits of mm + add.
    assert torch.equal(matmul.addmm(bias, x, w.t()), matmul.mm(x, w.t()) + bias)


def test_bmm_entries_do_not_depend_on_the_batch() -> None:
    a, b = _randn(3, 20, 40, dtype=torch.bfloat16, seed=10), _randn(3, 40, 24, dtype=torch.bfloat16, seed=11)
    full = matmul.bmm(a, b, SMALL_MM)
    for i in range(3):
        for r in (0, 7, 19):
            assert torch.equal(full[i, r], matmul.bmm(a[i : i + 1, r : r + 1], b[i : i + 1], SMALL_MM)[0, 0])
    assert _rel_error(full, a.double() @ b.double()) < TOLERANCE[torch.bfloat16]
    # B broadcast over the batch is one mm over all rows.
    w = b[:1].expand(3, 40, 24)
    assert torch.equal(matmul.bmm(a, w), matmul.mm(a.reshape(60, 40), b[0]).view(3, 20, 24))


def test_matmul_rejects_mismatched_operands() -> None:
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        matmul.mm(torch.zeros(2, 3), torch.zeros(4, 5))
    with pytest.raises(RuntimeError, match="same dtype"):
        matmul.mm(torch.zeros(2, 3), torch.zeros(3, 5, dtype=torch.float64))


# --- row reductions ----------------------------------------------------------------------------------

# C = 40 with a block of 16: three passes over the row, the last one partial.
ROW_OPS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]] = {
    "softmax": (lambda x: reduction.softmax(x, -1, block=16), lambda x: torch.softmax(x.double(), -1)),
    "log_softmax": (lambda x: reduction.log_softmax(x, -1, block=16), lambda x: torch.log_softmax(x.double(), -1)),
    "sum": (lambda x: reduction.sum_dim(x, [-1], block=16), lambda x: x.double().sum(-1)),
    "mean": (lambda x: reduction.mean_dim(x, [-1], True, block=16), lambda x: x.double().mean(-1, keepdim=True)),
    "rms_norm": (
        lambda x: reduction.rms_norm(x, (40,), torch.linspace(0.5, 1.5, 40).to(x.dtype), 1e-6, block=16)[0],
        lambda x: F.rms_norm(x.double(), (40,), torch.linspace(0.5, 1.5, 40).to(x.dtype).double(), 1e-6),
    ),
    "silu": (pointwise.silu, lambda x: F.silu(x.double())),
    "sigmoid": (pointwise.sigmoid, lambda x: torch.sigmoid(x.double())),
    "rsqrt": (lambda x: pointwise.rsqrt(x.abs() + 0.1), lambda x: torch.rsqrt(x.double().abs() + 0.1)),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(ROW_OPS))
def test_row_ops_are_batch_invariant_and_accurate(name: str, dtype: torch.dtype) -> None:
    ours, reference = ROW_OPS[name]
    x = _randn(17, 40, dtype=dtype, seed=12) * 3
    assert _differing_batch_sizes(ours, x, [2, 17]) == []
    assert _differing_rows(ours, x[:5]) == []
    assert _rel_error(ours(x), reference(x)) < max(TOLERANCE[dtype], 1e-6)


@pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")  # the -inf row, in numpy
def test_reductions_follow_torchs_conventions() -> None:
    x = _randn(4, 5, 6, dtype=torch.float32, seed=13)
    torch.testing.assert_close(reduction.sum_dim(x, [1, 2], keepdim=True), x.sum((1, 2), keepdim=True))
    torch.testing.assert_close(reduction.mean_dim(x, [-1, 1]), x.mean((-1, 1)))
    torch.testing.assert_close(reduction.sum_dim(x.bfloat16(), [-1], dtype=torch.float32),
                               x.bfloat16().sum(-1, dtype=torch.float32))
    torch.testing.assert_close(reduction.sum_dim(x, [0]), x.sum(0))  # across rows: torch's kernel
    torch.testing.assert_close(reduction.sum_dim(x, None), x.sum())
    assert reduction.sum_dim(torch.arange(6).view(2, 3), [1]).dtype == torch.int64
    torch.testing.assert_close(reduction.softmax(x, 1), torch.softmax(x, 1))
    half = x.half()
    out = reduction.log_softmax(half, -1, half_to_float=True)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.log_softmax(half.float(), -1), rtol=1e-5, atol=1e-5)
    # A row of -inf is NaN, as torch's softmax gives.
    assert torch.isnan(reduction.softmax(torch.full((2, 20), float("-inf")), -1)).all()
    out, rstd = reduction.rms_norm(x, (5, 6), None, None)
    torch.testing.assert_close(out, F.rms_norm(x, (5, 6)))
    assert rstd.shape == (4, 1, 1) and rstd.dtype == torch.float32


# --- paged attention -----------------------------------------------------------------------------------

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 4, 2, 16, 8
SCALE = HEAD_DIM**-0.5
# Chunks of 16 keys and partitions of 32 positions, so that a 40-token sequence crosses both.
SMALL_ATTENTION = AttentionTiles(rows=16, chunk=16, partition=32, num_warps=4, num_stages=1)
Seq = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # q [L, Hq, D], k, v [L, Hkv, D]


def _seq(length: int, dtype: torch.dtype, seed: int) -> Seq:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(length, h, HEAD_DIM, generator=g).to(dtype) for h in (HEADS, KV_HEADS, KV_HEADS))
    return q, k, v


def _step(work: Sequence[tuple[Seq, int, int]], seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Inputs for one step: each (sequence, start, end) schedules queries start..end-1; NaN in unused slots."""
    rng = random.Random(seed)
    dtype = work[0][0][1].dtype
    blocks_per_seq = [-(-end // BLOCK_SIZE) for _, _, end in work]
    free = list(range(sum(blocks_per_seq) + 3))
    rng.shuffle(free)
    k_cache = torch.full((len(free), BLOCK_SIZE, KV_HEADS, HEAD_DIM), float("nan"), dtype=dtype)
    v_cache = torch.full_like(k_cache, float("nan"))
    tables = torch.zeros(len(work), max(blocks_per_seq) + 1, dtype=torch.int32)
    queries, qsl, lens = [], [0], []
    for b, ((q, k, v), start, end) in enumerate(work):
        blocks = [free.pop() for _ in range(blocks_per_seq[b])]
        tables[b, : len(blocks)] = torch.tensor(blocks)
        slots = torch.tensor([blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(end)])
        k_cache.view(-1, KV_HEADS, HEAD_DIM)[slots] = k[:end]
        v_cache.view(-1, KV_HEADS, HEAD_DIM)[slots] = v[:end]
        queries.append(q[start:end])
        qsl.append(qsl[-1] + end - start)
        lens.append(end)
    return (torch.cat(queries), k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32),
            torch.tensor(qsl, dtype=torch.int32))


def _attend(work: Sequence[tuple[Seq, int, int]], tiles: AttentionTiles | None, seed: int = 0) -> torch.Tensor:
    return attention.paged_attention(*_step(work, seed), SCALE, tiles)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_attention_prefill_chunked_decode_and_batch_agree_bitwise(dtype: torch.dtype) -> None:
    target = _seq(40, dtype, seed=1)
    full = _attend([(target, 0, 40)], SMALL_ATTENTION)  # [40, Hq, D]
    assert _rel_error(full, reference_attention(*_step([(target, 0, 40)]), SCALE)) < TOLERANCE[dtype]
    # Chunked prefill, with chunk edges off the chunk and partition boundaries.
    chunked = torch.cat([_attend([(target, s, e)], SMALL_ATTENTION) for s, e in ((0, 13), (13, 33), (33, 40))])
    assert torch.equal(chunked, full)
    # Decode at positions next to the chunk (16) and partition (32) boundaries.
    for pos in (15, 16, 31, 32, 39):
        assert torch.equal(_attend([(target, pos, pos + 1)], SMALL_ATTENTION)[0], full[pos]), pos
    # Beside other sequences, prefills and decodes, before and after it in the batch.
    others = [(_seq(n, dtype, seed=10 + n), start, n) for n, start in ((9, 0), (30, 29), (20, 5), (50, 49))]
    for place in (0, 3):
        work = [*others[:place], (target, 0, 40), *others[place:]]
        out = _attend(work, SMALL_ATTENTION, seed=place)
        first = sum(e - s for _, s, e in others[:place])
        assert torch.equal(out[first : first + 40], full), place


def test_attention_default_tiles_prefill_equals_decode() -> None:
    target = _seq(40, torch.float16, seed=2)
    full = _attend([(target, 0, 40)], None)
    assert _rel_error(full, reference_attention(*_step([(target, 0, 40)]), SCALE)) < TOLERANCE[torch.float16]
    for pos in (0, 39):
        assert torch.equal(_attend([(target, pos, pos + 1)], None)[0], full[pos])


def test_attention_workspace_split_does_not_change_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    # A step too big for the scratch buffer runs as several launches; a row's bits are the same.
    target = _seq(40, torch.float32, seed=3)
    work = [(target, 0, 40), (_seq(20, torch.float32, seed=4), 0, 20)]
    whole = _attend(work, SMALL_ATTENTION)
    monkeypatch.setattr(attention, "ATTENTION_WORKSPACE_BYTES", 4 * 2 * HEADS * (HEAD_DIM + 2) * 8)
    assert len(attention._tile_groups(*_groups_inputs(work))) > 2
    assert torch.equal(_attend(work, SMALL_ATTENTION), whole)


def _groups_inputs(work: Sequence[tuple[Seq, int, int]]) -> tuple[torch.Tensor, torch.Tensor, int]:
    _, _, _, _, lens, qsl = _step(work)
    qt = attention.query_tiles(qsl, lens, int(qsl[-1]), SMALL_ATTENTION.rows // 2, SMALL_ATTENTION.partition)
    return qt.tiles, qt.parts, HEADS * (HEAD_DIM + 2)


def test_query_tiles_cover_every_token_once() -> None:
    qsl = torch.tensor([0, 5, 5, 6, 26], dtype=torch.int32)  # a prefill, an empty slot, a decode, a chunk
    lens = torch.tensor([5, 9, 40, 30], dtype=torch.int32)
    qt = attention.query_tiles(qsl, lens, 28, tokens_per_tile=8, partition=16)
    seq, first, count, pos = qt.tiles.long().unbind(1)
    assert seq.tolist() == [0, 2, 3, 3, 3]
    assert first.tolist() == [0, 5, 6, 14, 22] and count.tolist() == [5, 1, 8, 8, 4]
    assert pos.tolist() == [0, 39, 10, 18, 26]
    assert qt.parts.tolist() == [1, 3, 2, 2, 2]
    assert qt.positions.tolist() == [0, 1, 2, 3, 4, 39, *range(10, 30), -1, -1]


def test_layout_is_read_once_per_step_and_never_reused_stale() -> None:
    # The layers of one step pass the same layout tensors: their tiles are computed once.
    qsl = torch.tensor([0, 3, 4], dtype=torch.int32)
    lens = torch.tensor([3, 9], dtype=torch.int32)
    first = attention._cached_query_tiles(qsl, lens, 4, 8, 32)
    assert attention._cached_query_tiles(qsl, lens, 4, 8, 32) is first
    assert attention._cached_query_tiles(qsl, lens, 4, 8, 64) is not first  # other parameters
    # New tensors (the next step), even with equal values, are read again.
    again = attention._cached_query_tiles(qsl.clone(), lens.clone(), 4, 8, 32)
    assert again is not first and torch.equal(again.tiles, first.tiles)
    # So is a tensor written in place since the last call.
    assert attention._cached_query_tiles(qsl, lens, 4, 8, 32).positions.tolist() == [0, 1, 2, 8]
    lens[1] = 10
    assert attention._cached_query_tiles(qsl, lens, 4, 8, 32).positions.tolist() == [0, 1, 2, 9]
