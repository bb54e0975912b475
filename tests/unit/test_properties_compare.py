"""Properties of the bitwise comparisons (oracle.compare) over hypothesis-drawn floats and completions.

float32 values as the engines report them: signed zeros, NaN payloads, subnormals and infinities
included. A drawn perturbation at step k is found at step k and nowhere before.
"""

from __future__ import annotations

import math
import struct

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from oracle.compare import f32_bits, first_divergence, same_logprob, ulp_distance
from oracle.engines.contract import Completion

F32 = st.floats(width=32, allow_nan=False)
ANY_F32 = st.integers(0, 2**32 - 1).map(lambda b: struct.unpack("<f", struct.pack("<I", b))[0])


def _next_up(x: float) -> float:
    return float(np.nextafter(np.float32(x), np.float32(np.inf)))


@given(F32, F32)
@example(0.0, -0.0)
@example(1e-45, -1e-45)  # the smallest subnormals either side of zero
@example(3.4028234663852886e38, math.inf)
def test_ulp_distance_is_a_metric_on_float32(a: float, b: float) -> None:
    d = ulp_distance(a, b)
    assert d == ulp_distance(b, a) >= 0
    assert (d == 0) == (f32_bits(a) == f32_bits(b) or (a == 0.0 and b == 0.0))  # +0 and -0 are 0 apart


@given(F32.filter(lambda x: x < 3.4e38), F32)
@example(-0.0, 0.0)
@example(1e-45, 0.0)
def test_adjacent_float32s_are_one_ulp_apart_and_distances_add_up(a: float, b: float) -> None:
    up = _next_up(a)
    assert ulp_distance(a, up) == 1  # -0.0 and +0.0 are one point: both are 1 below the smallest subnormal
    lo, hi = sorted((a, b))
    mid = _next_up(lo) if lo < hi else lo
    if lo <= mid <= hi:
        assert ulp_distance(lo, hi) == ulp_distance(lo, mid) + ulp_distance(mid, hi)


@given(ANY_F32)
@example(float("nan"))
@example(struct.unpack("<f", struct.pack("<I", 0x7FC00001))[0])  # a NaN with a payload
@example(-0.0)
def test_same_logprob_is_bitwise_and_never_true_for_nan_or_inf(x: float) -> None:
    assert same_logprob(x, x) == math.isfinite(x)
    assert not same_logprob(x, _next_up(x)) or not math.isfinite(x) or _next_up(x) == x
    if x == 0.0:
        assert not same_logprob(0.0, -0.0)  # signed zeros differ in their bits


_STEPS = st.lists(st.tuples(st.integers(0, 96), F32.filter(math.isfinite)), min_size=1, max_size=12)


@given(_STEPS, st.data())
def test_first_divergence_finds_the_first_perturbed_step(steps: list[tuple[int, float]], data: st.DataObject) -> None:
    tokens, logprobs = [t for t, _ in steps], [lp for _, lp in steps]
    expected = Completion("r", list(tokens), list(logprobs))
    assert first_divergence(expected, Completion("r", list(tokens), list(logprobs))) is None
    k = data.draw(st.integers(0, len(steps) - 1), label="step")
    flip_token = data.draw(st.booleans(), label="flip token")
    t2, lp2 = list(tokens), list(logprobs)
    if flip_token:
        t2[k] = (t2[k] + 1) % 97
    else:
        lp2[k] = _next_up(lp2[k]) if _next_up(lp2[k]) != lp2[k] else -lp2[k] - 1.0
    d = first_divergence(expected, Completion("r", t2, lp2))
    assert d is not None and d.step == k
    assert d.kind == ("token" if flip_token else "logprob")
    if not flip_token:
        assert d.ulp is not None and d.ulp >= 1
