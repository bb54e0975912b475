"""The localization rule over two captured runs of one target: which op made its bits move.

Both runs' op results are lined up by (op key, token position). A result *changed* when its rows
differ bitwise from the expected run's at the same (op key, position); a result found in one run
only is not compared (op keys count occurrences, which batch-dependent Python code can shift).
The named op is the first changed result, in execution order, that is a root and matters:

- root: every row-aligned input it read was bitwise equal at the differing positions (a result
  downstream of a changed input is an effect, not a cause);
- matters: its difference reaches the target's output through results that changed too: a KV
  write, or a result nothing read afterwards that comes after the pass's last KV write (the
  logits, logprobs, sampled token). A difference overwritten before it is read, or never read,
  is not a cause; it is listed in the note.

When the KV cache differs as an op is about to read it at positions another request wrote (a
prefix-cache hit: positions the target never computed in the run), the finding is the cache
(`kv_state`), not the op; positions the target wrote itself cannot differ there unless a write
was missed, so that is `inconclusive`, never `kv_state`.
When every captured result agrees but the outputs differ, the difference was made after the last
captured op (`after_capture`, naming the last op that agreed). When changes exist but none is a
root that matters, the answer is `inconclusive` with the narrowest bound, never a guess.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

import torch

from oracle.capture.rows import Captured, OpCall, OpKey
from oracle.compare import first_divergence
from oracle.engines.contract import LocalizedOp, position_ranges

RowsAt = dict[tuple[OpKey, int], tuple[OpCall, int]]  # Captured.rows_at(): (op key, position) -> (call, row)

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


# ---------------------------------------------------------------------------------------------
# Bits


def _int_view(t: torch.Tensor) -> torch.Tensor:
    """The bit patterns of a float tensor as signed ints of the same width (ints stay as they are)."""
    if not t.is_floating_point():
        return t
    ints = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}
    return t.view(ints[t.element_size()])


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool | None:
    """Bitwise equality; None when the two rows cannot be compared (shape or dtype differs)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return None
    return bool(torch.equal(_int_view(a), _int_view(b)))


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """Largest distance between elements on the ordered integer line of their bit patterns."""
    if not a.is_floating_point() or a.shape != b.shape or a.dtype != b.dtype:
        return None
    top = 1 << (8 * a.element_size() - 1)

    def ordered(t: torch.Tensor) -> torch.Tensor:
        bits = _int_view(t).to(torch.int64)
        return torch.where(bits < 0, -(bits + top), bits)  # -0.0 and 0.0 both map to 0

    return int((ordered(a) - ordered(b)).abs().max().item()) if a.numel() else 0


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float | None:
    if not a.is_floating_point() or a.shape != b.shape or not a.numel():
        return None
    return float((a.to(torch.float64) - b.to(torch.float64)).abs().max().item())


# ---------------------------------------------------------------------------------------------
# The rule


@dataclass
class _Change:
    call: OpCall
    positions: list[int]
    pairs: list[tuple[torch.Tensor, torch.Tensor]]

    def only(self, keep: Collection[int]) -> _Change:
        """This change at the positions in `keep` alone."""
        pairs = [pair for p, pair in zip(self.positions, self.pairs, strict=True) if p in keep]
        return _Change(self.call, [p for p in self.positions if p in keep], pairs)


@dataclass(frozen=True)
class Finding:
    """The rule's answer plus, for a named op, its matching call in the expected run (to confirm it)."""

    op: LocalizedOp | None
    actual_call: OpCall | None = None
    expected_call: OpCall | None = None


