"""The localization rule across tensor-parallel ranks, for any engine that captures every rank.

Each rank's two captured runs get the one-process rule (`oracle.capture.rules.localize_captured`): its first op
whose inputs agree and whose output differs and reaches that rank's output. Of those, the first in execution
order (pass, then call, then rank) is named, with its rank, except a communication op whose inputs differ in
another rank: a partial that moved elsewhere reaches it through the communicator, where one rank's capture
cannot see it, so it is not that op's doing. With no rank naming an op, rank 0's answer stands (the engine's
outputs are rank 0's), `inconclusive` where a communication op was passed over.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from oracle.capture.rows import Captured
from oracle.capture.rules import Finding, LocalizedOp, inputs_equal_at, localize_captured

COMMUNICATION = "communication"


@dataclass(frozen=True)
class RankFinding:
    """The rule's answer across ranks: `finding` (its op carries `rank`) and the rank it was named in (None: no
    op named in any rank; `finding.op` is then rank 0's answer, or None where nothing differs)."""

    finding: Finding
    rank: int | None


def ranks_word(ranks: Sequence[int]) -> str:
    """`rank 1` or `ranks 1, 2`."""
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def localize_ranks(expected: Sequence[Captured], actual: Sequence[Captured], *,
                   target_prompt_len: int | None = None, eager: bool | None = None) -> RankFinding:
    """Apply the rule rank by rank to two runs captured in every rank (rank order) and name the first root."""
    findings = [localize_captured(e, a, eager=eager, target_prompt_len=target_prompt_len)
                for e, a in zip(expected, actual, strict=True)]
    skipped: list[str] = []
    for rank, f in _roots(findings):
        moved = _moved_elsewhere(expected, actual, rank, f)
        if moved:
            call = f.actual_call
            assert call is not None
            skipped.append(f"rank {rank}'s {call.key[0]} {call.key[1]} changed with equal inputs in its rank, "
                           f"but its inputs in {ranks_word(moved)} had changed")
            continue
        return RankFinding(replace(f, op=_with_rank(f, rank, findings, skipped)), rank)
    return RankFinding(Finding(_rank0_answer(findings, skipped)), None)


def _passed_over(findings: list[Finding]) -> LocalizedOp | None:
    """The first op a rank named (all of them passed over), as the bound of an `inconclusive` answer."""
    roots = _roots(findings)
    if not roots:
        return None
    rank, f = roots[0]
    assert f.op is not None
    return replace(f.op, rank=rank)


def _roots(findings: list[Finding]) -> list[tuple[int, Finding]]:
    """(rank, finding) of every rank that named an op, in execution order (pass, then call, then rank)."""
    named = [(rank, f) for rank, f in enumerate(findings)
             if f.op is not None and f.op.status == "localized" and f.actual_call is not None]
    return sorted(named, key=lambda x: (x[1].actual_call.forward_pass, x[1].actual_call.index, x[0]))  # type: ignore[union-attr]


def _inputs_equal(exp: Captured, act: Captured, call_key: tuple[str, str, int], forward_pass: int,
                  positions: list[int]) -> bool | None:
    """Whether the call `call_key` of pass `forward_pass` read equal rows at `positions` in both runs of one rank."""
    call = next((c for c in act.calls if c.key == call_key and c.forward_pass == forward_pass), None)
    if call is None:
        return None
    return inputs_equal_at(exp.rows_at(), act.rows_at(), call, positions)


def _moved_elsewhere(exp: Sequence[Captured], act: Sequence[Captured], rank: int, f: Finding) -> list[int]:
    """For a communication op: the other ranks whose inputs to it had changed (it then only passed their change
    on); empty for any other op, which reads only its own rank's inputs."""
    assert f.op is not None and f.actual_call is not None
    if f.op.op_class != COMMUNICATION:
        return []
    call = f.actual_call
    return [q for q in range(len(exp)) if q != rank and _inputs_equal(
        exp[q], act[q], call.key, call.forward_pass, list(f.op.positions)) is False]


def _with_rank(f: Finding, rank: int, findings: list[Finding], skipped: list[str]) -> LocalizedOp:
    """The named op with its rank, and a note of the other ranks where the same call changed too."""
    assert f.op is not None and f.actual_call is not None
    call = f.actual_call
    also = [q for q, g in enumerate(findings) if q != rank and g.actual_call is not None
            and g.actual_call.key == call.key and g.actual_call.forward_pass == call.forward_pass]
    same = f"the same op changed in {ranks_word(also)} too" if also else ""
    return replace(f.op, rank=rank, note="; ".join(x for x in (f.op.note, same, *skipped[:2]) if x))


def _rank0_answer(findings: list[Finding], skipped: list[str]) -> LocalizedOp | None:
    """No rank named an op: rank 0's answer (the engine's outputs are rank 0's), `inconclusive` where a
    communication op was passed over, never nothing where they differ."""
    first = next((f.op for f in findings if f.op is not None and f.op.status != "localized"), None)
    if first is None and skipped:  # every rank's root was a communication op fed by another rank's change
        first = _passed_over(findings)
    if first is None:
        return None
    note = "; ".join(x for x in (first.note, *skipped[:2]) if x)
    return replace(first, rank=first.rank if first.rank is not None else 0,
                   status="inconclusive" if skipped else first.status, note=note)
