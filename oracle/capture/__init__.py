"""Localization below the engines: per-op capture (torch only), the rule, confirmation, the repro.

An engine that runs its model in our process (or in its worker) implements one method,
`capture(run: RunSpec, rows: PassRecorder) -> Completion`: it runs `run` with `rows` (a `RowCapture`) active on
each forward pass it makes for the target (see `oracle.engines.contract.Capturable`). `localize_with` does the
rest for any engine: both runs captured, the rule applied, the named op run again alone on each
run's captured inputs (confirmation), and `repro/` written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from oracle.capture.rows import Captured, Grid, OpCall, PassLayout, RowCapture, Snapshot, select_rows
from oracle.capture.rules import Finding, LocalizedOp, localize_captured
from oracle.engines.contract import Completion, RunSpec
from oracle.timings import PhaseClock

__all__ = ["Captured", "Finding", "Grid", "LocalizedOp", "OpCall", "PassLayout", "RowCapture", "Snapshot",
           "localize_captured", "localize_with", "select_rows"]

CaptureFn = Callable[[RunSpec, RowCapture], Completion]


def capture_run(capture: CaptureFn, spec: RunSpec, rows: RowCapture | None = None) -> Captured:
    rows = rows or RowCapture()
    with torch.no_grad():
        completion = capture(spec, rows)
    return Captured(tuple(rows.calls), tuple(rows.passes), completion, rows.snapshot)


def localize_with(capture: CaptureFn, expected: RunSpec, actual: RunSpec, *, eager: bool | None = None,
                  repro_dir: Path | None = None, imports: Sequence[str] = (),
                  clock: PhaseClock | None = None) -> LocalizedOp | None:
    """Capture both runs with `capture`, name the op (or the cache, or a bound), confirm it, write repro/.
    `clock`, where given, gains where the time went (TimesItsLocalize's parts): `capture` (both runs), `rule`,
    `confirm` (both runs again with the op's inputs copied, the op alone on each) and `repro`."""
    clock = clock or PhaseClock()
    with clock.phase("capture"):
        exp = capture_run(capture, expected)
        act = capture_run(capture, actual)
    with clock.phase("rule"):
        prompt_len = len(actual.requests[actual.target_index].prompt_token_ids)
        finding = localize_captured(exp, act, eager=eager, target_prompt_len=prompt_len)
    if finding.op is None or finding.op.status != "localized" or finding.actual_call is None:
        return finding.op
    del exp, act
    return confirm_alone(capture, expected, actual, finding, repro_dir, imports, clock)


def confirm_alone(capture: CaptureFn, expected: RunSpec, actual: RunSpec, finding: Finding, repro_dir: Path | None,
                  imports: Sequence[str] = (), clock: PhaseClock | None = None) -> LocalizedOp:
    """Run the named op alone on the inputs it got in each run (captured again, whole), in the state it ran in
    inside the engine, and compare the target's rows with the engine's (`oracle.capture.confirm.verdict`)."""
    from oracle.capture.confirm import (
        differing_quantities,
        launch_quantities,
        row_inputs_differ,
        run_alone,
        verdict,
    )

    clock = clock or PhaseClock()
    op, a_call, e_call = finding.op, finding.actual_call, finding.expected_call
    assert op is not None and a_call is not None
    if e_call is None:
        return replace(op, confirmation="not checked", confirm_note="the op did not run in the solo run")
    with clock.phase("confirm"):
        e = capture_run(capture, expected, RowCapture(snapshot_at=(e_call.forward_pass, e_call.key))).snapshot
        a = capture_run(capture, actual, RowCapture(snapshot_at=(a_call.forward_pass, a_call.key))).snapshot
        if e is None or a is None:
            return replace(op, confirmation="not checked",
                           confirm_note="the op's inputs were not captured again in the rerun")
        depends = differing_quantities(launch_quantities(e), launch_quantities(a))
        moved = row_inputs_differ(e, a, op.positions)
        if moved:  # an input the capture could not follow already differed at the target's rows
            return _upstream(op, moved, depends)
        try:
            alone = (run_alone(e, e_call.grid, e_call.kind), run_alone(a, a_call.grid, a_call.kind))
        except Exception as err:  # an op that needs its engine's context (a forward context, a stream) to run
            return replace(op, confirmation="not checked", depends_on=depends,
                           confirm_note=f"the op could not run alone: {type(err).__name__}: {err}")
        engine_rows = (dict(zip(e_call.positions, e_call.rows, strict=True)),
                       dict(zip(a_call.positions, a_call.rows, strict=True)))
        status, note = verdict(op.positions, alone, engine_rows, _how_it_ran(e, a))
        op = replace(op, confirmation=status, confirm_note=note, depends_on=depends)
    if repro_dir is None:
        return op
    with clock.phase("repro"):
        return _with_repro(op, repro_dir, (e, a), (e_call, a_call), imports)


def _upstream(op: LocalizedOp, moved: list[str], depends: dict[str, list[Any]]) -> LocalizedOp:
    """The op read an input that already differed where the capture could not follow it: not the cause."""
    cause = (f"its input {', '.join(moved)} already differed at the target's rows (computed where the capture "
             "could not follow): the cause is upstream of this op")
    return replace(op, status="inconclusive", inputs_equal=False, confirmation="not checked", depends_on=depends,
                   note="; ".join(x for x in (op.note, cause) if x))


def _how_it_ran(expected: Snapshot, actual: Snapshot) -> str:
    """The state the op is re-run in, for the confirmation's note."""
    state = actual.state or expected.state
    return state.describe() if state is not None else f"{actual.threads} threads, kernel mode unrecorded"


def _with_repro(op: LocalizedOp, repro_dir: Path, snapshots: tuple[Snapshot, Snapshot], calls: tuple[OpCall, OpCall],
                imports: Sequence[str]) -> LocalizedOp:
    """`repro_dir` written for the op; a folder that could not be written is said in the note."""
    from oracle.capture.repro import write_repro

    (e, a), (e_call, a_call) = snapshots, calls
    try:
        path = write_repro(repro_dir, op.to_json(), e, a, (e_call.grid, a_call.grid), imports, a_call.kind)
    except OSError as err:
        return replace(op, confirm_note=f"{op.confirm_note}; repro/ not written: {err}")
    return replace(op, repro=str(path))
