"""Batch invariance of the CPU kernels over hypothesis-drawn shapes, dtypes, batch splits and row positions.

With the kernels on, row i of op(x[a:b]) must be bitwise equal to op(x[i:i+1]) for any batch x[a:b]
that holds row i: where a row sits, and what else is in its batch, never changes a bit. Shapes
around the tile and BLAS switch points are pinned as examples. (CUDA: tests/gpu/test_properties_cuda.py.)
"""

from __future__ import annotations

import oracle_kernels
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from kernel_cases import DTYPES, apply, cases

N_OUT = 24


@given(cases(300, 300), st.integers(0, 2**16))
@example(("mm", "float32", 64, 129, 0, 129, 128), 0)  # a partial tile after a full one
@example(("linear", "bfloat16", 1000, 257, 1, 257, 200), 1)
@example(("log_softmax", "float16", 96, 65, 0, 65, 64), 2)
@example(("rms_norm", "float32", 4096, 17, 0, 17, 16), 3)
def test_a_row_is_bitwise_the_same_in_any_batch(case: tuple[str, str, int, int, int, int, int], seed: int) -> None:
    op, dtype_name, k, rows, start, stop, i = case
    dtype = DTYPES[dtype_name]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g).to(dtype)  # [rows, K]
    w = (torch.randn(N_OUT, k, generator=g) / k**0.5).to(dtype)  # [N, K]
    if op == "rms_norm":
        w = (torch.randn(1, k, generator=g) + 1).to(dtype)
    with oracle_kernels.batch_invariant():
        batched = apply(op, x[start:stop], w)[i - start]
        solo = apply(op, x[i : i + 1], w)[0]
    assert torch.equal(batched, solo), f"{op} {dtype_name} K={k}: row {i} differs in batch [{start}, {stop})"
