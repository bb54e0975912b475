"""Localize between two tensor-parallel sizes of one engine: the same request alone, captured in every rank at
each size (`CapturesRanks`, oracle.engines.contract), compared where both hold the whole tensor
(`oracle.capture.sizes`), the row-parallel layer confirmed alone and `repro/` written for it.

`SizeCapture` is one size's capture, taken while that size's engine is open; `localize_between` captures the other
size on its engine and names the op. The larger size's engine must be the open one to confirm (the layer's inputs
are captured again there, in every rank); else the op is named, `not checked`, saying why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from oracle.capture.rows import Captured
from oracle.capture.sizes import Place, SizeFinding, confirm_split, localize_sizes
from oracle.engines.contract import CAPTURE_HOW, Capturable, CapturesRanks, Engine, RunSpec, capabilities
from oracle.errors import EngineError
from oracle.localized_op import LocalizedOp

# How many times engine.timeout_s a capture in every rank may take (its warm-up and the run).
CAPTURE_CALLS = 3


@dataclass(frozen=True)
class SizeCapture:
    """One tensor-parallel size's capture of a run: its ranks' `Captured`, in rank order."""

    size: int
    ranks: tuple[Captured, ...]


def capture_every_rank(engine: Engine, spec: RunSpec, snapshot_at: Place | None = None
                       ) -> tuple[tuple[Captured, ...], list[dict[str, Any] | None]]:
    """`spec` captured in every rank of `engine` (one for an engine in one process): each rank's `Captured` and
    its snapshot of `snapshot_at` (plain data: `Snapshot.plain`). Under the watchdog where the engine is guarded."""
    from oracle.capture import capture_run
    from oracle.capture.rows import RowCapture
    from oracle.lifecycle.watchdog import GuardedEngine

    def capture(inner: Any) -> list[dict[str, Any]]:
        declared = capabilities(inner)
        if declared.capture_ranks and isinstance(inner, CapturesRanks):
            return inner.capture_ranks(spec, snapshot_at)
        if declared.capture and isinstance(inner, Capturable):
            rows = RowCapture(snapshot_at=snapshot_at)
            done = capture_run(inner.capture, spec, rows)
            return [{"calls": done.calls, "passes": done.passes, "completion": done.completion,
                     "snapshot": rows.snapshot.plain() if rows.snapshot is not None else None}]
        raise EngineError(f"localize: engine {type(inner).__name__} {CAPTURE_HOW}")

    data = (engine.guarded(capture, "capture", calls=CAPTURE_CALLS) if isinstance(engine, GuardedEngine)
            else capture(engine))
    ranks = tuple(Captured(tuple(d["calls"]), tuple(d["passes"]), d["completion"]) for d in data)
    return ranks, [d.get("snapshot") for d in data]


def capture_size(engine: Engine, spec: RunSpec, size: int) -> SizeCapture:
    return SizeCapture(size, capture_every_rank(engine, spec)[0])


def localize_between(first: SizeCapture, engine: Engine, size: int, spec: RunSpec,
                     repro_dir: Path | None = None) -> LocalizedOp | None:
    """`spec` captured on `engine` (at `size` ranks) against `first`: the first op where the sizes part, confirmed
    where `engine` is the larger size; None where no op held whole at both sizes differs."""
    second = capture_size(engine, spec, size)
    one, many = (first, second) if first.size <= second.size else (second, first)
    found = localize_sizes(one.ranks, many.ranks)
    op = found.op
    if op is None:
        return None
    layout = many.ranks[0].passes[op.forward_pass] if op.forward_pass < len(many.ranks[0].passes) else None
    if layout is not None:
        op = replace(op, engine_step=layout.engine_step, pass_evidence=dict(layout.evidence))
    if op.status != "localized" or found.feeder is None:
        return replace(op, confirm_note=op.confirm_note or "the op is not a row-parallel layer's reduction: "
                       "its re-run across sizes is not built")
    if many is not second:
        return replace(op, confirm_note=f"the TP {many.size} engine had closed before the op was known: its "
                                        "inputs could not be captured again")
    _, snaps = capture_every_rank(engine, spec, found.feeder)
    residual = _residual(many, found)
    op = confirm_split(op, found, snaps, residual)
    if repro_dir is not None and all(s is not None for s in snaps):
        op = _with_repro(op, found, [s for s in snaps if s is not None], residual, repro_dir)
    return op


def _residual(many: SizeCapture, found: SizeFinding) -> dict[int, torch.Tensor] | None:
    """The residual an all-reduce adds in (its second row-aligned input, in rank 0), by position; None without one."""
    call = found.many_call
    if call is None or len(call.inputs) < 2:
        return None
    at = many.ranks[0].rows_at()
    rows = {p: at[(call.inputs[1], p)] for p in call.positions if (call.inputs[1], p) in at}
    return {p: c.rows[i] for p, (c, i) in rows.items()}


# ---------------------------------------------------------------------------------------------
# repro/: the row-parallel layer at both sizes, standalone


def _rows_at(snap: dict[str, Any], t: torch.Tensor, positions: tuple[int, ...]) -> list[list[int]] | None:
    """Where the target's `positions` sit in `t` (the pass's grid index of each), None where `t` is on no grid."""
    from oracle.capture.rows import select_rows

    for grid in snap["layout"].grids:
        if select_rows(t, grid) is not None and all(p in grid.positions for p in positions):
            return [list(grid.rows[grid.positions.index(p)]) for p in positions]
    return None


def _with_repro(op: LocalizedOp, found: SizeFinding, snaps: list[dict[str, Any]],
                residual: dict[int, torch.Tensor] | None, repro_dir: Path) -> LocalizedOp:
    """`repro_dir` written: op.json, inputs.pt (every rank's inputs of the layer, the residual, both engines'
    rows at the differing positions) and repro.py; a folder that could not be written is said in the note."""
    assert found.one_call is not None and found.many_call is not None
    state = snaps[0]["state"]
    one_rows = dict(zip(found.one_call.positions, found.one_call.rows, strict=True))
    many_rows = dict(zip(found.many_call.positions, found.many_call.rows, strict=True))
    spec = {"op": snaps[0]["op"], "rows": _rows_at(snaps[0], snaps[0]["args"][0], op.positions),
            "tensor_parallel_size": op.depends_on.get("tensor_parallel_size"),
            "oracle_kernels": bool(state.oracle_kernels) if state is not None else False,
            "threads": state.threads if state is not None else snaps[0]["threads"], "localized_op": op.to_json()}
    inputs = {"ranks": [{"args": list(s["args"]), "kwargs": dict(s["kwargs"])} for s in snaps],
              "residual": torch.stack([residual[p] for p in op.positions]) if residual else None,
              "engine": [torch.stack([one_rows[p] for p in op.positions]),
                         torch.stack([many_rows[p] for p in op.positions])]}
    if spec["rows"] is None:
        return replace(op, confirm_note=f"{op.confirm_note}; repro/ not written: the layer's input is on no grid")
    try:
        repro_dir.mkdir(parents=True, exist_ok=True)
        (repro_dir / "op.json").write_text(json.dumps(spec, indent=2, default=str) + "\n")
        torch.save(inputs, repro_dir / "inputs.pt")
        (repro_dir / "repro.py").write_text(REPRO_SCRIPT)
    except OSError as err:
        return replace(op, confirm_note=f"{op.confirm_note}; repro/ not written: {err}")
    return replace(op, repro=str(repro_dir))


REPRO_SCRIPT = '''"""The row-parallel layer where two tensor-parallel sizes part, run alone: its matmul once on every rank's shards
joined (the smaller size), and per rank with the partial products summed in rank order (the larger size), on the
inputs captured in the engine's ranks. Prints the ULP distance of the target's rows and whether each re-run gives
its engine's bits. Exit 0: the sizes differ (it reproduces); 1: they agree; 2: it could not run."""

