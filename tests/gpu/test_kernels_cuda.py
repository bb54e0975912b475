"""The CUDA backend (Triton) on a GPU: bitwise batch invariance of every covered op, and accuracy.

Run with `pytest -m gpu tests/gpu/test_kernels_cuda.py` on a CUDA machine with triton. Invariance
is bitwise: row 0 of op(x[:M]) against op(x[:1]) for M in 1..64 and on both sides of every tile
and tier boundary up to 4096, and every row of op(x[:M]) against op(x[i:i + 1]) for a few M; the
ops are called through torch (F.linear, torch.softmax, F.rms_norm, ...) with the kernels enabled,
so the registrations are tested too. Accuracy: against torch's own kernels (kernels disabled) or a
float64 reference, within the dtype's tolerance. Paged attention: a token's output is compared
bitwise across a full prefill, a chunked prefill and decode, and alone vs beside 1..33 others.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import oracle_kernels
import pytest
import torch
import torch.nn.functional as F

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CUDA = torch.device("cuda")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
ROW_LENGTHS = [4096, 1000]  # a power of two and not
BATCH_SIZES = [*range(1, 65), 127, 128, 129, 255, 256, 257, 300, 511, 512, 513, 1024, 2048, 4096]
POSITION_BATCH_SIZES = [23, 300]
OUT_FEATURES = 1024  # N of the matrix products
# Max error relative to the largest |reference| value.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}


@pytest.fixture(autouse=True)
def kernels_off_outside() -> Iterator[None]:
    """Every test starts and ends with torch's own kernels."""
    pytest.importorskip("triton")
    oracle_kernels.disable()
    yield
    oracle_kernels.disable()


