"""Batch invariance of every covered aten op, bitwise, on the CPU.

For each op, dtype (fp32, bf16, fp16) and row length K: with the kernels enabled, row 0 of
op(x[:M]) must be bitwise equal to op(x[:1]) for M over 1..64 and the sizes around tile and
BLAS switch points; every row of op(x[:M]) must equal its solo result (position independence
inside a tile); and the result must stay as close to torch's own op as the dtype allows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import oracle_kernels
import pytest
import torch
import torch.nn.functional as F

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Row lengths K: powers of two and not. Each invariance test runs two of them by default and
# the other two under `-m slow`, so that the default run sees all four.
ROW_LENGTHS = [64, 96, 1000, 4096]
BATCH_SIZES = [*range(1, 65), 127, 128, 129, 255, 256, 257, 300, 1024]
POSITION_BATCH_SIZES = [23, 130]  # partial tiles, and every position of every tile size (16, 64)
OUT_FEATURES = 48  # N of the matrix products: small, so that K and M can be large and quick
BMM_ROWS = 3  # rows of each A matrix in the bmm cases
BMM_COLS = 8  # columns of each B matrix in the bmm case


@dataclass(frozen=True)
class OpCase:
    """An op applied to a batch x [M, ...]: output row i must depend on x[i] alone."""

    name: str
    aten: str  # the covered aten op the call must reach
    make: Callable[[torch.dtype, int], Callable[[torch.Tensor], torch.Tensor]]  # (dtype, K) -> op
    positive: bool = False  # inputs must be > 0 (rsqrt)
    row_shape: tuple[int, ...] = ()  # extra dims of one row before K
    tolerance: float = 1.0  # multiplier on the dtype's tolerance


def _weights(dtype: torch.dtype, *shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1234)
    # Scaled so outputs stay O(1) whatever K: fp16 must not overflow.
    return (torch.randn(*shape, generator=g) / shape[-1] ** 0.5).to(dtype)


def _mm(dtype: torch.dtype, k: int) -> Callable[[torch.Tensor], torch.Tensor]:
    w = _weights(dtype, OUT_FEATURES, k)
    return lambda x: x @ w.t()


def _linear(dtype: torch.dtype, k: int) -> Callable[[torch.Tensor], torch.Tensor]:
    w = _weights(dtype, OUT_FEATURES, k)
    b = _weights(dtype, 1, OUT_FEATURES)[0]
    return lambda x: F.linear(x, w, b)


def _bmm(dtype: torch.dtype, k: int) -> Callable[[torch.Tensor], torch.Tensor]:
    # Each batch row carries its own pair: x[i] = [A_i; B_i^T], [BMM_ROWS + BMM_COLS, K], so that
    # bmm(A, B) row i depends on x[i] alone. B_i^T -> B_i is a strided [K, N] view.
    return lambda x: torch.bmm(x[:, :BMM_ROWS], x[:, BMM_ROWS:].transpose(1, 2))


def _linear_strided(dtype: torch.dtype, k: int) -> Callable[[torch.Tensor], torch.Tensor]:
    # F.linear on a non-contiguous 3-D input: matmul expands the weight to [M, K, N] (batch
    # stride 0), calls bmm, then adds the bias.
    linear = _linear(dtype, k)
    return lambda x: linear(x.transpose(0, 1).contiguous().transpose(0, 1))


def _rms_norm(dtype: torch.dtype, k: int) -> Callable[[torch.Tensor], torch.Tensor]:
    w = _weights(dtype, 1, k)[0] * k**0.5
    return lambda x: F.rms_norm(x, (k,), w, 1e-6)


OP_CASES = [
    OpCase("mm", "aten::mm", _mm),
    OpCase("linear", "aten::addmm", _linear),
    OpCase("bmm", "aten::bmm", _bmm, row_shape=(BMM_ROWS + BMM_COLS,), tolerance=10.0),
    OpCase("linear_3d_strided", "aten::bmm", _linear_strided, row_shape=(BMM_ROWS,)),
    OpCase("softmax", "aten::_softmax", lambda d, k: lambda x: torch.softmax(x, dim=-1)),
    OpCase("log_softmax", "aten::_log_softmax", lambda d, k: lambda x: F.log_softmax(x, dim=-1)),
    OpCase("sum", "aten::sum.dim_IntList", lambda d, k: lambda x: x.sum(dim=-1), tolerance=4.0),
    OpCase("mean", "aten::mean.dim", lambda d, k: lambda x: x.mean(dim=-1, keepdim=True)),
    OpCase("rms_norm", "aten::mean.dim", _rms_norm),
    OpCase("silu", "aten::silu", lambda d, k: F.silu),
    OpCase("sigmoid", "aten::sigmoid", lambda d, k: torch.sigmoid),
    OpCase("rsqrt", "aten::rsqrt", lambda d, k: torch.rsqrt, positive=True),
]

# Absolute and relative tolerance against torch's own op, per dtype.
TOLERANCES = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _batch(case: OpCase, dtype: torch.dtype, k: int, rows: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, *case.row_shape, k, generator=g)
    return (x.abs() + 0.1 if case.positive else x).to(dtype)


@pytest.fixture
def kernels() -> Iterator[None]:
    with oracle_kernels.batch_invariant():
        yield


def _first_differing_row(a: torch.Tensor, b: torch.Tensor) -> int | None:
    rows = (a != b).reshape(a.shape[0], -1).any(dim=1).nonzero()
    return int(rows[0]) if rows.numel() else None


def _params(fast_lengths: tuple[int, ...]) -> list[object]:
    # (case, dtype, K) for every op and dtype; K outside `fast_lengths` is marked slow, and so is
    # fp16 bmm with a long K: torch's CPU fp16 bmm is a plain loop (about 1 GFLOP/s).
    params: list[object] = []
    for case in OP_CASES:
        for dtype in DTYPES:
            for k in ROW_LENGTHS:
                slow = k not in fast_lengths or (case.name == "bmm" and dtype == torch.float16 and k > 100)
                marks = [pytest.mark.slow] if slow else []
                params.append(pytest.param(case, dtype, k, marks=marks, id=f"{case.name}-{dtype}-{k}"))
    return params


@pytest.mark.parametrize(("case", "dtype", "k"), _params(fast_lengths=(64, 1000)))
def test_row_zero_is_the_same_for_every_batch_size(kernels: None, case: OpCase, dtype: torch.dtype, k: int) -> None:
    op = case.make(dtype, k)
    x = _batch(case, dtype, k, max(BATCH_SIZES), seed=k)
    solo = op(x[:1])
    differing = [m for m in BATCH_SIZES if not torch.equal(op(x[:m])[:1], solo)]
    assert differing == [], f"{case.name}: row 0 differs from its solo result for M in {differing}"


@pytest.mark.parametrize(("case", "dtype", "k"), _params(fast_lengths=(96, 4096)))
def test_every_row_equals_its_solo_result(kernels: None, case: OpCase, dtype: torch.dtype, k: int) -> None:
    op = case.make(dtype, k)
    x = _batch(case, dtype, k, max(POSITION_BATCH_SIZES), seed=k + 1)
    solo = torch.cat([op(x[i : i + 1]) for i in range(x.shape[0])])
    for m in POSITION_BATCH_SIZES:
        row = _first_differing_row(op(x[:m]), solo[:m])
        assert row is None, f"{case.name}: row {row} of a batch of {m} differs from its solo result"


@pytest.mark.parametrize("k", ROW_LENGTHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", OP_CASES, ids=lambda c: c.name)
def test_close_to_torch(case: OpCase, dtype: torch.dtype, k: int) -> None:
    op = case.make(dtype, k)
    x = _batch(case, dtype, k, 37, seed=k + 2)
    expected = op(x)
    with oracle_kernels.batch_invariant():
        actual = op(x)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    tol = TOLERANCES[dtype] * case.tolerance
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("case", OP_CASES, ids=lambda c: c.name)
def test_op_reaches_the_covered_kernel(kernels: None, case: OpCase) -> None:
    op = case.make(torch.float32, 64)
    result = oracle_kernels.audit(op, _batch(case, torch.float32, 64, 5, seed=0))
    assert case.aten in result.covered
    assert result.uncovered == ()


def test_bmm_rows_inside_each_matrix_do_not_depend_on_the_row_count(kernels: None) -> None:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, 300, 96, generator=g)
    b = torch.randn(4, 96, 40, generator=g)
    solo = torch.bmm(a[:, :1], b)
    differing = [m for m in BATCH_SIZES if m <= 300 and not torch.equal(torch.bmm(a[:, :m], b)[:, :1], solo)]
    assert differing == []


@pytest.mark.parametrize("dim", [1, 2, (1, 2), -2])
def test_reductions_over_inner_dims_are_invariant(kernels: None, dim: int | tuple[int, ...]) -> None:
    x = torch.randn(70, 9, 33, generator=torch.Generator().manual_seed(0))
    for op in (lambda t: t.sum(dim=dim), lambda t: t.mean(dim=dim, keepdim=True)):
        solo = op(x[:1])
        assert all(torch.equal(op(x[:m])[:1], solo) for m in (2, 5, 64, 70))
    if isinstance(dim, int):
        solo = torch.softmax(x[:1], dim=dim)
        assert all(torch.equal(torch.softmax(x[:m], dim=dim)[:1], solo) for m in (2, 5, 64, 70))


def test_reductions_keep_torch_semantics(kernels: None) -> None:
    x = torch.randn(6, 5, 4, generator=torch.Generator().manual_seed(0))
    # Output shapes, keepdim, dtype argument, integer inputs and reductions across rows.
    assert x.sum(dim=(1, 2), keepdim=True).shape == (6, 1, 1)
    assert x.mean(dim=-1, dtype=torch.float64).dtype == torch.float64
    assert x.to(torch.bfloat16).sum(dim=-1).dtype == torch.bfloat16
    ints = torch.arange(24).view(4, 6).to(torch.int32)
    assert torch.equal(ints.sum(dim=1), torch.tensor([15, 51, 87, 123]))
    assert ints.sum(dim=1).dtype == torch.int64
    torch.testing.assert_close(x.sum(dim=0), x.double().sum(dim=0).float())
    torch.testing.assert_close(x.sum(dim=[]), x.double().sum().float())
    torch.testing.assert_close(torch.softmax(x, dim=0), torch.softmax(x.double(), dim=0).float())
    assert torch.softmax(torch.tensor(3.0), dim=0).item() == 1.0
    assert torch.randn(0, 7).sum(dim=-1).shape == (0,)
    assert torch.randn(3, 0).mean(dim=-1).isnan().all()


def test_mm_accepts_transposed_and_sliced_operands(kernels: None) -> None:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(50, 40, generator=g)
    b = torch.randn(30, 40, generator=g)
    expected = a.double() @ b.double().t()
    torch.testing.assert_close(a @ b.t(), expected.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.t().contiguous().t() @ b.t(), expected.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a[:, :20] @ b[:, :20].t(), (a[:, :20].double() @ b[:, :20].double().t()).float())
    assert torch.equal(torch.ones(3, 0) @ torch.ones(0, 2), torch.zeros(3, 2))
    assert (torch.ones(0, 4) @ torch.ones(4, 2)).shape == (0, 2)
    with pytest.raises(RuntimeError):
        torch.mm(a, b)


def test_addmm_scalars_and_bias_shapes(kernels: None) -> None:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(20, 8, generator=g), torch.randn(8, 6, generator=g)
    for bias in (torch.randn(6, generator=g), torch.randn(20, 6, generator=g), torch.randn(20, 1, generator=g)):
        expected = 0.5 * bias.double() + 2.0 * (a.double() @ b.double())
        actual = torch.addmm(bias, a, b, beta=0.5, alpha=2.0)
        torch.testing.assert_close(actual, expected.float(), rtol=1e-5, atol=1e-5)
    # beta = 0 ignores the bias, NaN included, as torch does.
    torch.testing.assert_close(torch.addmm(torch.full((6,), float("nan")), a, b, beta=0), a @ b)


def test_pointwise_ops_handle_special_values() -> None:
    x = torch.tensor([float("-inf"), -100.0, -0.0, 0.0, 100.0, float("inf"), float("nan")])
    with oracle_kernels.batch_invariant():
        ours = (F.silu(x), torch.sigmoid(x))
    theirs = (F.silu(x), torch.sigmoid(x))
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_linear_gives_the_same_bits_whichever_way_torch_decomposes_it(kernels: None, dtype: torch.dtype) -> None:
    # Contiguous 3-D input and 1-D bias: addmm. Strided input: bmm on a broadcast weight, then add.
    # Strided bias: mm, then add. A batch of one is always contiguous, so these must agree.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, 1000, generator=g).to(dtype)
    w = torch.randn(48, 1000, generator=g).to(dtype) / 30
    bias_and_spare = torch.randn(48, 2, generator=g).to(dtype)
    bias = bias_and_spare[:, 0].contiguous()
    addmm = F.linear(x, w, bias)
    assert torch.equal(F.linear(x.transpose(0, 1).contiguous().transpose(0, 1), w, bias), addmm)
    assert torch.equal(F.linear(x, w, bias_and_spare[:, 0]), addmm)


@dataclass(frozen=True)
class VariantCase:
    """An op and shape where torch's own CPU kernel is batch-variant: why the op is covered."""

    name: str
    op: Callable[[torch.Tensor], torch.Tensor]
    dtype: torch.dtype
    k: int
    needs_threads: bool = False  # the variance comes from splitting work over threads


