"""The native engine at `tensor_parallel_size` N > 1: its start (ranks, shard, kernel audit) and its localization.

Start: the size must divide the model's heads, kv heads and intermediate size (exit 2 naming the field), the
device is the CPU (the ranks meet over gloo), and the model comes from a checkpoint folder (every rank loads
its own shard). In invariant mode every rank proves its kernels before any trial: two short requests run side
by side while each rank audits its passes (`oracle_kernels.audit`); a rank without the kernels registered,
whose passes reached a batch-variant op on torch's kernels, or none of ours, stops the run with
`KernelsNotInForce` naming the rank.

Localization captures every rank (the native capture in each rank's process, with rank 0's layout of the
target's rows sent with each pass) and applies the rule rank by rank (`oracle.capture.ranks`): each rank's
first op whose inputs agree and whose output differs. Of those, the first in execution order is named, with
its rank, except a communication op whose inputs differ in another rank (a partial that moved elsewhere is
not the all-reduce's doing). A communication op is confirmed by re-running the reduction alone (the
group's `Reducer`) on every rank's captured partials, for each run; any other op by re-running it alone in
its rank on its captured inputs, as `oracle.capture.confirm_alone` does in one process.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from oracle.capture import Captured, LocalizedOp, RowCapture
from oracle.capture.ranks import localize_ranks
from oracle.capture.rules import Finding
from oracle.config import EngineConfig
from oracle.engines.contract import Request, RunSpec, SamplingParams
from oracle.engines.native.model import Decoder
from oracle.engines.native.parallel import ALL_REDUCE_OP, Reducer, all_reduce, divisibility_problem, shard
from oracle.engines.native.ranks import RankGroup
from oracle.errors import ConfigError, EngineError

__all__ = ["RankGroup", "kernels_not_in_force", "localize_sharded", "start_ranks"]

_FIELD = "engine.options.tensor_parallel_size"
_AUDIT_SAMPLING = SamplingParams(max_tokens=2)


def start_ranks(engine: Any, model: Path | Decoder, config: EngineConfig, reducer: Reducer) -> RankGroup:
    """Shard `engine`'s decoder to rank 0's part and start ranks 1..N-1 (`engine.tensor_parallel_size`)."""
    size = engine.tensor_parallel_size
    if isinstance(model, Decoder):
        raise ConfigError(f"{_FIELD}: a sharded engine loads its checkpoint in every rank: give a model folder")
    if engine.device.type != "cpu":
        raise ConfigError(f"{_FIELD}: tensor_parallel_size {size} runs on the CPU (ranks meet over gloo), "
                          f"not {engine.device.type!r}")
    problem = divisibility_problem(engine.decoder.config, size)
    if problem is not None:
        raise ConfigError(f"{_FIELD}: {problem}")
    ranks = RankGroup(size, model, config.dtype, engine.mode, config.num_threads or 1, reducer)
    try:
        cfg0, w0 = shard(engine.decoder.config, engine.decoder.w, 0, size)
        engine.decoder = Decoder(cfg0, w0)
        engine.decoder.reduce = all_reduce
        engine.ranks = ranks
        engine.rank_reports = audit_ranks(engine, ranks) if engine.mode == "invariant" else \
            [{"rank": 0, "pid": os.getpid(), "device": "cpu", "kernels": False}, *ranks.reports]
    except BaseException:
        engine.ranks = None
        ranks.close()
        raise
    if engine.mode == "invariant":
        why = kernels_not_in_force(engine.rank_reports, size)
        if why:
            engine.ranks = None
            ranks.close()
            from oracle.engines.vllm_engine import KernelsNotInForce

            raise KernelsNotInForce("native tensor parallel: invariant mode's oracle_kernels are not in force, so "
                                    "no trial was run: " + "; ".join(why))
    return ranks


def audit_ranks(engine: Any, ranks: RankGroup) -> list[dict[str, Any]]:
    """Every rank's account of its kernels after two short requests ran side by side (rank order)."""
    import oracle_kernels

    ranks.call(("audit_begin",))
    seen: dict[str, set[str]] = {"covered": set(), "uncovered": set()}
    kernels: list[bool] = []
    decoder = engine.decoder
    forward = decoder.forward

    def audited(inputs: Any, kv: Any) -> torch.Tensor:
        box: list[torch.Tensor] = []
        result = oracle_kernels.audit(lambda: box.append(forward(inputs, kv)))
        seen["covered"].update(result.covered)
        seen["uncovered"].update(result.uncovered)
        kernels.append(oracle_kernels.is_enabled())
        return box[0]

    decoder.forward = audited
    try:
        engine.generate([Request("audit-a", tuple(range(1, 6)), _AUDIT_SAMPLING),
                         Request("audit-b", tuple(range(7, 16)), _AUDIT_SAMPLING)])
    finally:
        del decoder.forward
    others = ranks.call(("audit_end",))
    mine = {"rank": 0, "pid": os.getpid(), "device": "cpu", "kernels": bool(kernels) and all(kernels),
            "threads": torch.get_num_threads(), "batch_variant_covered": sorted(seen["covered"]),
            "batch_variant_uncovered": sorted(seen["uncovered"])}
    return [mine, *others]