def _randn(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator(device=CUDA).manual_seed(seed)
    return torch.randn(*shape, generator=g, device=CUDA).to(dtype)


def _rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    scale = expected.double().abs().max().clamp(min=1e-30)
    return float((actual.double() - expected.double()).abs().max() / scale)


@dataclass(frozen=True)
class OpCase:
    """An op as model code calls it: make(dtype, K) -> (x [M, K] -> out [M, ...])."""

    name: str
    make: Callable[[torch.dtype, int], Callable[[torch.Tensor], torch.Tensor]]


def _mm(dtype: torch.dtype, k: int) -> Callable[[torch.Tensor], torch.Tensor]:
    w = _randn(OUT_FEATURES, k, dtype=dtype, seed=1)
    return lambda x: F.linear(x, w)  # aten::mm


def _linear(dtype: torch.dtype, k: int) -> Callable[[torch.Tensor], torch.Tensor]:
    w, b = _randn(OUT_FEATURES, k, dtype=dtype, seed=2), _randn(OUT_FEATURES, dtype=dtype, seed=3)
    return lambda x: F.linear(x, w, b)  # aten::addmm


def _bmm(dtype: torch.dtype, k: int) -> Callable[[torch.Tensor], torch.Tensor]:
    b = _randn(2, k, 256, dtype=dtype, seed=4)
    # [2, M, K] @ [2, K, 256] -> row r of the result is [2, 256], laid out as one row of 512.
    return lambda x: torch.bmm(torch.stack([x, x.flip(-1)]), b).transpose(0, 1).reshape(x.shape[0], -1)


def _rms_norm_engine(dtype: torch.dtype, k: int) -> Callable[[torch.Tensor], torch.Tensor]:
    # As the native engine calls it: on a float32 upcast, no weight.
    return lambda x: F.rms_norm(x.float(), (k,), eps=1e-6)


def _rms_norm_weight(dtype: torch.dtype, k: int) -> Callable[[torch.Tensor], torch.Tensor]:
    w = _randn(k, dtype=dtype, seed=5)
    return lambda x: F.rms_norm(x, (k,), w, eps=1e-6)


OP_CASES = [
    OpCase("mm", _mm),
    OpCase("linear", _linear),
    OpCase("bmm", _bmm),
    OpCase("softmax", lambda d, k: lambda x: torch.softmax(x, dim=-1)),
    OpCase("log_softmax", lambda d, k: lambda x: F.log_softmax(x.float(), dim=-1)),
    OpCase("sum", lambda d, k: lambda x: x.sum(dim=-1, keepdim=True)),
    OpCase("mean", lambda d, k: lambda x: x.mean(dim=-1, keepdim=True)),
    OpCase("rms_norm_engine", _rms_norm_engine),
    OpCase("rms_norm_weight", _rms_norm_weight),
    OpCase("silu", lambda d, k: F.silu),
]


def _differing_batch_sizes(op: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> list[int]:
    solo = op(x[:1])
    return [m for m in BATCH_SIZES if not torch.equal(op(x[:m])[:1], solo)]


@pytest.mark.parametrize("k", ROW_LENGTHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", OP_CASES, ids=lambda c: c.name)
def test_row_zero_is_the_same_for_every_batch_size(case: OpCase, dtype: torch.dtype, k: int) -> None:
    if case.name == "bmm" and k != 1000:
        pytest.skip("bmm runs the mm kernel: one K keeps the compile time down")
    x = _randn(max(BATCH_SIZES), k, dtype=dtype, seed=k)
    with oracle_kernels.batch_invariant():
        op = case.make(dtype, k)
        differing = _differing_batch_sizes(op, x)
    assert differing == [], f"{case.name}: row 0 differs from its solo result for M in {differing}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", OP_CASES, ids=lambda c: c.name)
def test_every_row_equals_its_solo_result(case: OpCase, dtype: torch.dtype) -> None:
    k = 1000
    x = _randn(max(POSITION_BATCH_SIZES), k, dtype=dtype, seed=11)
    with oracle_kernels.batch_invariant():
        op = case.make(dtype, k)
        for m in POSITION_BATCH_SIZES:
            full = op(x[:m])
            rows = [i for i in range(m) if not torch.equal(full[i : i + 1], op(x[i : i + 1]))]
            assert rows == [], f"{case.name}, M={m}: rows {rows[:20]} differ from their solo results"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", OP_CASES, ids=lambda c: c.name)
def test_accuracy_against_torch(case: OpCase, dtype: torch.dtype) -> None:
    k = 1000
    x = _randn(300, k, dtype=dtype, seed=12)
    op = case.make(dtype, k)
    expected = op(x)  # torch's kernels (cuBLAS without TF32 for fp32)
    with oracle_kernels.batch_invariant():
        actual = op(x)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert _rel_error(actual, expected) < TOLERANCE[dtype], case.name


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rows_at_unaligned_addresses(dtype: torch.dtype) -> None:
    # K = 1001: row i of x starts i * 1001 elements in, so x[i:i + 1] is rarely 16-byte aligned and
    # Triton compiles other load code for it; the arithmetic must not change.
    x, w = _randn(37, 1001, dtype=dtype, seed=26), _randn(OUT_FEATURES, 1001, dtype=dtype, seed=27)
    with oracle_kernels.batch_invariant():
        full = F.linear(x, w)
        rows = [i for i in range(37) if not torch.equal(full[i : i + 1], F.linear(x[i : i + 1], w))]
        probs = torch.softmax(x, -1)
        rows += [i for i in range(37) if not torch.equal(probs[i : i + 1], torch.softmax(x[i : i + 1], -1))]
    assert rows == []


def test_fp32_matmul_is_ieee_not_tf32() -> None:
    # TF32 keeps 10 mantissa bits: its error on a K=4096 product is ~1e-3 of the largest value.
    x, w = _randn(64, 4096, dtype=torch.float32, seed=13), _randn(512, 4096, dtype=torch.float32, seed=14)
    with oracle_kernels.batch_invariant():
        out = x @ w.t()
    assert _rel_error(out, x.double() @ w.double().t()) < 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_every_matmul_tier_gives_the_same_bits(dtype: torch.dtype) -> None:
    """The premise of the tiers in config.py: same K loop and instruction, different tile shapes, same bits."""
    from oracle_kernels.triton import matmul
    from oracle_kernels.triton.config import MatmulTiles, matmul_config

    x, w = _randn(300, 1000, dtype=dtype, seed=15), _randn(OUT_FEATURES, 1000, dtype=dtype, seed=16)
    config = matmul_config(dtype)
    tiers = [tiles for _, tiles in config.tiers] + ([config.narrow] if config.narrow else [])
    extra = [MatmulTiles(64, 32, 64, 8, 4, 4), MatmulTiles(128, 64, 64, 8, 4, 3)]
    results = {t: matmul.mm(x, w.t(), t) for t in [*tiers, *extra]}
    largest = config.tiers[-1][1]
    differing = [t for t, out in results.items() if not torch.equal(out, results[largest])]
    assert differing == [], (
        f"these tiles give other bits than {largest}: {differing}; the tiers are not interchangeable on "
        f"{torch.cuda.get_device_name()} (set one tier in kernels/triton/config.py)"
    )


def test_bmm_broadcast_and_3d_linear_match_mm() -> None:
    x, w = _randn(3, 50, 1000, dtype=torch.bfloat16, seed=17), _randn(OUT_FEATURES, 1000, dtype=torch.bfloat16, seed=18)
    with oracle_kernels.batch_invariant():
        strided = F.linear(x.transpose(0, 1), w)  # bmm with the weight broadcast over the batch
        flat = F.linear(x.transpose(0, 1).reshape(-1, 1000), w)  # mm
    assert torch.equal(strided.reshape(-1, OUT_FEATURES), flat)


def test_without_the_kernels_cublas_varies_with_the_batch() -> None:
    """The negative control: row 0 of torch's mm changes with M, so the invariance tests can fail."""
    found: dict[str, list[int]] = {}
    for dtype in (torch.bfloat16, torch.float32):
        x, w = _randn(4096, 4096, dtype=dtype, seed=19), _randn(OUT_FEATURES, 4096, dtype=dtype, seed=20)
        solo = x[:1] @ w.t()
        found[str(dtype)] = [m for m in BATCH_SIZES if not torch.equal((x[:m] @ w.t())[:1], solo)]
    if not any(found.values()):
        pytest.xfail(f"cuBLAS gave row 0 the same bits for every M on {torch.cuda.get_device_name()} "
                     f"(K=4096, N={OUT_FEATURES}); the invariance tests above cannot fail on this machine")
    assert any(found.values())


def test_disable_restores_torchs_kernels_bitwise() -> None:
    x, w = _randn(7, 1000, dtype=torch.bfloat16, seed=21), _randn(OUT_FEATURES, 1000, dtype=torch.bfloat16, seed=22)
    before = x @ w.t()
    with oracle_kernels.batch_invariant():
        during = x @ w.t()
    assert torch.equal(before, x @ w.t())
    assert _rel_error(during, before) < TOLERANCE[torch.bfloat16]


def test_covered_ops_lists_the_cuda_rows() -> None:
    covered = oracle_kernels.covered_ops("cuda")
    assert set(oracle_kernels.covered_ops("cpu")) <= set(covered)
    assert "aten::_fused_rms_norm" in covered


def test_rms_norm_reaches_our_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """F.rms_norm on CUDA must run through a covered op: `_fused_rms_norm`, or mean.dim on the composite path."""
    from oracle_kernels.triton import reduction

    calls: list[str] = []
    for name in ("rms_norm", "mean_dim"):
        original = getattr(reduction, name)

        def counting(*args: object, _name: str = name, _original: Callable[..., object] = original) -> object:
            calls.append(_name)
            return _original(*args)

        monkeypatch.setattr(reduction, name, counting)
    x = _randn(5, 4096, dtype=torch.bfloat16, seed=23)
    with oracle_kernels.batch_invariant():
        F.rms_norm(x.float(), (4096,), eps=1e-6)
        F.rms_norm(x, (4096,), torch.ones(4096, dtype=torch.bfloat16, device=CUDA), eps=1e-6)
    assert len(calls) == 2, calls


def test_audit_of_a_decoder_block_on_cuda_is_clean() -> None:
    w = _randn(OUT_FEATURES, 1000, dtype=torch.bfloat16, seed=24)

    def block(x: torch.Tensor) -> torch.Tensor:
        h = F.rms_norm(x.float(), (x.shape[-1],), eps=1e-6).to(x.dtype)
        return torch.log_softmax(F.linear(F.silu(h), w).float(), dim=-1)

    with torch.no_grad(), oracle_kernels.batch_invariant():
        result = oracle_kernels.audit(block, _randn(4, 1000, dtype=torch.bfloat16, seed=25))
    assert result.ok, result.uncovered
    assert {"aten::mm", "aten::silu", "aten::_log_softmax"} <= set(result.covered)


# --- paged attention -------------------------------------------------------------------------------------

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
SCALE = HEAD_DIM**-0.5
TARGET_LEN = 1100  # crosses the 512-position partitions twice
PREFILL_CHUNKS = ((0, 300), (300, 777), (777, TARGET_LEN))  # edges off the chunk and partition boundaries
DECODE_POSITIONS = (0, 1, 63, 64, 511, 512, 513, 1023, 1024, TARGET_LEN - 1)
Seq = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # q [L, Hq, D], k, v [L, Hkv, D]
Work = tuple[Seq, int, int]  # a sequence and the positions start..end-1 scheduled this step


def _seq(length: int, dtype: torch.dtype, seed: int) -> Seq:
    q, k, v = (_randn(length, h, HEAD_DIM, dtype=dtype, seed=seed * 3 + i)
               for i, h in enumerate((HEADS, KV_HEADS, KV_HEADS)))
    return q, k, v


def _step(work: Sequence[Work], seed: int) -> tuple[torch.Tensor, ...]:
    """One step's inputs: blocks at random places of a NaN-filled cache (a read of an unused slot shows)."""
    rng = random.Random(seed)
    dtype = work[0][0][0].dtype
    blocks_per_seq = [-(-end // BLOCK_SIZE) for _, _, end in work]
    free = list(range(sum(blocks_per_seq) + 5))
    rng.shuffle(free)
    k_cache = torch.full((len(free), BLOCK_SIZE, KV_HEADS, HEAD_DIM), float("nan"), dtype=dtype, device=CUDA)
    v_cache = torch.full_like(k_cache, float("nan"))
    tables = torch.zeros(len(work), max(blocks_per_seq) + 2, dtype=torch.int32)
    queries, qsl, lens = [], [0], []
    for b, ((q, k, v), start, end) in enumerate(work):
        blocks = torch.tensor([free.pop() for _ in range(blocks_per_seq[b])])
        tables[b, : len(blocks)] = blocks
        pos = torch.arange(end)
        slots = (blocks[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE).to(CUDA)
        k_cache.view(-1, KV_HEADS, HEAD_DIM)[slots] = k[:end]
        v_cache.view(-1, KV_HEADS, HEAD_DIM)[slots] = v[:end]
        queries.append(q[start:end])
        qsl.append(qsl[-1] + end - start)
        lens.append(end)
    return (torch.cat(queries), k_cache, v_cache, tables.to(CUDA),
            torch.tensor(lens, dtype=torch.int32, device=CUDA), torch.tensor(qsl, dtype=torch.int32, device=CUDA))


def _attend(work: Sequence[Work], seed: int = 0, num_kv_splits: int = 1) -> torch.Tensor:
    with oracle_kernels.batch_invariant():
        return oracle_kernels.paged_attention(*_step(work, seed), SCALE, num_kv_splits)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_attention_prefill_chunked_prefill_and_decode_agree_bitwise(dtype: torch.dtype) -> None:
    target = _seq(TARGET_LEN, dtype, seed=1)
    full = _attend([(target, 0, TARGET_LEN)])
    reference = oracle_kernels.reference_attention(*_step([(target, 0, TARGET_LEN)], 0), SCALE)
    assert _rel_error(full, reference) < TOLERANCE[dtype]
    chunked = torch.cat([_attend([(target, s, e)], seed=s) for s, e in PREFILL_CHUNKS])
    assert torch.equal(chunked, full)
    for pos in DECODE_POSITIONS:
        decoded = _attend([(target, pos, pos + 1)], seed=pos, num_kv_splits=8)
        assert torch.equal(decoded[0], full[pos]), f"decode at position {pos} differs from the prefill"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_attention_does_not_depend_on_the_other_sequences(dtype: torch.dtype) -> None:
    target = _seq(TARGET_LEN, dtype, seed=2)
    rng = random.Random(3)
    last_chunk = PREFILL_CHUNKS[-1]
    solo_decode = _attend([(target, TARGET_LEN - 1, TARGET_LEN)])
    solo_chunk = _attend([(target, *last_chunk)])
    for num_others in range(1, 34):
        others: list[Work] = []
        for i in range(num_others):
            length = rng.randint(1, 1500)
            start = length - 1 if rng.random() < 0.6 else rng.randint(0, length - 1)  # decode or a prefill chunk
            others.append((_seq(length, dtype, seed=100 + num_others * 40 + i), start, length))
        place = rng.randint(0, num_others)
        for mine, solo in (((target, TARGET_LEN - 1, TARGET_LEN), solo_decode), ((target, *last_chunk), solo_chunk)):
            work = [*others[:place], mine, *others[place:]]
            out = _attend(work, seed=num_others, num_kv_splits=max(1, 16 // len(work)))
            first = sum(e - s for _, s, e in others[:place])
            assert torch.equal(out[first : first + solo.shape[0]], solo), (num_others, place, mine[1])


def test_production_attention_varies_with_the_split() -> None:
    """The negative control: without the kernels, decode attention depends on num_kv_splits."""
    inputs = _step([(_seq(TARGET_LEN, torch.float32, seed=4), TARGET_LEN - 1, TARGET_LEN)], 0)
    outs = [oracle_kernels.paged_attention(*inputs, SCALE, s) for s in (1, 2, 4, 8)]
    if all(torch.equal(o, outs[0]) for o in outs):
        pytest.xfail("the production split-KV path gave the same bits for every split count here")