class _Runs:
    def __init__(self, expected: Captured, actual: Captured) -> None:
        self.expected, self.actual = expected, actual
        self.expected_at = expected.rows_at()
        self.actual_at = actual.rows_at()
        self.passes = {p.forward_pass: p for p in actual.passes}
        self.incomparable = 0

    def changes(self) -> dict[int, _Change]:
        """Every result of the actual run whose rows differ from the expected run's, by call index."""
        return {call.index: ch for call in self.actual.calls if (ch := self.change(call)) is not None}

    def change(self, call: OpCall) -> _Change | None:
        differing: list[int] = []
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        for i, pos in enumerate(call.positions):
            found = self.expected_at.get((call.key, pos))
            if found is None:
                continue
            other, j = found
            same = bitwise_equal(other.rows[j], call.rows[i])
            if same is None:
                self.incomparable += 1
            elif not same:
                differing.append(pos)
                pairs.append((other.rows[j], call.rows[i]))
        if differing:
            return _Change(call, differing, pairs)
        return None

    def inputs_equal(self, call: OpCall, positions: Sequence[int]) -> bool | None:
        return inputs_equal_at(self.expected_at, self.actual_at, call, positions)


def inputs_equal_at(expected_at: RowsAt, actual_at: RowsAt, call: OpCall, positions: Sequence[int]) -> bool | None:
    """Whether every input row `call` read at `positions` is bitwise equal in both runs (`*_at`: (producer,
    position) -> (the producing call, its row)); None where a row is missing or cannot be compared."""
    verdict: bool | None = True
    for producer in call.inputs:
        for pos in positions:
            a, b = expected_at.get((producer, pos)), actual_at.get((producer, pos))
            if a is None or b is None:
                verdict = None
                continue
            same = bitwise_equal(a[0].rows[a[1]], b[0].rows[b[1]])
            if same is False:
                return False
            if same is None:
                verdict = None
    return verdict


def _consumers(calls: Sequence[OpCall]) -> dict[tuple[int, OpKey], list[OpCall]]:
    out: dict[tuple[int, OpKey], list[OpCall]] = {}
    for c in calls:
        for k in c.inputs:
            out.setdefault((c.forward_pass, k), []).append(c)
    return out


def _sinks(calls: Sequence[OpCall], consumers: dict[tuple[int, OpKey], list[OpCall]]) -> set[int]:
    """Results that are the target's output of their pass: KV writes, and results nothing read after
    the pass's last KV write (logits, logprobs, the sampled token), not overwritten."""
    last_kv: dict[int, int] = {}
    for c in calls:
        if c.kind == "kv_write":
            last_kv[c.forward_pass] = c.index
    sinks = {c.index for c in calls if c.kind == "kv_write"}
    for c in calls:
        if c.kind in ("out", "write") and c.overwritten_by is None and c.index > last_kv.get(c.forward_pass, -1) \
                and not consumers.get((c.forward_pass, c.key)):
            sinks.add(c.index)
    return sinks


def _reaches(start: OpCall, changed: dict[int, _Change], consumers: dict[tuple[int, OpKey], list[OpCall]],
             sinks: set[int]) -> bool:
    seen: set[int] = set()
    stack = [start]
    while stack:
        c = stack.pop()
        if c.index in seen:
            continue
        seen.add(c.index)
        if c.index in sinks:
            return True
        if c.overwritten_by is not None:
            continue
        stack.extend(n for n in consumers.get((c.forward_pass, c.key), []) if n.index in changed)
    return False


def localize_captured(expected: Captured, actual: Captured, *, eager: bool | None = None,
                      target_prompt_len: int | None = None) -> Finding:
    """Apply the rule to two captured runs of the same target (expected: alone; actual: the trial)."""
    runs = _Runs(expected, actual)
    still = first_divergence(expected.completion, actual.completion) is not None
    changed = runs.changes()
    consumers = _consumers(actual.calls)
    sinks = _sinks(actual.calls, consumers)
    skipped: list[str] = []
    for index in sorted(changed):
        ch = changed[index]
        if ch.call.kind == "kv_read":
            older = _cached_elsewhere(runs, ch)
            if older is not None:
                return Finding(_kv_state(runs, older, eager, still))
            continue  # this pass's own writes: an effect of an earlier change
        equal = runs.inputs_equal(ch.call, ch.positions)
        if equal is False:
            continue  # an effect of an earlier change
        if not _reaches(ch.call, changed, consumers, sinks):
            skipped.append(_unread(ch.call))
            continue
        return _named(runs, ch, equal, eager, still, skipped)
    if changed and still:
        return Finding(_bound(runs, changed[min(changed)], skipped, eager, still))
    return Finding(_after_capture(runs, eager, target_prompt_len) if still else None)


