"""Batch invariance of the CUDA (Triton) kernels over hypothesis-drawn shapes, dtypes, batch splits and row
positions: row i of op(x[a:b]) is bitwise op(x[i:i+1]) on the device. Run with `pytest -m gpu`."""

from __future__ import annotations

import oracle_kernels
import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
OPS = ("mm", "linear", "softmax", "log_softmax", "mean", "rms_norm")
N_OUT = 96


def apply(op: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if op == "mm":
        return x @ w.t()
    if op == "linear":
        return F.linear(x, w, w[:, 0])
    if op == "softmax":
        return torch.softmax(x, dim=-1)
    if op == "log_softmax":
        return F.log_softmax(x, dim=-1)
    if op == "mean":
        return x.mean(dim=-1, keepdim=True)
    return F.rms_norm(x, (x.shape[-1],), w[0], 1e-6)


@st.composite
def cases(draw: st.DrawFn) -> tuple[str, str, int, int, int, int, int]:
    op = draw(st.sampled_from(OPS))
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    k = draw(st.integers(1, 4096))
    rows = draw(st.integers(1, 1024))
    start = draw(st.integers(0, rows - 1))
    stop = draw(st.integers(start + 1, rows))
    i = draw(st.integers(start, stop - 1))
    return op, dtype, k, rows, start, stop, i


@given(cases(), st.integers(0, 2**16))
@example(("mm", "bfloat16", 4096, 257, 0, 257, 256), 0)  # past a 128-row tile and a CUDA-graph size
@example(("linear", "float16", 1000, 513, 1, 513, 300), 1)
@example(("log_softmax", "float32", 151936 // 64, 65, 0, 65, 64), 2)
def test_a_row_is_bitwise_the_same_in_any_batch_on_cuda(case: tuple[str, str, int, int, int, int, int],
                                                       seed: int) -> None:
    op, dtype_name, k, rows, start, stop, i = case
    dtype = DTYPES[dtype_name]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g).to(dtype).cuda()  # [rows, K]
    w = (torch.randn(N_OUT, k, generator=g) / k**0.5).to(dtype).cuda()  # [N, K]
    if op == "rms_norm":
        w = (torch.randn(1, k, generator=g) + 1).to(dtype).cuda()
    with oracle_kernels.batch_invariant():
        batched = apply(op, x[start:stop], w)[i - start]
        solo = apply(op, x[i : i + 1], w)[0]
    assert torch.equal(batched, solo), f"{op} {dtype_name} K={k}: row {i} differs in batch [{start}, {stop})"
