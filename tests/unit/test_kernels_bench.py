"""Speed of the invariant CPU kernels against torch's own (run with `pytest -m bench -s`).

Prints one line per shape: the best of several runs for torch and for the invariant kernel. The
only assertion is that both computed the same product to the dtype's tolerance; speed is
reported, never asserted.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import oracle_kernels
import pytest
import torch

pytestmark = pytest.mark.bench


def _best_ms(fn: Callable[[], object], repeats: int = 20) -> float:
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("k_n", [(1024, 1024), (64, 128)], ids=lambda s: f"K{s[0]}-N{s[1]}")
def test_mm_speed(dtype: torch.dtype, k_n: tuple[int, int]) -> None:
    k, n = k_n
    g = torch.Generator().manual_seed(0)
    w = torch.randn(n, k, generator=g).to(dtype)
    for m in (1, 16, 128, 1024):
        x = torch.randn(m, k, generator=g).to(dtype)
        expected = x @ w.t()
        torch_ms = _best_ms(lambda x=x: x @ w.t())
        with oracle_kernels.batch_invariant():
            actual = x @ w.t()
            ours_ms = _best_ms(lambda x=x: x @ w.t())
        torch.testing.assert_close(actual, expected, rtol=2e-2, atol=2e-2)
        print(f"mm {dtype} M={m} K={k} N={n}: torch {torch_ms:.3f} ms, invariant {ours_ms:.3f} ms "
              f"({ours_ms / torch_ms:.1f}x)")