def _cached_elsewhere(runs: _Runs, ch: _Change) -> _Change | None:
    """A KV read's change at cached positions the target did not compute in this pass, or None."""
    own = set(runs.passes[ch.call.forward_pass].grids[0].positions)
    older = ch.only({p for p in ch.positions if p not in own})
    return older if older.positions else None


def _unread(call: OpCall) -> str:
    """Why a changed result is not a cause: what became of it."""
    why = "overwritten before it was read" if call.overwritten_by else "not read on the way to the output"
    return f"{call.key[0] or '<model>'} {call.key[1]} (pass {call.forward_pass}) changed but was {why}"


def _named(runs: _Runs, ch: _Change, equal: bool | None, eager: bool | None, still: bool,
           skipped: list[str]) -> Finding:
    """The named op, the earlier changes that did not count in its note, and its call in the expected run."""
    op = _with_note(_located(runs, ch, equal, eager, still, "localized", ""), skipped)
    key = ch.call.key
    expected_call = next((runs.expected_at[(key, p)][0] for p in ch.positions if (key, p) in runs.expected_at), None)
    return Finding(op, ch.call, expected_call)


def _bound(runs: _Runs, first: _Change, skipped: list[str], eager: bool | None, still: bool) -> LocalizedOp:
    """Results changed, but none is a root that reaches the output: the first of them, as the narrowest bound."""
    why = ("results changed, but none that read equal inputs and reached the output: " + "; ".join(skipped[:3])
           if skipped else "every changed result read a changed input that was not captured")
    return _located(runs, first, runs.inputs_equal(first.call, first.positions), eager, still, "inconclusive", why)


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


def _located(runs: _Runs, ch: _Change, equal: bool | None, eager: bool | None, still: bool, status: str,
             note: str) -> LocalizedOp:
    call = ch.call
    layout = runs.passes[call.forward_pass]
    module, op, _ = call.key
    layer = _layer(module)
    incomparable = f"{runs.incomparable} rows could not be compared (shapes differ)" if runs.incomparable else ""
    return LocalizedOp(
        module=module, op=op, layer=int(layer) if layer is not None else None,
        forward_pass=call.forward_pass, engine_step=layout.engine_step, positions=tuple(ch.positions),
        shape=call.shape, ulp=max((u for a, b in ch.pairs if (u := ulp_distance(a, b)) is not None), default=None),
        max_abs_diff=max((d for a, b in ch.pairs if (d := max_abs(a, b)) is not None), default=None),
        inputs_equal=equal, pass_evidence=dict(layout.evidence), eager=eager, still_diverged=still,
        note="; ".join(x for x in (note, incomparable) if x), status=status, kind=call.kind, within=call.within,
        op_class="kv-cache write" if call.kind == "kv_write" else op_class(module, op + " " + call.within),
    )


def _layer(module: str) -> str | None:
    """The decoder layer a module path lies in (`model.layers.3.mlp` -> "3"), or None."""
    match = _LAYER.search(module)
    return match.group(1) if match else None


def _with_note(op: LocalizedOp, skipped: list[str]) -> LocalizedOp:
    if not skipped:
        return op
    extra = f"earlier changes that did not reach the output: {'; '.join(skipped[:3])}"
    return replace(op, note="; ".join(x for x in (op.note, extra) if x))


