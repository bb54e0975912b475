"""Batch invariance of the CUDA (Triton) kernels over hypothesis-drawn shapes, dtypes, batch splits and row
positions: row i of op(x[a:b]) is bitwise op(x[i:i+1]) on the device. Run with `pytest -m gpu`."""

from __future__ import annotations

import oracle_kernels
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from kernel_cases import DTYPES, apply, cases

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

N_OUT = 96  # weight rows: the N of mm and linear


@given(cases(4096, 1024), st.integers(0, 2**16))
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
