"""Confirm a named op by itself: run it again, alone, on the inputs it got in each run.

`clone_inputs` copies an op call's inputs before it runs (same shapes, dtypes and strides; a paged
KV cache cut down to the blocks its block table names, the table renumbered to match, so a
40 GB cache costs only the blocks the call reads). `run_alone` calls the op on such a copy and
returns the target's rows of the result the capture compared. If the two runs' copies, run alone,
still give the target different bits, the op is `confirmed`; if not, the difference came from
state the op does not take as input (a workspace, a cache, a stream), and the report says so.

Also here: the op's class (attention, matmul, norm, sampling, communication, kv-cache) and the
batch-wide quantities its launch could have keyed a configuration on (packed query length,
number of KV splits, M of a matmul), read from the call's arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from oracle.capture.copies import clone_inputs
from oracle.capture.rows import Snapshot, named_args, select_rows


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


def run_alone(snap: Snapshot, grid: int) -> dict[int, torch.Tensor]:
    """Run the snapshot's op once more on a fresh copy of its inputs: the target's rows by position."""
    args, kwargs = clone_inputs(snap.func, snap.args, snap.kwargs)
    threads = torch.get_num_threads()
    torch.set_num_threads(snap.threads)
    try:
        with torch.no_grad():
            out = snap.func(*args, **kwargs)
    finally:
        torch.set_num_threads(threads)
    if any(t.is_cuda for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)):
        torch.cuda.synchronize()
    t = result_tensor(snap, args, kwargs, out)
    g = snap.layout.grids[grid]
    rows = select_rows(t, g) if t is not None else None
    if rows is None:
        return {}
    return {pos: rows[i].detach().cpu() for i, pos in enumerate(g.positions)}


_CLASSES = (
    ("communication", ("all_reduce", "allreduce", "all_gather", "reduce_scatter", "nccl", "broadcast")),
    ("kv-cache write", ("reshape_and_cache", "index_put", "kv_cache", "cache_write")),
    ("norm", ("norm",)),
    ("attention", ("attention", "attn", "flash", "fa3", "fwd", "sdpa", "paged")),
    ("matmul", ("mm", "matmul", "linear", "gemm", "bmm", "_proj", "lm_head")),
    ("sampling", ("sample", "argmax", "topk", "top_k", "multinomial", "gumbel", "log_softmax", "logits")),
)


def op_class(module: str, op: str) -> str:
    """attention, matmul, norm, sampling, communication, kv-cache write, or other: by the op, then by the
    module's own name (`post_attention_layernorm` is a norm)."""
    for text in (op.lower(), module.rsplit(".", 1)[-1].lower()):
        for name, words in _CLASSES:
            if any(w in text for w in words):
                return name
    return "other"


_QUANTITIES = ("max_seqlen_q", "max_seqlen_k", "num_splits", "num_kv_splits", "cu_seqlens_q", "query_start_loc",
               "seqused_k", "seq_lens", "block_table", "block_tables", "page_table", "scheduler_metadata")


def launch_quantities(snap: Snapshot) -> dict[str, Any]:
    """Batch-wide numbers the call's kernel could have chosen its configuration by (JSON-able)."""
    named = named_args(snap.func, snap.args, snap.kwargs)
    q: dict[str, Any] = {}
    tensors = [t for t in tree_flatten((snap.args, snap.kwargs))[0] if isinstance(t, torch.Tensor)]
    first = next((t for t in tensors if t.is_floating_point()), None)
    if first is not None and first.dim() >= 1:
        q["rows"] = int(first.shape[0])  # packed query length, or M of a matmul
    for name in _QUANTITIES:
        v = named.get(name)
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, (int, float)):
            q[name] = v
        elif isinstance(v, torch.Tensor) and v.dim() == 1 and not v.is_floating_point():
            q[f"{name}.len"] = int(v.shape[0])
            if name in ("cu_seqlens_q", "query_start_loc") and v.numel():
                q["num_seqs"] = int(v.shape[0]) - 1
                q["packed_query_len"] = int(v[-1].item())
        elif isinstance(v, torch.Tensor) and v.dim() == 2:
            q[f"{name}.shape"] = list(v.shape)
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
        rows_a = _rows_by_position(a, actual)
        rows_e = _rows_by_position(e, expected)
        for pos in positions:
            ra, re_ = rows_a.get(pos), rows_e.get(pos)
            if ra is not None and re_ is not None and (ra.shape != re_.shape or not torch.equal(
                    ra.reshape(-1).view(torch.uint8) if ra.is_floating_point() else ra,
                    re_.reshape(-1).view(torch.uint8) if re_.is_floating_point() else re_)):
                out.append(name)
                break
    return out


def _rows_by_position(t: torch.Tensor, snap: Snapshot) -> dict[int, torch.Tensor]:
    for g in snap.layout.grids[:1]:  # the token grid: inputs are laid out by token
        rows = select_rows(t, g)
        if rows is not None:
            return {pos: rows[i].detach().cpu().contiguous() for i, pos in enumerate(g.positions)}
    return {}