def _kv_state(runs: _Runs, ch: _Change, eager: bool | None, still: bool) -> LocalizedOp:
    """The KV cache differed as an op was about to read it: `kv_state` when the differing positions are ones the
    target never computed in this run (another request's pass wrote them: a prefix-cache hit); else the target
    wrote them itself, and the capture either saw those writes agree or did not see them: `inconclusive`."""
    computed = _computed_before(runs, ch.call.forward_pass)
    inherited = ch.only({p for p in ch.positions if p not in computed})
    if inherited.positions:
        note = (f"positions {position_ranges(inherited.positions)} were not computed by the target in this run "
                "(another request's pass wrote them: a prefix-cache hit) and differ from what its solo run wrote")
        return _located(runs, inherited, None, eager, still, "kv_state", note)
    written = _written_by_then(runs, ch.call)
    return _located(runs, ch, None, eager, still, "inconclusive", "the KV cache differed as it was read; "
                    + _own_writes(ch.positions, written))


def _computed_before(runs: _Runs, forward_pass: int) -> set[int]:
    """The positions the target computed in the passes before `forward_pass`."""
    return {p for lay in runs.actual.passes if lay.forward_pass < forward_pass and lay.grids
            for p in lay.grids[0].positions}


def _written_by_then(runs: _Runs, call: OpCall) -> set[int]:
    """The positions captured KV writes put into the cache of `call`'s layer, in its pass or before."""
    layer = _layer(call.key[0])
    if layer is None:
        return set()
    return {p for c in runs.actual.calls if c.kind == "kv_write" and c.forward_pass <= call.forward_pass
            and _layer(c.key[0]) == layer for p in c.positions}


def _own_writes(positions: Sequence[int], written: set[int]) -> str:
    """Positions the target wrote itself differ as read: whether the capture saw those writes (agreeing) or not."""
    seen = [p for p in positions if p in written]
    unseen = [p for p in positions if p not in written]
    parts = []
    if seen:
        parts.append(f"the target wrote positions {position_ranges(seen)} itself, and the captured writes agreed: "
                     "the cache changed between write and read where the capture could not see")
    if unseen:
        parts.append(f"the target computed positions {position_ranges(unseen)} in an earlier pass, but no write of "
                     "them into this cache was captured: the op that wrote them is not known")
    return "; ".join(parts)


def _after_capture(runs: _Runs, eager: bool | None, prompt_len: int | None) -> LocalizedOp:
    """Every captured op agreed but the outputs differ: name the last op that agreed in the pass that made the
    differing step (the pass that computed its position: for a logits change, that pass's lm_head)."""
    d = first_divergence(runs.expected.completion, runs.actual.completion)
    pos = (prompt_len + d.step - 1) if (d is not None and prompt_len is not None) else None
    last = _last_result(runs, pos)
    if last is None:
        return LocalizedOp("", "", None, 0, None, (), (), None, None, None, eager=eager, still_diverged=True,
                           status="after_capture", note="no op of the target was captured")
    ch = _Change(last, [p for p in last.positions if pos is None or p == pos] or list(last.positions), [])
    step = f" at step {d.step}" if d is not None else ""
    # op_class "other": the op named agreed, so its class (lm_head's matmul) says nothing of the difference
    return replace(_located(runs, ch, True, eager, True, "after_capture",
                            f"every captured op agreed, yet the outputs differ{step}: the difference was made after "
                            "the model (post-processing, sampling, a logits processor)"), op_class="other")


def _last_result(runs: _Runs, pos: int | None) -> OpCall | None:
    """The last result (returned or written) of the pass that computed position `pos`, holding it (of any pass,
    at any position, when `pos` is unknown); with none, the last captured call of any kind."""
    made = _pass_computing(runs, pos) if pos is not None else None
    calls = [c for c in runs.actual.calls if _holds(c, made, pos)] or list(runs.actual.calls)
    return calls[-1] if calls else None


def _pass_computing(runs: _Runs, pos: int) -> int | None:
    """The first pass of the actual run whose grids hold position `pos`, or None."""
    return next((lay.forward_pass for lay in runs.actual.passes if any(pos in g.positions for g in lay.grids)), None)


def _holds(call: OpCall, forward_pass: int | None, pos: int | None) -> bool:
    """A result (returned or written) of `forward_pass` that holds `pos` (None: any pass, any position)."""
    return call.kind in ("out", "write") and (forward_pass is None or call.forward_pass == forward_pass) \
        and (pos is None or pos in call.positions)
