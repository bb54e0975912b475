"""Two runs' completions bitwise equal: tokens, logprobs and digests (first_divergence), and full logits rows."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from oracle.compare import first_divergence
from oracle.engines.contract import Completion


def assert_same_bits(a: Sequence[Completion], b: Sequence[Completion]) -> None:
    for x, y in zip(a, b, strict=True):
        assert first_divergence(x, y) is None, x.request_id
        if x.logits is not None:
            assert y.logits is not None
            assert all(np.array_equal(p.view(np.uint32), q.view(np.uint32)) for p, q in zip(x.logits, y.logits, strict=True))