import contextlib
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def ulp(a, b):
    ints = {8: torch.int64, 4: torch.int32, 2: torch.int16}[a.element_size()]
    top = 1 << (8 * a.element_size() - 1)

    def ordered(t):
        bits = t.view(ints).to(torch.int64)
        return torch.where(bits < 0, -(bits + top), bits)

    return int((ordered(a) - ordered(b)).abs().max()) if a.numel() else 0


def joined(ranks):
    first = ranks[0]["args"]
    k = first[0].shape[-1]
    out = []
    for i, a in enumerate(first):
        if not isinstance(a, torch.Tensor) or i > 1:
            out.append(a)
            continue
        dim = a.dim() - 1 if i == 0 else next(d for d in (a.dim() - 1, 0) if a.shape[d] == k)
        out.append(torch.cat([r["args"][i] for r in ranks], dim=dim))
    return out


def take(t, rows):
    return t[tuple(torch.tensor(ix) for ix in zip(*rows))]


def main():
    try:
        spec = json.loads((HERE / "op.json").read_text())
        data = torch.load(HERE / "inputs.pt", weights_only=True)
        ns, name, overload = spec["op"].split(".")
        mode = contextlib.nullcontext()
        if ns == "oracle_kernels" or spec["oracle_kernels"]:
            import oracle_kernels

            mode = oracle_kernels.batch_invariant() if spec["oracle_kernels"] else mode
        func = getattr(getattr(getattr(torch.ops, ns), name), overload)
        torch.set_num_threads(spec["threads"])
    except Exception as err:  # noqa: BLE001
        print(f"could not run: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    ranks, rows = data["ranks"], spec["rows"]
    with torch.no_grad(), mode:
        one = take(func(*joined(ranks), **ranks[0]["kwargs"]), rows)
        parts = [func(*r["args"], **r["kwargs"]) for r in ranks]
        total = parts[0]
        for p in parts[1:]:
            total = total + p
        many = take(total, rows)
        if data["residual"] is not None:
            one, many = data["residual"] + one, data["residual"] + many
    small, large = spec["tensor_parallel_size"]
    for label, alone, engine in (("TP %d" % small, one, data["engine"][0]), ("TP %d" % large, many, data["engine"][1])):
        said = "gives the engine's bits" if ulp(alone, engine) == 0 else "does not give the engine's bits"
        print(f"{label} alone {said}")
    distance = ulp(one, many)
    print(f"{spec['op']} at TP {small} vs TP {large}, the target's rows: {distance} ULP apart")
    return 0 if distance else 1


if __name__ == "__main__":
    sys.exit(main())
'''
