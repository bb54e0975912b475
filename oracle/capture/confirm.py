"""Confirm a named op by itself: run it again, alone, on the inputs it got in each run.

`clone_inputs` copies an op call's inputs before it runs (same shapes, dtypes and strides; a paged
KV cache cut down to the blocks its block table names, the table renumbered to match, so a
40 GB cache costs only the blocks the call reads). `run_alone` calls the op on such a copy, in the
kernel mode, threads and flags it ran under in the engine (`oracle.capture.state`), and returns the
target's rows of the result the capture compared; `verdict` compares them with the engine's.

Also here: the op's class (attention, matmul, norm, sampling, communication, kv-cache) and the
batch-wide quantities its launch could have keyed a configuration on (packed query length,
number of KV splits, M of a matmul), read from the call's arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from oracle.capture.copies import clone_inputs
from oracle.capture.rows import Snapshot, named_args
from oracle.capture.rules import bitwise_equal, ulp_distance
from oracle.capture.target_rows import kv_rows, select_rows
from oracle.engines.contract import position_ranges


def result_tensor(snap: Snapshot, args: Sequence[Any], kwargs: dict[str, Any], out: Any) -> torch.Tensor | None:
    """The tensor the captured rows came from, after the op ran on (`args`, `kwargs`)."""
    where, _, which = snap.result.partition(":")
    if where == "arg":
        named = named_args(snap.func, args, kwargs)
        name, _, idx = which.partition(".")
        value = named.get(name)
        if idx and isinstance(value, (list, tuple)):
            value = value[int(idx)]
        return value if isinstance(value, torch.Tensor) else None
    returned = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    j = int(which)
    return returned[j] if j < len(returned) else None


def run_alone(snap: Snapshot, grid: int, kind: str = "out") -> dict[int, torch.Tensor]:
    """Run the snapshot's op once more on a fresh copy of its inputs, in the state it ran in inside the engine
    (`snap.state`: kernel overrides, threads, matmul flags): the target's rows by position.

    `kind` "kv_write": the rows are the target's own slots of the cache the op wrote, as the capture took them.
    """
    from oracle.capture.state import OpState, applied

    args, kwargs = clone_inputs(snap.func, snap.args, snap.kwargs)
    state = snap.state or replace(OpState.now(), threads=snap.threads)
    with applied(state), torch.no_grad():
        out = snap.func(*args, **kwargs)
    if any(t.is_cuda for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)):
        torch.cuda.synchronize()
    t = result_tensor(snap, args, kwargs, out)
    g = snap.layout.grids[grid]
    if t is None:
        return {}
    rows = kv_rows(t, args, kwargs, g, snap.layout.block_size) if kind == "kv_write" else select_rows(t, g)
    if rows is None:
        return {}
    return {pos: rows[i].detach().cpu() for i, pos in enumerate(g.positions)}


_QUANTITIES = ("max_seqlen_q", "max_seqlen_k", "num_splits", "num_kv_splits", "cu_seqlens_q", "query_start_loc",
               "seqused_k", "seq_lens", "block_table", "block_tables", "page_table", "scheduler_metadata")


def launch_quantities(snap: Snapshot) -> dict[str, Any]:
    """Batch-wide numbers the call's kernel could have chosen its configuration by (JSON-able)."""
    named = named_args(snap.func, snap.args, snap.kwargs)
    q: dict[str, Any] = {}
    first = next((t for t in tree_flatten((snap.args, snap.kwargs))[0]
                  if isinstance(t, torch.Tensor) and t.is_floating_point()), None)
    if first is not None and first.dim() >= 1:
        q["rows"] = int(first.shape[0])  # packed query length, or M of a matmul
    for name in _QUANTITIES:
        q.update(_quantities_of(name, named.get(name)))
    return q


def _quantities_of(name: str, v: Any) -> dict[str, Any]:
    """What one argument says: a number as it is, an index tensor's length, a 2-D tensor's shape."""
    if isinstance(v, bool) or v is None:
        return {}
    if isinstance(v, (int, float)):
        return {name: v}
    if not isinstance(v, torch.Tensor):
        return {}
    if v.dim() == 1 and not v.is_floating_point():
        return _lengths(name, v)
    return {f"{name}.shape": list(v.shape)} if v.dim() == 2 else {}


def _lengths(name: str, v: torch.Tensor) -> dict[str, Any]:
    """An index tensor's length; cumulative query starts also give the sequences and the packed query length."""
    q: dict[str, Any] = {f"{name}.len": int(v.shape[0])}
    if name in ("cu_seqlens_q", "query_start_loc") and v.numel():
        q["num_seqs"] = int(v.shape[0]) - 1
        q["packed_query_len"] = int(v[-1].item())
    return q


def differing_quantities(expected: dict[str, Any], actual: dict[str, Any]) -> dict[str, list[Any]]:
    """The launch quantities whose values differ between the two calls: {name: [expected, actual]}."""
    return {k: [expected.get(k), actual.get(k)] for k in sorted(set(expected) | set(actual))
            if expected.get(k) != actual.get(k)}


def row_inputs_differ(expected: Snapshot, actual: Snapshot, positions: Sequence[int]) -> list[str]:
    """Row-aligned tensor arguments (read, not pure outputs) whose target rows differ between the two calls.

    A named op must have read equal rows; if one of its inputs already differed where the capture
    could not follow it (a tensor it did not track), the op is an effect, not the cause. An argument the
    op only writes (by its schema, or fresh from an allocation in both calls) is not an input.
    """
    from oracle.capture.rows import reads_written, written_args

    e_named = named_args(expected.func, expected.args, expected.kwargs)
    a_named = named_args(actual.func, actual.args, actual.kwargs)
    pure = {a for a, _ in written_args(actual.func, actual.args, actual.kwargs)
            if not reads_written(actual.func, a)} | (expected.fresh_args & actual.fresh_args)
    out: list[str] = []
    for name, a in a_named.items():
        e = e_named.get(name)
        if name in pure or not isinstance(a, torch.Tensor) or not isinstance(e, torch.Tensor):
            continue
        if _differ_at(_rows_by_position(a, actual), _rows_by_position(e, expected), positions):
            out.append(name)
    return out


