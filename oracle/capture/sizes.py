"""Where two tensor-parallel sizes of one engine first differ: the same request alone, captured at both.

At TP N an op's result is either held whole and alike in every rank (the embedding after its all-reduce, the norms,
the residual stream, a row-parallel layer's reduced output) or sharded (a column-parallel layer's heads, a
row-parallel layer's partial product). Only the first kind has a counterpart at the other size, so the sizes are
compared there: an op of the same key and row shape at both sizes, held bitwise alike in every rank of each. The
first such op whose rows differ (in execution order) is where the sizes part; if its inputs were equal it is named
itself, else the input that differed is named where the larger size made it: for a row-parallel layer that is its
reduction (the all-reduce of the ranks' partial products), at the smaller size the layer's own matmul.

Confirmation (`confirm_split`) runs the layer alone in this process on inputs captured in every rank of the larger
size: the smaller size's matmul on the ranks' shards joined (input and weight), the larger size's as each rank's
partial product summed in rank order (plus the residual an all-reduce fuses in), against both engines' bits.
`confirmed` only where both re-runs give their engine's bits and the two differ; `repro/` holds the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from oracle.capture.ranks import COMMUNICATION
from oracle.capture.rows import Captured, OpCall, OpKey
from oracle.capture.rules import bitwise_equal, max_abs, op_class, ulp_distance
from oracle.localized_op import LocalizedOp, position_ranges

# Where a call sits: (forward pass, op key).
Place = tuple[int, OpKey]
_UNCOMPARED = ("kv_read", "kv_write")


@dataclass(frozen=True)
class SizeFinding:
    """The rule's answer: `op` (None: no op held whole at both sizes differed), and for an op named where the larger
    size made it, the call there (`many_call`), the smaller size's counterpart (`one_call`) and the partial product
    that fed it in each rank (`feeder`: its place)."""

    op: LocalizedOp | None
    one_call: OpCall | None = None
    many_call: OpCall | None = None
    feeder: Place | None = None


class _Side:
    """One size's capture: its ranks' calls by place, and which of them every rank holds whole and alike."""

    def __init__(self, ranks: Sequence[Captured]) -> None:
        self.ranks = ranks
        self.by_place = [{(c.forward_pass, c.key): c for c in r.calls} for r in ranks]

    @property
    def size(self) -> int:
        return len(self.ranks)

    def call(self, place: Place, rank: int = 0) -> OpCall | None:
        return self.by_place[rank].get(place)

    def whole(self, place: Place) -> OpCall | None:
        """Rank 0's call at `place` where every rank made it with the same shape and bitwise the same rows."""
        first = self.call(place)
        if first is None:
            return None
        for q in range(1, self.size):
            other = self.call(place, q)
            if other is None or other.positions != first.positions or bitwise_equal(other.rows, first.rows) is not True:
                return None
        return first


def _rows(call: OpCall) -> dict[int, torch.Tensor]:
    return dict(zip(call.positions, call.rows, strict=True))


def _differing(a: OpCall, b: OpCall) -> list[tuple[int, torch.Tensor, torch.Tensor]] | None:
    """(position, a's row, b's row) where they differ; None where the rows cannot be compared (shape, dtype)."""
    ra, rb = _rows(a), _rows(b)
    out = []
    for p in a.positions:
        if p not in rb:
            continue
        same = bitwise_equal(ra[p], rb[p])
        if same is None:
            return None
        if not same:
            out.append((p, ra[p], rb[p]))
    return out


def localize_sizes(one: Sequence[Captured], many: Sequence[Captured]) -> SizeFinding:
    """The first op where the smaller size (`one`, its ranks in order) and the larger (`many`) part (module
    docstring), with what it takes to confirm it."""
    small, large = _Side(one), _Side(many)
    for c1 in one[0].calls:
        place = (c1.forward_pass, c1.key)
        cn = large.whole(place) if c1.kind not in _UNCOMPARED and small.whole(place) is not None else None
        if cn is None:
            continue
        diff = _differing(c1, cn)
        if diff:
            return _at(small, large, c1, cn, diff)
    return SizeFinding(None)


