"""Which classes of ops invariant mode covers, and by what; a gap stops invariance from passing.

An invariant mode can mix mechanisms: vLLM with `invariance: oracle_kernels` runs our kernels for the matmuls,
its own attention backend, its own sampler and all-reduce. An engine says, in `describe()["coverage"]`, what
runs each class of ops (`OP_CLASSES`) as its processes read it (`OpCoverage`: covered, uncovered, unclaimed).
An uncovered class is a kernel known to follow the batch that nothing pins: a divergence there is a gap in the
mode, not the engine's bug, and bitwise-equal trials say nothing about it. So invariance cannot pass while one
is uncovered: the check is vacuous, its divergences are blamed on the kernels (`cause: kernels`), and the line
names the op (`verdict_line`).

Imports nothing of oracle but the report's sections: the posture, the judge and the views read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from oracle.report_sections import OpCoverage, PostureRecord

# The classes of ops an invariant mode must cover, in the order they are shown.
OP_CLASSES = ("matmul", "norm", "attention", "sampler", "all_reduce")


def coverage_of(described: Mapping[str, Any]) -> dict[str, OpCoverage]:
    """An engine's `describe()["coverage"]` as the report holds it: the known classes, in `OP_CLASSES` order. An
    entry that does not read as an `OpCoverage` is uncovered (a claim the tool cannot read is not a claim)."""
    given = described.get("coverage") if isinstance(described, Mapping) else None
    if not isinstance(given, Mapping):
        return {}
    out: dict[str, OpCoverage] = {}
    for op in OP_CLASSES:
        if op not in given:
            continue
        try:
            out[op] = OpCoverage.model_validate(given[op])
        except ValidationError:
            out[op] = OpCoverage(status="uncovered", by="unreadable", why=f"describe()['coverage'][{op!r}] is not "
                                 "{status, by, why}")
    return out


def uncovered(posture: PostureRecord | Mapping[str, Any] | None, mode: str = "invariant") -> dict[str, OpCoverage]:
    """The op classes `mode` leaves uncovered, from a report's `environment.posture`."""
    if posture is None:
        return {}
    record = posture if isinstance(posture, PostureRecord) else PostureRecord.model_validate(posture)
    return {op: c for op, c in record.coverage.get(mode, {}).items() if c.status == "uncovered"}


def gap_text(gaps: Mapping[str, OpCoverage]) -> str:
    """`attention (vLLM FLASH_ATTN: its KV split follows the batch)`, one per uncovered class."""
    return "; ".join(f"{op} ({c.by}{': ' + c.why if c.why else ''})" for op, c in gaps.items())


def verdict_line(gaps: Mapping[str, OpCoverage], trials: int, divergent: int) -> str:
    """Invariance's one line when the mode leaves ops uncovered: which, and what the trials could not say."""
    seen = (f"{divergent} of {trials} trials diverged, blamed on the mode, not the engine" if divergent
            else f"{trials} trials bitwise equal say nothing of them")
    return f"invariant mode does not cover {gap_text(gaps)}: {seen}"


def summary(coverage: Mapping[str, OpCoverage]) -> str:
    """One mode's coverage in a line: `matmul oracle_kernels; attention UNCOVERED vLLM FLASH_ATTN; ...`."""
    words = {"covered": "", "uncovered": "UNCOVERED ", "unclaimed": "default "}
    return "; ".join(f"{op} {words[c.status]}{c.by}" for op, c in coverage.items())
