"""The ops and drawn cases the kernel property tests share (CPU: tests/unit/test_properties_kernels.py,
CUDA: tests/gpu/test_properties_cuda.py): row i of op(x[a:b]) must be bitwise op(x[i:i+1])."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
OPS = ("mm", "linear", "softmax", "log_softmax", "mean", "rms_norm")

Case = tuple[str, str, int, int, int, int, int]  # op, dtype, K, rows, batch start, batch stop, row i


def apply(op: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """`op` on x [rows, K] with weights w [N, K] (the bias, the norm weight: parts of w)."""
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


def cases(max_k: int, max_rows: int) -> st.SearchStrategy[Case]:
    @st.composite
    def draw_case(draw: st.DrawFn) -> Case:
        op = draw(st.sampled_from(OPS))
        dtype = draw(st.sampled_from(sorted(DTYPES)))
        k = draw(st.integers(1, max_k))
        rows = draw(st.integers(1, max_rows))
        start = draw(st.integers(0, rows - 1))
        stop = draw(st.integers(start + 1, rows))
        i = draw(st.integers(start, stop - 1))
        return op, dtype, k, rows, start, stop, i

    return draw_case()