def kernels_not_in_force(reports: list[dict[str, Any]], size: int) -> list[str]:
    """One line per rank that runs default kernels in invariant mode (empty: in force in every rank)."""
    why: list[str] = []
    seen = {r.get("rank") for r in reports}
    why += [f"rank {r}: did not report" for r in range(size) if r not in seen]
    for r in reports:
        rank = r.get("rank")
        if not r.get("kernels"):
            why.append(f"rank {rank} (pid {r.get('pid')}, cpu): oracle_kernels are not registered in its process")
        elif r.get("batch_variant_uncovered"):
            why.append(f"rank {rank}: its passes reached batch-variant ops on torch's kernels: "
                       f"{', '.join(r['batch_variant_uncovered'])}")
        elif not r.get("batch_variant_covered"):
            why.append(f"rank {rank}: its audited passes reached none of oracle_kernels' ops")
    return why


# ---------------------------------------------------------------------------------------------
# Capture in every rank


def capture_all(engine: Any, run: RunSpec,
                snapshot_at: dict[int, tuple[int, Any]] | None = None) -> tuple[list[Captured], Any]:
    """`run` captured in every rank: one `Captured` per rank (rank order; each holds rank 0's completion), and
    rank 0's snapshot (others keep theirs: `ranks.call_one(rank, ("run_alone", ...))`, or their inputs come back
    in the capture's `snapshots`)."""
    from oracle.engines.native.capture import native_layout

    ranks: RankGroup = engine.ranks
    snapshot_at = snapshot_at or {}
    rows0 = RowCapture(snapshot_at=snapshot_at.get(0))
    for rank in range(1, ranks.size):
        ranks.call_one(rank, ("capture_begin", snapshot_at.get(rank)))
    counter = itertools.count()
    engine.rank_layout = lambda step, batch, inputs: native_layout(next(counter), step, batch, inputs,
                                                                   run.target_index, engine.block_size)
    try:
        with torch.no_grad():
            completion = engine.capture(run, rows0)
    finally:
        engine.rank_layout = None
    others = ranks.call(("capture_end",))
    captured = [Captured(tuple(rows0.calls), tuple(rows0.passes), completion, rows0.snapshot)]
    snaps: list[Any] = [rows0.snapshot]
    for data in others:
        captured.append(Captured(tuple(data["calls"]), tuple(data["passes"]), completion, None))
        snaps.append(data["snapshot"])
    return captured, snaps


def capture_ranks(engine: Any, run: RunSpec, snapshot_at: Any = None) -> list[dict[str, Any]]:
    """`CapturesRanks` (oracle.engines.contract): `run` captured in every rank (one without ranks), each rank's
    snapshot of `snapshot_at` as plain data."""
    from oracle.capture import capture_run
    from oracle.engines.native.ranks import captured_of

    if engine.ranks is None:
        rows = RowCapture(snapshot_at=snapshot_at)
        done = capture_run(engine.capture, run, rows)
        return [{**captured_of(rows), "completion": done.completion}]
    captured, snaps = capture_all(engine, run, dict.fromkeys(range(engine.ranks.size), snapshot_at)
                                  if snapshot_at is not None else None)
    # Rank 0's snapshot is the op's own (the others come plain from their processes).
    return [{"calls": c.calls, "passes": c.passes, "completion": c.completion,
             "snapshot": (snaps[0].plain() if snaps[0] is not None else None) if q == 0 else snaps[q]} for q, c in enumerate(captured)]


def localize_sharded(engine: Any, expected: RunSpec, actual: RunSpec,
                     repro_dir: Path | None = None) -> LocalizedOp | None:
    """Both runs captured in every rank, the rule applied rank by rank (`oracle.capture.ranks`), the first root
    named with its rank and confirmed alone (module docstring)."""
    exp, _ = capture_all(engine, expected)
    act, _ = capture_all(engine, actual)
    prompt_len = len(actual.requests[actual.target_index].prompt_token_ids)
    found = localize_ranks(exp, act, target_prompt_len=prompt_len)
    if found.rank is None:
        return found.finding.op
    return _confirm(engine, expected, actual, found.finding, found.rank, len(exp), repro_dir)


