"""The variance map: which ops make the production path batch-variant, from its localized drift trials.

With `checks.drift.localize: first | all`, production mode names the first diverging op of its
first (or every) drifting trial (oracle.localize, as for invariance). This module aggregates those
ops by module (layer numbers folded into `*`) and op: how many drifting trials each accounts for,
in which layers, how each was confirmed, and the launch quantity its divergence followed (M of a
matmul, KV splits, the packed query length) where the capture saw it. A golden file can pin the
map's ops (`oracle pin-map`), so an upgrade that adds a batch-variant op is a named change.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from oracle.compare import first_divergence
from oracle.localized_op import LocalizedOp
from oracle.report import VarianceMap, VarianceOpRecord

# Every class an op can have (oracle.capture.rules.op_class), shown with 0 where nothing drifted there.
OP_CLASSES = ("attention", "matmul", "norm", "sampling", "communication", "kv-cache write", "other")
# The launch quantity a row names first, by preference, and how a view names it (by op class where it matters).
_QUANTITY_ORDER = ("num_splits", "num_kv_splits", "packed_query_len", "max_seqlen_q", "max_seqlen_k", "num_seqs",
                   "rows")
_QUANTITY_NAMES = {"num_splits": "KV splits", "num_kv_splits": "KV splits", "packed_query_len": "packed query length",
                   "max_seqlen_q": "max query length", "max_seqlen_k": "max KV length", "num_seqs": "sequences"}
_LAYER = re.compile(r"\.(\d+)(?=\.|$)")


def module_pattern(module: str) -> str:
    """`model.layers.0.mlp.down_proj` -> `model.layers.*.mlp.down_proj`."""
    return _LAYER.sub(".*", module)


def quantity_name(name: str, op_class: str) -> str:
    if name == "rows":
        return "M" if op_class == "matmul" else "rows"
    return _QUANTITY_NAMES.get(name, name)


def drifting_trials(trials: Mapping[int, Any], prod: Any, ids: Sequence[int]) -> list[int]:
    """Production trials (of `ids`, in order) whose target differs from its production solo run."""
    return [tid for tid in ids if tid in prod.trials and trials[tid].target in prod.solo
            and first_divergence(prod.solo[trials[tid].target], prod.trials[tid]) is not None]


def _scalar(v: Any) -> Any:
    return v if isinstance(v, (int, float, str)) and not isinstance(v, bool) else str(v)


def _numbers(entry: Mapping[str, list[Any]], side: str) -> list[Any]:
    return [v for v in entry.get(side, []) if isinstance(v, (int, float))]


def _start(label: str, drifting: list[Any], solo: list[Any]) -> str:
    """Where drifting values sit against solo ones: all above, all below, else both lists."""
    if not solo or min(drifting) > max(solo):
        return f"{label} >= {min(drifting)}"
    if max(drifting) < min(solo):
        return f"{label} <= {max(drifting)} (solo {max(solo)})"
    return f"{label} {', '.join(str(v) for v in drifting)} (solo {', '.join(str(v) for v in solo)})"


def _first_at(follows: dict[str, dict[str, list[Any]]], op_class: str) -> str:
    """Where the divergence starts along the first quantity it followed: `M >= 2` (every drifting value above every
    solo value), `KV splits <= 1 (solo 8)` (below), else the values."""
    for name in (*_QUANTITY_ORDER, *sorted(follows)):
        entry = follows.get(name, {})
        drifting = _numbers(entry, "drifting")
        if drifting:
            return _start(quantity_name(name, op_class), drifting, _numbers(entry, "solo"))
    return ""


def _why_not_localized(tid: int, prod: Any, notes: Sequence[str], setting: str) -> str:
    """Why a drifting trial names no op: its own localize note, an empty capture, the engine's (or a shard's)
    note, or the setting that localized only the first."""
    note = next((n for n in notes if n.startswith(f"localize {tid}:")), None)
    general = next((n for n in notes if n.startswith("localize:")), None)  # the engine's, a shard's
    if note is not None:
        return note.split(":", 1)[1].strip()
    if tid in prod.localized:
        return "the capture found no op where the target's rows differ"
    if general is not None:
        return general.split(":", 1)[1].strip()
    if setting == "first":
        return "not localized (checks.drift.localize: first localizes the first drifting trial)"
    return "not localized"


def _value_order(v: Any) -> tuple[bool, Any]:
    """Numbers first, by value; then everything else by its text."""
    return not isinstance(v, (int, float)), v if isinstance(v, (int, float)) else str(v)


def _follows(found: Sequence[tuple[int, LocalizedOp]]) -> dict[str, dict[str, list[Any]]]:
    """quantity -> the distinct solo and drifting values it took at the op's divergences, each sorted."""
    follows: dict[str, dict[str, list[Any]]] = {}
    for _, op in found:
        for q, pair in op.depends_on.items():
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
                continue
            entry = follows.setdefault(q, {"solo": [], "drifting": []})
            for side, v in zip(("solo", "drifting"), pair, strict=True):
                if _scalar(v) not in entry[side]:
                    entry[side].append(_scalar(v))
    for entry in follows.values():
        for side in entry:
            entry[side].sort(key=_value_order)
    return follows


