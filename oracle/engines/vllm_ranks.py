"""Localization at tensor parallel > 1 on vLLM: the capture in every rank, the rule rank by rank, confirmation.

vLLM runs the model in its rank processes; the worker's process holds the scheduler. The worker's tap puts a
`PassContext` on each scheduled pass that holds the target (oracle.engines.vllm_tap), which reaches every rank
with the scheduler's output, and each rank captures its own passes (`capture_begin` / `capture_end`, run in the
rank by `collective_rpc`) with `oracle.engines.vllm_capture.ModelCapture`. Rows are keyed by rank; the rule is
applied rank by rank (`oracle.capture.ranks`).

vLLM's communication ops are recorded like any op: while a rank captures, its tensor-parallel group's
`all_reduce` and `all_gather` go through `oracle_vllm::all_reduce` / `oracle_vllm::all_gather`, ops whose
kernel is the group's own method (whatever communicator it runs: the CPU shared-memory all-reduce,
torch.distributed over gloo or NCCL, the CUDA custom all-reduce), on a copy of the input (vLLM's CPU
communicator reduces in place). So each is one call with its input (this rank's partial) and its output, under
its layer's `o_proj` / `down_proj` (the embedding's and the logits' too), class `communication`.

Confirmation re-runs the named op alone on the inputs captured again in a second pair of runs: a
communication op in every rank at once, each on its own captured partial, through the group's communicator
(the collective needs them all), compared in the named rank; any other op in its rank alone. `confirmed` only
where that gives the engine's bits for both runs. No repro/ is written at TP > 1 (the op's inputs stay in the
rank; a communication op needs the group).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch

from oracle.capture.ranks import COMMUNICATION, localize_ranks
from oracle.capture.rows import Captured, RowCapture
from oracle.capture.rules import Finding, LocalizedOp

ALL_REDUCE_OP = "oracle_vllm.all_reduce.default"
ALL_GATHER_OP = "oracle_vllm.all_gather.default"

_lib = torch.library.Library("oracle_vllm", "DEF")
_lib.define("all_reduce(Tensor input, str group) -> Tensor")
_lib.define("all_gather(Tensor input, int dim, str group) -> Tensor")


def _group(name: str) -> Any:
    from vllm.distributed import parallel_state

    ref = parallel_state._groups.get(name)
    group = ref() if ref is not None else None
    if group is None:
        raise RuntimeError(f"oracle_vllm: vLLM's process group {name!r} is not in this process")
    return group


def _all_reduce(input: torch.Tensor, group: str) -> torch.Tensor:
    g = _group(group)
    out: torch.Tensor = type(g).all_reduce(g, input.clone())  # the group's own method; a copy: it may reduce in place
    return out


def _all_gather(input: torch.Tensor, dim: int, group: str) -> torch.Tensor:
    g = _group(group)
    out: torch.Tensor = type(g).all_gather(g, input, dim)
    return out


for _key in ("CPU", "CUDA"):
    _lib.impl("all_reduce", _all_reduce, _key)
    _lib.impl("all_gather", _all_gather, _key)


@contextlib.contextmanager
def _communication_ops(group: Any) -> Iterator[None]:
    """`group`'s all_reduce and all_gather through the `oracle_vllm` ops (instance attributes, removed after)."""
    name = group.unique_name

    def all_reduce(input_: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.ops.oracle_vllm.all_reduce(input_, name)
        return out

    def all_gather(input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        out: torch.Tensor = torch.ops.oracle_vllm.all_gather(input_, dim, name)
        return out

    group.all_reduce, group.all_gather = all_reduce, all_gather
    try:
        yield
    finally:
        del group.all_reduce, group.all_gather


# ---------------------------------------------------------------------------------------------
# In each rank (run there by collective_rpc)

# This rank's capture while one is open ("exits", "rows", "rank"), and the last one's rows ("last") for a re-run.
_RANK: dict[str, Any] = {}


def _tp_rank(worker: Any) -> int:
    from vllm.distributed import parallel_state

    return int(parallel_state.get_tp_group().rank_in_group)


def capture_begin(worker: Any, snapshot_at: Any = None) -> None:
    """Capture this rank's passes that hold the target (module docstring) until `capture_end`."""
    from vllm.distributed import parallel_state

    from oracle.engines.vllm_capture import ModelCapture
    from oracle.engines.vllm_plugin import _inner, _model
    from oracle.engines.vllm_tap import ORACLE_PASS

    capture_end(worker)  # a capture left open by a failed call
    inner = _inner(worker)
    rows = RowCapture(snapshot_at=snapshot_at)
    state: dict[str, Any] = {"context": None}
    hooks = ModelCapture(_model(worker), lambda: state["context"])
    hooks.start(rows)
    execute, sample = inner.execute_model, getattr(inner, "sample_tokens", None)

    def execute_model(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        hooks.close_pass()
        state["context"] = getattr(scheduler_output, ORACLE_PASS, None)
        return execute(scheduler_output, *args, **kwargs)

    def sample_tokens(*args: Any, **kwargs: Any) -> Any:
        try:
            return sample(*args, **kwargs)  # type: ignore[misc]
        finally:
            hooks.close_pass()  # the pass was open through the logits and the sampler

    exits = contextlib.ExitStack()
    exits.enter_context(_communication_ops(parallel_state.get_tp_group()))
    inner.execute_model = execute_model
    if sample is not None:
        inner.sample_tokens = sample_tokens

    def restore() -> None:
        hooks.remove()
        for n in ("execute_model", "sample_tokens"):
            if n in vars(inner):
                delattr(inner, n)

    exits.callback(restore)
    _RANK.update(exits=exits, rows=rows, rank=_tp_rank(worker))


def capture_end(worker: Any) -> dict[str, Any] | None:
    """Stop capturing in this rank; what it captured as plain data (None where no capture was open)."""
    exits, rows = _RANK.pop("exits", None), _RANK.pop("rows", None)
    if exits is None:
        return None
    exits.close()
    _RANK["last"] = rows
    return {"rank": _RANK.get("rank"), "calls": list(rows.calls), "passes": list(rows.passes),
            "has_snapshot": rows.snapshot is not None, "snapshot_note": rows.snapshot_note,
            "snapshot": rows.snapshot.plain() if rows.snapshot is not None else None}


def rerun(worker: Any, grid: int, kind: str, only_rank: int | None) -> dict[str, Any] | None:
    """Run the last capture's snapshot alone in this rank (every rank at once for a communication op:
    `only_rank` None); the target's rows by position, the launch quantities, how it ran."""
    from oracle.capture.confirm import launch_quantities, run_alone

    rank = _tp_rank(worker)
    rows: RowCapture | None = _RANK.get("last")
    snap = rows.snapshot if rows is not None else None
    if (only_rank is not None and rank != only_rank) or snap is None:
        return None
    try:
        alone = run_alone(snap, grid, kind)
    except Exception as err:  # noqa: BLE001 - an op that cannot run alone leaves the finding unconfirmed, said why
        return {"rank": rank, "error": f"{type(err).__name__}: {err}"}
    state = snap.state.describe() if snap.state is not None else f"{snap.threads} threads"
    return {"rank": rank, "rows": alone, "quantities": launch_quantities(snap), "how": state,
            "num_tokens": int(next((t.shape[0] for t in snap.args if isinstance(t, torch.Tensor) and t.dim()), 0))}


# ---------------------------------------------------------------------------------------------
# In the worker's process


def _by_rank(answers: list[Any]) -> list[Any]:
    return sorted((a for a in answers if a is not None), key=lambda a: a["rank"])


def capture_all(engine: Any, state: dict[str, Any], spec: Any,
                snapshot_at: Any = None) -> tuple[list[Captured], list[dict[str, Any]]]:
    """`spec` run with every rank capturing: one `Captured` per rank (rank order; each holds the engine's
    completion), and each rank's answer."""
    from oracle.engines import vllm_ranks
    from oracle.engines.vllm_capture import drive

    engine.engine.collective_rpc(vllm_ranks.capture_begin, args=(snapshot_at,))
    try:
        completion = drive(engine, state, spec)
    finally:
        answers = _by_rank(list(engine.engine.collective_rpc(vllm_ranks.capture_end)))
    return [Captured(tuple(a["calls"]), tuple(a["passes"]), completion) for a in answers], answers


def localize_in_ranks(engine: Any, expected: Any, actual: Any) -> LocalizedOp | None:
    """Both runs captured in every rank, the rule applied rank by rank, the named op confirmed alone."""
    from oracle.engines.vllm_capture import targeting

    with targeting(engine) as state:
        exp, _ = capture_all(engine, state, expected)
        act, _ = capture_all(engine, state, actual)
        prompt_len = len(actual.requests[actual.target_index].prompt_token_ids)
        found = localize_ranks(exp, act, target_prompt_len=prompt_len, eager=engine.spec.enforce_eager)
        del exp, act
        if found.rank is None or found.finding.op is None:
            return found.finding.op
        try:
            return _confirm(engine, state, expected, actual, found.finding, found.rank)
        except Exception as err:  # noqa: BLE001 - a re-run that cannot happen leaves the op unconfirmed, said why
            op = found.finding.op
            return replace(op, confirmation="not checked",
                           confirm_note=f"rank {found.rank}, layer {op.layer}: the op could not run alone: "
                                        f"{type(err).__name__}: {err}")


def _rerun_alone(engine: Any, state: dict[str, Any], spec: Any, call: Any,
                 rank: int | None) -> tuple[list[dict[str, Any]], str | None]:
    """Capture `spec` again up to `call` and re-run that op alone: in `rank`, or in every rank at once (None, a
    communication op). Returns each rank's answer, or why it could not run (inputs not captured again)."""
    from oracle.engines import vllm_ranks

    _, answers = capture_all(engine, state, spec, (call.forward_pass, call.key))
    missing = [a["rank"] for a in answers if not a["has_snapshot"] and (rank is None or a["rank"] == rank)]
    if missing:
        why = "; ".join(a["snapshot_note"] for a in answers if a["snapshot_note"])
        return [], (f"the op's inputs were not captured again in rank{'s' if len(missing) > 1 else ''} "
                    f"{', '.join(map(str, missing))}" + (f" ({why})" if why else ""))
    return _by_rank(list(engine.engine.collective_rpc(vllm_ranks.rerun, args=(call.grid, call.kind, rank)))), None


def _confirm(engine: Any, state: dict[str, Any], expected: Any, actual: Any, finding: Finding,
             rank: int) -> LocalizedOp:
    from oracle.capture.confirm import differing_quantities, verdict

    op, a_call, e_call = finding.op, finding.actual_call, finding.expected_call
    assert op is not None and a_call is not None
    if e_call is None:
        return replace(op, confirmation="not checked", confirm_note="the op did not run in the solo run")
    collective = op.op_class == COMMUNICATION
    where = f"rank {rank}, layer {op.layer}"
    results: list[dict[str, Any]] = []
    size = 0
    for spec, call in ((expected, e_call), (actual, a_call)):
        ran, problem = _rerun_alone(engine, state, spec, call, None if collective else rank)
        mine = next((r for r in ran if r["rank"] == rank), None)
        if problem is None and (mine is None or "error" in mine):
            problem = f"the op could not run alone: {mine['error'] if mine is not None else 'no answer'}"
        if problem is not None or mine is None:
            return replace(op, confirmation="not checked", confirm_note=f"{where}: {problem}")
        results.append(mine)
        size = len(ran)
    tokens = [r["num_tokens"] for r in results]
    how = (f"the {op.op.split('.')[1]} alone in all {size} ranks at once, each on its own captured input, through "
           f"the group's communicator; {tokens[0]} and {tokens[1]} tokens" if collective
           else f"in rank {rank}'s process, {results[1]['how']}")
    engine_rows = (dict(zip(e_call.positions, e_call.rows, strict=True)),
                   dict(zip(a_call.positions, a_call.rows, strict=True)))
    status, note = verdict(op.positions, (results[0]["rows"], results[1]["rows"]), engine_rows, how)
    depends = differing_quantities(results[0]["quantities"], results[1]["quantities"])
    if collective and tokens[0] != tokens[1]:
        depends["num_tokens"] = tokens
    return replace(op, confirmation=status, confirm_note=note, depends_on={**op.depends_on, **depends})
