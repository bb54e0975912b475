"""The vendor path of the bf16/fp16 products (kernels/cublaslt.py) on a GPU.

cuBLASLt with split-K off may take a product only where it gives the Triton kernel's bits; these
tests check that premise on the Qwen3-8B projection shapes for every batch size of the sweep, that
a problem it computes differently stays on Triton (so the row stays invariant), that graph capture
of an unseen problem stays on Triton, and that enable/disable leave torch's flags as they were.
Run with `pytest -m gpu tests/gpu`.
"""

from __future__ import annotations

from collections.abc import Iterator

import oracle_kernels
import pytest
import torch
import torch.nn.functional as F
from oracle_kernels import cublaslt

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CUDA = torch.device("cuda")
QWEN3_8B_PROJECTIONS = [(4096, 6144), (4096, 4096), (4096, 24576), (12288, 4096), (4096, 151936)]
SIZES = [1, 2, 3, 8, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 300, 511, 512, 513, 1024, 2048, 4096]


@pytest.fixture(autouse=True)
def fresh_verdicts() -> Iterator[None]:
    pytest.importorskip("triton")
    if not cublaslt.available():
        pytest.skip("this torch cannot turn split-K off in cuBLASLt (needs torch >= 2.10 with CUDA)")
    oracle_kernels.disable()
    cublaslt.forget()
    yield
    oracle_kernels.disable()
    cublaslt.forget()


def _randn(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator(device=CUDA).manual_seed(seed)
    return torch.randn(*shape, generator=g, device=CUDA).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(("k", "n"), QWEN3_8B_PROJECTIONS, ids=lambda v: str(v))
def test_cublaslt_without_split_k_gives_the_triton_bits(k: int, n: int, dtype: torch.dtype) -> None:
    """The premise, on the issue's shapes: every M from 32 up is admitted, and row 0 never changes."""
    from oracle_kernels.triton import matmul

    x, w = _randn(4096, k, dtype=dtype, seed=k + n), _randn(n, k, dtype=dtype, seed=k * n % 9973)
    with oracle_kernels.batch_invariant():
        solo = F.linear(x[:1], w)
        differing = [m for m in SIZES if not torch.equal(F.linear(x[:m], w)[:1], solo)]
        paths = {m: cublaslt.use_cublaslt(x[:m], w.t(), matmul.triton_mm) for m in SIZES}
    assert differing == []
    assert cublaslt.summary()["barred"] == []
    assert [m for m, vendor in paths.items() if vendor] == [m for m in SIZES if m >= cublaslt.CUBLASLT_MIN_M]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_a_problem_cublaslt_computes_otherwise_stays_invariant(dtype: torch.dtype) -> None:
    """N = 333 rows are not 16-byte aligned: cuBLASLt's kernels there were seen to give other bits."""
    x, w = _randn(4096, 4000, dtype=dtype, seed=1), _randn(333, 4000, dtype=dtype, seed=2)
    with oracle_kernels.batch_invariant():
        solo = F.linear(x[:1], w)
        differing = [m for m in SIZES if not torch.equal(F.linear(x[:m], w)[:1], solo)]
        last = [m for m in (33, 300, 4096) if not torch.equal(F.linear(x[:m], w)[m - 1:], F.linear(x[m - 1:m], w))]
    assert differing == [] and last == []
    assert all((b["k"], b["n"]) == (4000, 333) for b in cublaslt.summary()["barred"])


def test_an_unseen_problem_under_graph_capture_runs_on_triton() -> None:
    from oracle_kernels.triton import matmul

    x, w = _randn(64, 4096, dtype=torch.bfloat16, seed=3), _randn(4096, 4096, dtype=torch.bfloat16, seed=4)
    with oracle_kernels.batch_invariant():
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            matmul.triton_mm(x, w.t())  # compile outside the capture
            with torch.cuda.graph(graph, stream=stream):
                captured = F.linear(x, w)
        torch.cuda.current_stream().wait_stream(stream)
        graph.replay()
        assert cublaslt.summary()["admitted_problems"] == 0
        eager = F.linear(x, w)  # now compared, admitted, and run by cuBLASLt
        assert cublaslt.summary()["admitted_problems"] == 1
    assert torch.equal(captured, eager)


def test_enable_and_disable_leave_torchs_flags_as_they_were() -> None:
    m = torch.backends.cuda.matmul

    def flags() -> tuple[object, ...]:
        return (m.allow_bf16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction_split_k,
                m.allow_fp16_reduced_precision_reduction, m.allow_fp16_reduced_precision_reduction_split_k,
                torch.backends.cuda.preferred_blas_library())

    before = flags()
    with oracle_kernels.batch_invariant():
        assert flags() == (False, False, False, False, torch._C._BlasBackend.Cublaslt)
        with oracle_kernels.batch_invariant():  # nested: still on
            pass
        assert flags()[-1] == torch._C._BlasBackend.Cublaslt
    assert flags() == before


def test_a_flag_changed_while_enabled_sends_products_back_to_triton() -> None:
    from oracle_kernels.triton import matmul

    x, w = _randn(64, 1024, dtype=torch.bfloat16, seed=5), _randn(1024, 1024, dtype=torch.bfloat16, seed=6)
    with oracle_kernels.batch_invariant():
        assert cublaslt.use_cublaslt(x, w.t(), matmul.triton_mm)
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = (False, True)  # split-K allowed again
        assert not cublaslt.use_cublaslt(x, w.t(), matmul.triton_mm)


def test_oracle_kernels_matmul_triton_turns_the_path_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from oracle_kernels.triton import matmul

    monkeypatch.setenv("ORACLE_KERNELS_MATMUL", "triton")
    x, w = _randn(64, 1024, dtype=torch.bfloat16, seed=7), _randn(1024, 1024, dtype=torch.bfloat16, seed=8)
    before = torch.backends.cuda.preferred_blas_library()
    with oracle_kernels.batch_invariant():
        assert torch.backends.cuda.preferred_blas_library() == before
        assert not cublaslt.use_cublaslt(x, w.t(), matmul.triton_mm)
        assert torch.equal(F.linear(x, w), matmul.triton_mm(x, w.t()))