def _differ_at(rows_a: dict[int, torch.Tensor], rows_e: dict[int, torch.Tensor], positions: Sequence[int]) -> bool:
    """Some position both calls hold a row for has rows of other shapes or other bits."""
    for pos in positions:
        ra, re_ = rows_a.get(pos), rows_e.get(pos)
        if ra is not None and re_ is not None and (ra.shape != re_.shape or not torch.equal(_bits(ra), _bits(re_))):
            return True
    return False


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A float row as its bytes (NaN payloads and -0.0 compare as the bits they are); other rows as they are."""
    return t.reshape(-1).view(torch.uint8) if t.is_floating_point() else t


def _rows_by_position(t: torch.Tensor, snap: Snapshot) -> dict[int, torch.Tensor]:
    for g in snap.layout.grids[:1]:  # the token grid: inputs are laid out by token
        rows = select_rows(t, g)
        if rows is not None:
            return {pos: rows[i].detach().cpu().contiguous() for i, pos in enumerate(g.positions)}
    return {}


def verdict(positions: Sequence[int], alone: tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]],
            engine: tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]], how: str) -> tuple[str, str]:
    """`confirmed`, `not reproduced alone` or `not checked`, and why: the op's rows run alone on (solo, trial)
    inputs against the rows the engine gave the same calls, bitwise, at the target's differing `positions`.

    `confirmed` only when alone the op gives the engine's bits for both inputs (so the two differ where the
    engine's did); `not reproduced alone` when alone both inputs get equal bits, the engine's for one of the
    runs (said which): what moved the other is the pass, not the op's inputs; `not checked` when nothing
    could be compared or the re-run does not give the engine's bits (it is not the engine's op, so it can
    neither confirm nor clear it). `how`: the state the op was re-run in, for the note.
    """
    (alone_e, alone_a), (engine_e, engine_a) = alone, engine
    compared = [p for p in positions if all(p in rows for rows in (alone_e, alone_a, engine_e, engine_a))]
    if not compared:
        return "not checked", (f"run alone ({how}), the op's result held none of the target's differing rows "
                               f"(positions {position_ranges(positions)}): nothing to compare")
    differ = _differing(alone_e, alone_a, compared)
    off_e = _differing(alone_e, engine_e, compared)
    off_a = _differing(alone_a, engine_a, compared)
    if differ:
        return _differ_alone(how, differ, off_e, off_a, alone)
    return _agree_alone(how, compared, off_e, off_a, _ulps([(engine_e[p], engine_a[p]) for p in compared]))


def _differ_alone(how: str, differ: list[int], off_e: list[int], off_a: list[int],
                  alone: tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]) -> tuple[str, str]:
    """Alone, the two inputs give different bits: `confirmed` when they are the engine's for both runs."""
    if not off_e and not off_a:
        by = _ulps([(alone[0][p], alone[1][p]) for p in differ])
        return "confirmed", (f"run alone ({how}) on each run's captured inputs, the op gives the engine's bits for "
                             f"both: positions {position_ranges(differ)} differ{by}, as in the engine")
    return "not checked", (f"run alone ({how}), the op's rows differ between the two inputs at positions "
                           f"{position_ranges(differ)}, but not with the engine's bits (the solo run's inputs at "
                           f"{position_ranges(off_e) if off_e else 'none'}, the trial's at "
                           f"{position_ranges(off_a) if off_a else 'none'}"
                           "): this re-run is not the op as the engine ran it, so it neither confirms nor clears it")


# Why the engine's bits moved when the op alone gives both inputs equal bits.
_PASS_STATE = ("what moved it is the pass, not the op's inputs (state the op does not take as an input: a "
               "workspace, a cache, launch metadata, another layer of dispatch)")


def _agree_alone(how: str, compared: list[int], off_e: list[int], off_a: list[int], moved: str) -> tuple[str, str]:
    """Alone, both inputs give equal bits: `not reproduced alone` when those are the engine's bits for one run."""
    if not off_e:
        return "not reproduced alone", (
            f"run alone ({how}), the op gives the trial's inputs the solo run's bits, the engine's for the solo run; "
            f"in the trial the engine gave positions {position_ranges(off_a)} other bits{moved}: {_PASS_STATE}")
    if not off_a:
        return "not reproduced alone", (
            f"run alone ({how}), the op gives the solo run's inputs the trial's bits, the engine's for the trial; "
            f"in the solo run the engine gave positions {position_ranges(off_e)} other bits{moved}: {_PASS_STATE}")
    return "not checked", (f"run alone ({how}), the op gives both inputs equal bits, but neither run's engine bits "
                           f"(positions {position_ranges(compared)}): this re-run is not the op as the engine ran it")


def _differing(x: dict[int, torch.Tensor], y: dict[int, torch.Tensor], positions: list[int]) -> list[int]:
    """The positions whose rows in `x` and `y` are not bitwise equal (or cannot be compared)."""
    return [p for p in positions if bitwise_equal(x[p], y[p]) is not True]


def _ulps(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> str:
    """The largest ULP distance among the pairs that have one, as " by up to N ULP" (empty when none has)."""
    found = [u for x, y in pairs if (u := ulp_distance(x, y)) is not None]
    return f" by up to {max(found)} ULP" if found else ""