def _op_row(module: str, name: str, status: str, found: Sequence[tuple[int, LocalizedOp]]) -> VarianceOpRecord:
    """One op of the map: the drifting trials it accounts for, their layers, confirmations and quantities."""
    first = found[0][1]
    confirmation: dict[str, int] = {}
    for _, op in found:
        confirmation[op.confirmation] = confirmation.get(op.confirmation, 0) + 1
    follows = _follows(found)
    return VarianceOpRecord(
        module=module, module_class=module.rsplit(".", 1)[-1] or module, op=name, op_class=first.op_class,
        status=status, trials=[tid for tid, _ in found],
        layers=sorted({op.layer for _, op in found if op.layer is not None}),
        confirmation=confirmation, follows=follows, first_at=_first_at(follows, first.op_class))


def build_map(setting: str, trials: Mapping[int, Any], prod: Any, ids: Sequence[int]) -> VarianceMap:
    """The map of production's drifting trials among `ids` (judged trial ids), from `prod.localized`."""
    drifting = drifting_trials(trials, prod, ids)
    groups: dict[tuple[str, str, str], list[tuple[int, LocalizedOp]]] = {}
    not_localized: dict[str, str] = {}
    notes = [str(n) for n in prod.localize_notes]
    for tid in drifting:
        op: LocalizedOp | None = prod.localized.get(tid)
        if op is None:
            not_localized[str(tid)] = _why_not_localized(tid, prod, notes, setting)
        else:
            groups.setdefault((module_pattern(op.module), op.op, op.status), []).append((tid, op))
    ops = [_op_row(module, name, status, found) for (module, name, status), found in groups.items()]
    ops.sort(key=lambda o: (-len(o.trials), o.module, o.op))
    classes = {c: 0 for c in OP_CLASSES}
    for o in ops:
        classes[o.op_class] = classes.get(o.op_class, 0) + len(o.trials)
    return VarianceMap(localize=setting, drifting_trials=len(drifting),  # type: ignore[arg-type]
                       localized=sum(len(o.trials) for o in ops), ops=ops, classes=classes,
                       not_localized=not_localized)


def variance_map(runs: Any) -> VarianceMap | None:
    """The run's map (judge.Runs): None unless drift is localized and production ran."""
    setting = runs.config.checks.drift.localize
    if setting == "off" or runs.config.checks.drift.requirement == "off" or runs.prod is None:
        return None
    return build_map(setting, runs.trials, runs.prod, runs.judged_ids)


def op_line(o: VarianceOpRecord, drifting: int) -> str:
    """`down_proj _C.onednn_mm.default: 10 of 10 drifting trials, first at M >= 2 (matmul, 10 confirmed)`."""
    first = f", first at {o.first_at}" if o.first_at else ""
    confirmed = ", ".join(f"{n} {c}" for c, n in sorted(o.confirmation.items()))
    status = "" if o.status == "localized" else f" [{o.status}]"
    return (f"{o.module_class} {o.op}{status}: {len(o.trials)} of {drifting} drifting trials{first} "
            f"({o.op_class}; {confirmed})")


def map_lines(m: VarianceMap) -> list[str]:
    """The map as lines, for the console and the summaries: one per op, then the op classes with none."""
    lines = [op_line(o, m.drifting_trials) for o in m.ops]
    idle = [c for c, n in m.classes.items() if n == 0]
    if idle:
        lines.append(", ".join(f"{c}: 0" for c in idle))
    if m.not_localized:
        lines.append(f"{len(m.not_localized)} drifting trials not localized")
    return lines


def pinned_ops(m: VarianceMap) -> dict[str, dict[str, Any]]:
    """What a golden file pins of a map: op key -> its class and the trials it took (of how many)."""
    return {o.key: {"op_class": o.op_class, "trials": len(o.trials), "of": m.drifting_trials,
                    "first_at": o.first_at} for o in m.ops}


def map_changes(pinned: Mapping[str, Any], m: VarianceMap) -> tuple[list[str], list[str]]:
    """Between a golden file's pinned ops and this run's map: (ops that are new here, named; pinned ops this
    run did not see). Only a new op is a change: a pinned op can be absent merely because no drifting trial of
    this schedule reached it, or because it was not localized (`localize: first`)."""
    now = pinned_ops(m)
    added = [f"new batch-variant op: {k} ({v['trials']} of {v['of']} drifting trials"
             + (f", first at {v['first_at']})" if v["first_at"] else ")") for k, v in now.items() if k not in pinned]
    unseen = [f"pinned op not seen in this run: {k}" for k in pinned if k not in now]
    return added, unseen


MAP_HEAD = ("module", "op", "class", "drifting trials", "first at", "confirmation", "layers")


def map_rows(m: VarianceMap) -> list[tuple[str, ...]]:
    """The map as table rows (MAP_HEAD) for every view; op classes with no drifting trial in the last row."""
    rows: list[tuple[str, ...]] = [(o.module_class, o.op + ("" if o.status == "localized" else f" [{o.status}]"), o.op_class,
             f"{len(o.trials)} of {m.drifting_trials}", o.first_at,
             ", ".join(f"{n} {c}" for c, n in sorted(o.confirmation.items())),
             ",".join(str(x) for x in o.layers)) for o in m.ops]
    idle = [c for c, n in m.classes.items() if n == 0]
    if idle:
        rows.append(("(none)", "", ", ".join(idle), f"0 of {m.drifting_trials}", "", "", ""))
    if m.not_localized:
        rows.append(("(not localized)", "", "", f"{len(m.not_localized)} of {m.drifting_trials}", "", "", ""))
    return rows


def map_title(m: VarianceMap) -> str:
    return (f"variance map (production, checks.drift.localize: {m.localize}): {m.localized} of "
            f"{m.drifting_trials} drifting trials localized")