def _at(small: _Side, large: _Side, c1: OpCall, cn: OpCall, diff: list[tuple[int, Any, Any]]) -> SizeFinding:
    """The first op held whole at both sizes whose rows differ: named itself when its inputs agreed, else its first
    input that differed, where the larger size made it."""
    if len(c1.inputs) == len(cn.inputs):
        for k1, kn in zip(c1.inputs, cn.inputs, strict=True):
            i1, i_n = small.whole((c1.forward_pass, k1)), large.whole((cn.forward_pass, kn))
            if i1 is None or i_n is None:
                if k1 != kn:  # an input one size makes and the other does not, not held whole: cannot follow it
                    return SizeFinding(_op(c1, cn, diff, small.size, large.size, None, "inconclusive",
                                           f"its input {kn[0]} {kn[1]} at TP {large.size} is not held whole in "
                                           "every rank: the difference comes from it or before it"))
                continue
            moved = _differing(i1, i_n)
            if moved:
                return _reduced(small, large, i1, i_n, moved)
    return SizeFinding(_op(c1, cn, diff, small.size, large.size, True, "localized", ""), c1, cn)


def _reduced(small: _Side, large: _Side, c1: OpCall, cn: OpCall, diff: list[tuple[int, Any, Any]]) -> SizeFinding:
    """An input that differed between the sizes, named where the larger size made it (its reduction, for a
    row-parallel layer), with whether the layer's own input (its ranks' shards joined) was equal at both sizes."""
    feeder = (cn.forward_pass, cn.inputs[0]) if cn.inputs else None
    equal = _joined_inputs_equal(small, large, feeder) if feeder is not None else None
    theirs = f"{c1.key[0]} {c1.key[1]}"
    if cn.key == c1.key:
        note = f"at TP {small.size} the same op of the same module"
    else:
        note = f"at TP {small.size} the same values come from {theirs}"
    if feeder is not None and op_class(cn.key[0], cn.key[1]) == COMMUNICATION:
        joined = {True: "equal", False: "different", None: "not compared"}[equal]
        note += (f"; it reduces the {large.size} ranks' partial {feeder[1][1]} of {feeder[1][0]}, whose input (the "
                 f"ranks' shards joined) was {joined} at both sizes: the reduction split over {large.size} ranks "
                 "sums in another order than one matmul does")
    op = _op(c1, cn, diff, small.size, large.size, equal, "localized", note, named=cn)
    return SizeFinding(op, c1, cn, feeder)


def _joined_inputs_equal(small: _Side, large: _Side, feeder: Place) -> bool | None:
    """Whether the partial product's input, its ranks' shards joined on the last dimension, equals the smaller
    size's input of the same op (None: not comparable)."""
    one = small.call(feeder)
    parts = [large.call(feeder, q) for q in range(large.size)]
    if one is None or not one.inputs or any(p is None or not p.inputs for p in parts):
        return None
    src1 = small.call((feeder[0], one.inputs[0]))
    srcs = [large.call((feeder[0], p.inputs[0]), q) for q, p in enumerate(parts) if p is not None]
    if src1 is None or any(s is None for s in srcs) or len(srcs) != large.size:
        return None
    rows1 = _rows(src1)
    shards = [_rows(s) for s in srcs if s is not None]
    for pos, row in rows1.items():
        if any(pos not in s for s in shards):
            return None
        joined = torch.cat([s[pos].reshape(-1) for s in shards])
        if bitwise_equal(joined, row.reshape(-1)) is not True:
            return False
    return True


def _op(c1: OpCall, cn: OpCall, diff: list[tuple[int, Any, Any]], small: int, large: int, equal: bool | None,
        status: str, note: str, named: OpCall | None = None) -> LocalizedOp:
    """The finding at `named` (the larger size's call; `cn` unless given), sized by `diff`."""
    from oracle.capture.rules import _layer

    call = named or cn
    module, op, _ = call.key
    layer = _layer(module)
    return LocalizedOp(
        module=module, op=op, layer=int(layer) if layer is not None else None, forward_pass=call.forward_pass,
        engine_step=None, positions=tuple(p for p, _, _ in diff), shape=call.shape,
        ulp=max((u for _, a, b in diff if (u := ulp_distance(a, b)) is not None), default=None),
        max_abs_diff=max((d for _, a, b in diff if (d := max_abs(a, b)) is not None), default=None),
        inputs_equal=equal, note=note, status=status, kind=call.kind, within=call.within,
        op_class=op_class(module, op + " " + call.within),
        depends_on={"tensor_parallel_size": [small, large]})


