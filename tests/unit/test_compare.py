from __future__ import annotations

import numpy as np

from oracle.compare import first_divergence, ulp_distance
from oracle.engines.contract import Completion


def test_ulp_distance() -> None:
    one = 1.0
    nxt = float(np.nextafter(np.float32(1.0), np.float32(2.0)))
    assert ulp_distance(one, one) == 0
    assert ulp_distance(one, nxt) == 1
    assert ulp_distance(0.0, -0.0) == 0 or ulp_distance(0.0, -0.0) == 1  # both zeros are adjacent
    tiny = float(np.float32(1e-45))
    assert ulp_distance(-tiny, tiny) == 2


def _c(tokens: list[int], lps: list[float], rows: list[list[float]] | None = None) -> Completion:
    return Completion("r", tokens, lps, logits=[np.array(r, dtype=np.float32) for r in rows] if rows else None,
                      top2=[(1.0, 0.9)] * len(tokens))


def test_identical_has_no_divergence() -> None:
    assert first_divergence(_c([1, 2], [-1.0, -2.0]), _c([1, 2], [-1.0, -2.0])) is None


def test_logits_only_divergence_is_found() -> None:
    a = _c([1, 2], [-1.0, -2.0], [[0.0, 1.0], [0.0, 1.0]])
    b = _c([1, 2], [-1.0, -2.0], [[0.0, 1.0], [0.0, float(np.nextafter(np.float32(1), np.float32(2)))]])
    d = first_divergence(a, b)
    assert d is not None and d.step == 1 and d.kind == "logits" and d.ulp == 0
    assert d.max_abs_logits_diff is not None and d.max_abs_logits_diff > 0


def test_token_divergence_records_margin_and_first_token_step() -> None:
    d = first_divergence(_c([1, 2, 3], [-1.0, -2.0, -3.0]), _c([1, 2, 4], [-1.0, -2.5, -3.0]))
    assert d is not None and d.step == 1 and d.kind == "logprob" and d.first_token_step == 2
    assert d.reference_margin is not None and abs(d.reference_margin - 0.1) < 1e-9


def test_length_divergence() -> None:
    d = first_divergence(_c([1, 2], [-1.0, -2.0]), _c([1], [-1.0]))
    assert d is not None and d.kind == "length" and d.step == 1