VARIANT_CASES = [
    # One output row reduces 40000 elements: torch splits that row over threads, but not a batch's.
    VariantCase("sum", lambda x: x.sum(dim=-1), torch.float32, 40_000, needs_threads=True),
    VariantCase("mean", lambda x: x.mean(dim=-1), torch.float32, 40_000, needs_threads=True),
    VariantCase("rms_norm", lambda x: F.rms_norm(x, (x.shape[-1],)), torch.float32, 40_000, needs_threads=True),
    # Elementwise, no reduction: the vector loop's scalar tail rounds differently.
    VariantCase("silu", F.silu, torch.float32, 1000),
    VariantCase("sigmoid", torch.sigmoid, torch.float32, 1000),
    VariantCase("rsqrt", lambda x: torch.rsqrt(x.abs() + 0.1), torch.bfloat16, 1000),
]


def _rows_differing_from_solo(case: VariantCase) -> int:
    x = torch.randn(34, case.k, generator=torch.Generator().manual_seed(0)).to(case.dtype)
    solo = torch.cat([case.op(x[i : i + 1]) for i in range(34)])
    batches = [case.op(x[:m]) for m in (2, 3, 5, 17, 34)]
    return sum(int((b != solo[: b.shape[0]]).reshape(b.shape[0], -1).any(dim=1).sum()) for b in batches)


@pytest.mark.parametrize("case", VARIANT_CASES, ids=lambda c: c.name)
def test_without_the_kernels_torch_varies(case: VariantCase) -> None:
    if case.needs_threads and torch.get_num_threads() < 2:
        pytest.skip("torch runs on one thread: its reduction does not split rows")
    assert _rows_differing_from_solo(case) > 0


@pytest.mark.parametrize("case", VARIANT_CASES, ids=lambda c: c.name)
def test_with_the_kernels_those_cases_do_not_vary(kernels: None, case: VariantCase) -> None:
    assert _rows_differing_from_solo(case) == 0
