"""Logit rows that test a sampler's edge cases: NaN (either sign bit), +-inf, all -inf, ties, a lone spike."""

from __future__ import annotations

import torch

INF, NAN = float("inf"), float("nan")
NEG_NAN = torch.tensor([-(2**22)], dtype=torch.int32).view(torch.float32).item()  # 0xffc00000: sign bit set


def special_rows(vocab: int, seed: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """[13, vocab] float32: a random row, then NaN, +-inf, all -inf and tied rows (as far as `vocab` allows)."""
    x = torch.randn(13, vocab, generator=torch.Generator().manual_seed(seed)) * 4
    last = vocab - 1
    x[1, last // 2] = NAN
    x[2, :] = -INF
    x[3, last] = INF
    x[3, last // 3] = INF
    x[4, :] = -INF
    x[4, last] = 1.5
    x[5, last // 2] = x[5, last] = NAN
    x[5, 0] = INF
    x[6, :] = 2.0  # every column tied
    x[7, last // 3] = x[7, last] = x[7].abs().max() + 1  # a tied maximum: top-2 [m, m], the first index
    x[8, last // 4] = -INF
    x[9, :] = NAN
    x[10, 0] = -INF
    x[11, last] = 1e30  # exp underflows to 0 for every other column
    x[12, last // 2] = NEG_NAN  # the largest value too, though its bits read as a negative number
    return x.to(device)