def describe_positions(op: LocalizedOp) -> str:
    return position_ranges(op.positions)


# ---------------------------------------------------------------------------------------------
# Confirmation: the row-parallel layer alone, at both sizes


def _resolve(name: str) -> Any:
    """`aten.linear.default` -> torch.ops.aten.linear.default."""
    ns, op, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, ns), op), overload)


def _target_rows(t: torch.Tensor, snap: dict[str, Any]) -> dict[int, torch.Tensor]:
    from oracle.capture.rows import select_rows

    for grid in snap["layout"].grids:
        rows = select_rows(t, grid)
        if rows is not None:
            return {p: rows[i].detach().cpu().contiguous() for i, p in enumerate(grid.positions)}
    return {}


def _joined_args(snaps: Sequence[dict[str, Any]]) -> list[Any]:
    """The matmul's arguments at one rank: every rank's shards joined where they are shards (on the dimension of
    the reduction: the input's last, the weight's that matches it), the rest rank 0's."""
    first = snaps[0]["args"]
    k = first[0].shape[-1]
    out: list[Any] = []
    for i, a in enumerate(first):
        if not isinstance(a, torch.Tensor) or i > 1:
            out.append(a)
            continue
        dim = a.dim() - 1 if i == 0 else next(d for d in (a.dim() - 1, 0) if a.shape[d] == k)
        out.append(torch.cat([s["args"][i] for s in snaps], dim=dim))
    return out


def split_alone(snaps: Sequence[dict[str, Any]], residual: dict[int, torch.Tensor] | None
                ) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
    """The row-parallel layer alone: (one matmul on the ranks' shards joined, the ranks' partial products summed
    in rank order), the target's rows of each, `residual` added to both where the reduction fuses it in."""
    from oracle.capture.state import applied

    func = _resolve(snaps[0]["op"])
    state = snaps[0]["state"]
    with torch.no_grad(), applied(state):
        whole = func(*_joined_args(snaps), **snaps[0]["kwargs"])
        parts = [func(*s["args"], **s["kwargs"]) for s in snaps]
        total = parts[0]
        for p in parts[1:]:
            total = total + p
    one, many = _target_rows(whole, snaps[0]), _target_rows(total, snaps[0])
    if residual:
        one = {p: residual[p] + r for p, r in one.items() if p in residual}
        many = {p: residual[p] + r for p, r in many.items() if p in residual}
    return one, many


def confirm_split(op: LocalizedOp, found: SizeFinding, snaps: Sequence[dict[str, Any] | None],
                  residual: dict[int, torch.Tensor] | None) -> LocalizedOp:
    """`confirmed` where the layer alone (`split_alone`) gives both engines' bits and the two differ."""
    from oracle.capture.confirm import verdict

    assert found.one_call is not None and found.many_call is not None
    missing = [q for q, s in enumerate(snaps) if s is None]
    if missing:
        return replace(op, confirmation="not checked",
                       confirm_note=f"the partial product's inputs were not captured again in rank(s) "
                                    f"{', '.join(map(str, missing))}")
    full = [s for s in snaps if s is not None]
    try:
        alone = split_alone(full, residual)
    except Exception as err:  # noqa: BLE001 - a layer that cannot run alone leaves the op unconfirmed, said why
        return replace(op, confirmation="not checked",
                       confirm_note=f"the layer could not run alone: {type(err).__name__}: {err}")
    how = (f"{full[0]['op']} alone in this process: once on the {len(full)} ranks' shards joined (TP "
           f"{op.depends_on['tensor_parallel_size'][0]}), and per rank with the partials summed in rank order "
           f"(TP {len(full)})")
    status, note = verdict(op.positions, alone, (_rows(found.one_call), _rows(found.many_call)), how)
    return replace(op, confirmation=status, confirm_note=note)
