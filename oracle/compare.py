"""Bitwise comparison of two completions of the same target.

Token ids are compared as ints; logprobs and logits by their float32 bit patterns, so -0.0
and 0.0 differ. A NaN or infinite logprob, or a logits row holding NaN or +Inf, equals nothing,
itself included: a broken model never compares equal by accident (oracle.execute refuses such
outputs before any check reads them; this is the second line). ULP distance is the distance
between two float32 values on the ordered integer line of their bit patterns (None when one is
not finite).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from oracle.engines.contract import Completion


def f32_bits(x: float) -> int:
    return int(np.array(x, dtype=np.float32).view(np.uint32))


def ulp_distance(a: float, b: float) -> int:
    """Number of float32 values between a and b (0 when bitwise equal)."""

    def ordered(x: float) -> int:
        bits = f32_bits(x)
        return bits if bits < 0x80000000 else 0x80000000 - bits

    return abs(ordered(a) - ordered(b))


@dataclass(frozen=True)
class Divergence:
    """The first place two outputs of one target differ. `kind`: token | logprob | logits | length."""

    step: int
    kind: str
    expected_token: int | None
    actual_token: int | None
    expected_logprob: float | None
    actual_logprob: float | None
    ulp: int | None
    max_abs_logits_diff: float | None
    reference_margin: float | None  # reference top-1 minus top-2 logit at this step
    first_token_step: int | None  # first step whose sampled token differs, if any
    extra: dict[str, Any] = field(default_factory=dict)
    logits_equal: bool | None = None  # the step's logits rows (or digests) bitwise equal; None: not compared

    @property
    def sampler(self) -> bool:
        """Another token sampled from bitwise equal logits: the sampler's (RNG, top-k/top-p), not the model's."""
        return self.kind == "token" and self.logits_equal is True


def row_digest(row: Any) -> str:
    """sha256 of a logits row's float32 bytes: two rows are bitwise equal iff their digests are."""
    return hashlib.sha256(np.ascontiguousarray(row, dtype=np.float32).tobytes()).hexdigest()


def _row(c: Completion, i: int) -> Any:
    """Step i's logits row, or None where the completion carries none (or kept only its digest)."""
    return c.logits[i] if c.logits is not None and i < len(c.logits) else None


def _finite_row(row: Any) -> bool:
    """No NaN and no +Inf (-Inf is a masked logit)."""
    return not bool(np.any(np.isnan(row) | np.isposinf(row)))


def _logits_equal(a: Completion, b: Completion, i: int) -> tuple[bool | None, float | None]:
    """(rows bitwise equal, max abs diff) at step i, or (None, None) when neither carries logits.

    Both rows present: compared bit by bit, with the max abs difference. A row holding NaN or +Inf
    never equals anything (a broken model must not pass as equal by accident). Otherwise the rows'
    digests are compared (oracle.execute keeps only the rows a divergence needs, and every row's digest).
    """
    ra, rb = _row(a, i), _row(b, i)
    if ra is not None and rb is not None:
        ra = np.asarray(ra, dtype=np.float32)
        rb = np.asarray(rb, dtype=np.float32)
        if ra.shape != rb.shape:
            return False, None
        equal_bits = ra.view(np.uint32) == rb.view(np.uint32)
        if equal_bits.all():  # the common case: no difference to measure
            return _finite_row(ra), 0.0
        same = False
        with np.errstate(invalid="ignore"):  # -inf - -inf where a logit is masked in both: no difference
            diff = np.where(equal_bits, 0.0, np.abs(ra.astype(np.float64) - rb.astype(np.float64)))
        return same, float(np.max(diff))
    da, db = _digest(a, i, ra), _digest(b, i, rb)
    if da is not None and db is not None:
        return da == db, None
    return None, None


def _digest(c: Completion, i: int, row: Any) -> str | None:
    """Step i's row digest: the one the completion carries (a stored result's are sha256 of its rows,
    oracle.execute.keep_rows), else that of its row, else None."""
    if c.logits_digests is not None and i < len(c.logits_digests):
        return c.logits_digests[i]
    return row_digest(row) if row is not None else None


def same_logprob(a: float, b: float) -> bool:
    """Bitwise equal and finite: a NaN or infinite logprob never equals anything, itself included."""
    return f32_bits(a) == f32_bits(b) and math.isfinite(a)


def _at(seq: Sequence[Any], i: int) -> Any:
    """seq[i], None past its end."""
    return seq[i] if i < len(seq) else None


def _margin(c: Completion, i: int) -> float | None:
    """The gap between step i's two most likely logits, where the engine reported them."""
    if c.top2 and i < len(c.top2):
        return float(c.top2[i][0] - c.top2[i][1])
    return None


def _step_divergence(expected: Completion, actual: Completion, i: int,
                     first_token: int | None) -> Divergence | None:
    """How step i differs (token, logprob bits, logits), None when every compared bit agrees."""
    et, at = expected.token_ids[i], actual.token_ids[i]
    el, al = expected.logprobs[i], actual.logprobs[i]
    logits_same, max_abs = _logits_equal(expected, actual, i)
    lp_same = same_logprob(el, al)
    if et == at and lp_same and logits_same is not False:
        return None
    kind = "token" if et != at else ("logprob" if not lp_same else "logits")
    return Divergence(
        step=i, kind=kind, expected_token=et, actual_token=at, expected_logprob=el, actual_logprob=al,
        # A ULP distance means something only between two logprobs of the same token.
        ulp=ulp_distance(el, al) if et == at and math.isfinite(el) and math.isfinite(al) else None,
        max_abs_logits_diff=max_abs, reference_margin=_margin(expected, i),
        first_token_step=first_token, logits_equal=logits_same,
    )


def first_divergence(expected: Completion, actual: Completion) -> Divergence | None:
    """Compare `actual` against `expected` step by step; None when every compared bit agrees."""
    n = min(len(expected.token_ids), len(actual.token_ids))
    first_token = next((i for i in range(n) if expected.token_ids[i] != actual.token_ids[i]), None)
    for i in range(n):
        d = _step_divergence(expected, actual, i, first_token)
        if d is not None:
            return d
    if len(expected.token_ids) != len(actual.token_ids):
        return Divergence(
            step=n, kind="length", expected_token=_at(expected.token_ids, n), actual_token=_at(actual.token_ids, n),
            expected_logprob=None, actual_logprob=None, ulp=None, max_abs_logits_diff=None,
            reference_margin=None, first_token_step=first_token,
        )
    return None


def step_of(c: Completion, i: int) -> Completion:
    """Completion holding only step i of c (to compare against a one-token run)."""
    return Completion(
        c.request_id, c.token_ids[i:i + 1], c.logprobs[i:i + 1],
        logits=c.logits[i:i + 1] if c.logits is not None else None,
        logits_digests=c.logits_digests[i:i + 1] if c.logits_digests is not None else None,
        top2=c.top2[i:i + 1] if c.top2 is not None else None,
    )