def _confirm(engine: Any, expected: RunSpec, actual: RunSpec, finding: Finding, rank: int,
             size: int, repro_dir: Path | None) -> LocalizedOp:
    """Confirm the named op alone; repro/ is written for an op of rank 0 that is not a communication op (the
    others re-run in a rank's process, or through the group's reducer, which a standalone repro cannot hold)."""
    op, a_call, e_call = finding.op, finding.actual_call, finding.expected_call
    assert op is not None and a_call is not None
    if e_call is None:
        return replace(op, confirmation="not checked", confirm_note="the op did not run in the solo run")
    try:
        if a_call.key[1] == ALL_REDUCE_OP:
            return _confirm_reduction(engine, expected, actual, op, a_call, e_call, rank, size)
        if rank == 0:
            from oracle.capture import confirm_alone

            return confirm_alone(lambda spec, rows: engine.capture(spec, rows), expected, actual, finding, repro_dir)
        return _confirm_in_rank(engine, expected, actual, op, a_call, e_call, rank)
    except EngineError:
        raise
    except Exception as err:  # noqa: BLE001 - a re-run that cannot happen leaves the op unconfirmed, said why
        return replace(op, confirmation="not checked",
                       confirm_note=f"rank {rank}, layer {op.layer}: the op could not run alone: "
                                    f"{type(err).__name__}: {err}")


def _engine_rows(call: Any) -> dict[int, torch.Tensor]:
    return dict(zip(call.positions, call.rows, strict=True))


def _confirm_in_rank(engine: Any, expected: RunSpec, actual: RunSpec, op: LocalizedOp, a_call: Any, e_call: Any,
                     rank: int) -> LocalizedOp:
    """An op of rank `rank` > 0 re-run alone in that rank's process on each run's captured inputs."""
    from oracle.capture.confirm import verdict

    ranks: RankGroup = engine.ranks
    alone = []
    for spec, call in ((expected, e_call), (actual, a_call)):
        capture_all(engine, spec, {rank: (call.forward_pass, call.key)})
        rows = ranks.call_one(rank, ("run_alone", call.grid, call.kind))
        if rows is None:
            return replace(op, confirmation="not checked",
                           confirm_note=f"rank {rank}: the op's inputs were not captured again in the rerun")
        alone.append(rows)
    status, note = verdict(op.positions, (alone[0], alone[1]), (_engine_rows(e_call), _engine_rows(a_call)),
                           f"in rank {rank}'s process, in the kernel mode it ran in")
    return replace(op, confirmation=status, confirm_note=note)


def _confirm_reduction(engine: Any, expected: RunSpec, actual: RunSpec, op: LocalizedOp, a_call: Any, e_call: Any,
                       rank: int, size: int) -> LocalizedOp:
    """The all-reduce re-run alone: the group's reduction of every rank's captured partial (and rank `rank`'s
    residual), for each run, against the engine's bits in rank `rank`."""
    from oracle.capture.confirm import verdict
    from oracle.capture.rows import select_rows

    reducer: Reducer = engine.ranks.reducer
    alone: list[dict[int, torch.Tensor]] = []
    tokens: list[int] = []
    for spec, call in ((expected, e_call), (actual, a_call)):
        _, snaps = capture_all(engine, spec, {q: (call.forward_pass, call.key) for q in range(size)})
        if any(s is None for s in snaps):
            missing = [q for q, s in enumerate(snaps) if s is None]
            return replace(op, status="inconclusive", confirmation="not checked",
                           confirm_note=f"rank {rank}, layer {op.layer}: the all-reduce's inputs were not captured "
                                        f"again in rank{'s' if len(missing) > 1 else ''} "
                                        f"{', '.join(map(str, missing))}")
        args = [s.args if not isinstance(s, dict) else s["args"] for s in snaps]
        parts = [a[0] for a in args]
        residual, name = args[rank][1], args[rank][2]
        tokens.append(int(parts[0].shape[0]))
        with torch.no_grad():
            out = reducer.reduce(parts, residual, name, rank)
        layout = snaps[rank].layout if not isinstance(snaps[rank], dict) else snaps[rank]["layout"]
        grid = layout.grids[call.grid]
        rows = select_rows(out, grid)
        alone.append({} if rows is None else {p: rows[i] for i, p in enumerate(grid.positions)})
    how = (f"the reduction alone on the {size} ranks' captured partials, rank {rank}'s order, "
           f"{tokens[0]} and {tokens[1]} tokens")
    status, note = verdict(op.positions, (alone[0], alone[1]), (_engine_rows(e_call), _engine_rows(a_call)), how)
    depends = {"num_tokens": tokens} if tokens[0] != tokens[1] else {}
    return replace(op, confirmation=status, confirm_note=note, depends_on={**op.depends_on, **depends})
