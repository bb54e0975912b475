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
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from oracle.capture.rows import Captured, OpCall, OpKey
from oracle.compare import first_divergence

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")

STATUSES = ("localized", "kv_state", "after_capture", "inconclusive")


@dataclass(frozen=True)
class LocalizedOp:
    """Where a target's bits first moved, inside the model.

    `status`: `localized` (an op, named by `module` and `op`), `kv_state` (the KV cache it read
    differed), `after_capture` (every captured op agreed; `op` is the last one that did) or
    `inconclusive` (`module` is the narrowest bound, `note` says why). `positions`: the target's
    token positions whose rows differ; `shape`: the result's full shape in the failing run; `ulp`:
    the largest distance between differing elements on the ordered integer line of their bit
    patterns; `inputs_equal`: whether every row-aligned input was bitwise equal; `within`: the
    custom op the named op ran inside; `op_class`: attention, matmul, norm, sampling,
    communication, kv-cache write or other; `confirmation`: `confirmed` (run alone on each run's
    captured inputs, the op reproduces the difference), `not reproduced alone`, or `not checked`
    (`confirm_note` says why); `depends_on`: launch quantities that differed between the two calls
    ({name: [expected, actual]}); `repro`: the folder of the standalone repro, when written.
    """

    module: str
    op: str
    layer: int | None
    forward_pass: int
    engine_step: int | None
    positions: tuple[int, ...]
    shape: tuple[int, ...]
    ulp: int | None
    max_abs_diff: float | None
    inputs_equal: bool | None
    pass_evidence: dict[str, Any] = field(default_factory=dict)
    eager: bool | None = None
    still_diverged: bool = True
    note: str = ""
    status: str = "localized"
    kind: str = "out"
    within: str = ""
    op_class: str = "other"
    confirmation: str = "not checked"
    confirm_note: str = ""
    depends_on: dict[str, Any] = field(default_factory=dict)
    repro: str | None = None
    rank: int | None = None  # the tensor-parallel rank it ran in (None: one process)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["positions"] = list(self.positions)
        d["shape"] = list(self.shape)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LocalizedOp:
        return cls(**{**d, "positions": tuple(d["positions"]), "shape": tuple(d["shape"])})

    def describe(self) -> str:
        """One line for the console, junit and a pytest failure message."""
        layer = f" (layer {self.layer})" if self.layer is not None else ""
        where = f"pass {self.forward_pass}" + (f", step {self.engine_step}" if self.engine_step is not None else "")
        size = f"{self.ulp} ULP" if self.ulp is not None else "differs"
        if self.max_abs_diff is not None:
            size += f", max abs {self.max_abs_diff:.3g}"
        inputs = {True: "inputs equal", False: "inputs differed", None: "inputs unchecked"}[self.inputs_equal]
        ev = self.pass_evidence
        shared = ", ".join(f"{k} {ev[k]}" for k in ("num_seqs", "num_tokens", "num_prefill_tokens",
                                                     "num_decode_tokens") if k in ev)
        kind = ("prefill" if ev.get("target_is_prefill") else "decode") if "target_is_prefill" in ev else ""
        op = self.op + (f" inside {self.within}" if self.within else "")
        head = {"localized": "", "kv_state": "KV cache: ", "after_capture": "after the last captured op: ",
                "inconclusive": "inconclusive, within "}.get(self.status, "")
        if self.rank is not None:
            layer += f" in rank {self.rank}"
        line = (f"{head}{self.module or '<model>'} {op}{layer} at {where}, positions {_ranges(self.positions)}, "
                f"shape {list(self.shape)}: {size}, {inputs}; pass: {', '.join(x for x in (kind, shared) if x)}")
        if self.status == "localized":
            line += f"; {self.op_class}; {self.confirmation}"
            if self.depends_on:
                line += " (" + ", ".join(f"{k} {v[0]} vs {v[1]}" for k, v in self.depends_on.items()) + ")"
        if self.eager:
            line += "; rerun eager" + ("" if self.still_diverged else " (no longer diverged)")
        elif not self.still_diverged:
            line += "; the rerun's outputs did not diverge"
        return line + (f"; {self.note}" if self.note else "")


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
        verdict: bool | None = True
        for producer in call.inputs:
            for pos in positions:
                a, b = self.expected_at.get((producer, pos)), self.actual_at.get((producer, pos))
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
    changed: dict[int, _Change] = {}
    for call in actual.calls:
        ch = runs.change(call)
        if ch is not None:
            changed[call.index] = ch
    consumers = _consumers(actual.calls)
    sinks = _sinks(actual.calls, consumers)
    skipped: list[str] = []
    for index in sorted(changed):
        ch = changed[index]
        call = ch.call
        if call.kind == "kv_read":
            own = set(runs.passes[call.forward_pass].grids[0].positions)
            older = [p for p in ch.positions if p not in own]
            if older:  # cached positions the target did not compute in this pass
                return Finding(_kv_state(runs, _Change(call, older, [pr for p, pr in zip(ch.positions, ch.pairs,
                                                                                         strict=True) if p in older]),
                                         eager, still))
            continue  # this pass's own writes: an effect of an earlier change
        equal = runs.inputs_equal(call, ch.positions)
        if equal is False:
            continue  # an effect of an earlier change
        if not _reaches(call, changed, consumers, sinks):
            why = "overwritten before it was read" if call.overwritten_by else "not read on the way to the output"
            skipped.append(f"{call.key[0] or '<model>'} {call.key[1]} (pass {call.forward_pass}) changed but was {why}")
            continue
        op = _located(runs, ch, equal, eager, still, "localized", "")
        op = _with_note(op, skipped)
        exp_call = next((runs.expected_at[(call.key, p)][0] for p in ch.positions
                         if (call.key, p) in runs.expected_at), None)
        return Finding(op, call, exp_call)
    if changed and still:
        first = changed[min(changed)]
        bound = _located(runs, first, runs.inputs_equal(first.call, first.positions), eager, still, "inconclusive",
                         "results changed, but none that read equal inputs and reached the output: "
                         + "; ".join(skipped[:3]) if skipped else
                         "every changed result read a changed input that was not captured")
        return Finding(bound)
    if still:
        return Finding(_after_capture(runs, eager, target_prompt_len))
    return Finding(None)


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
    match = _LAYER.search(module)
    ulps = [u for a, b in ch.pairs if (u := ulp_distance(a, b)) is not None]
    diffs = [d for a, b in ch.pairs if (d := max_abs(a, b)) is not None]
    notes = [note] if note else []
    if runs.incomparable:
        notes.append(f"{runs.incomparable} rows could not be compared (shapes differ)")
    return LocalizedOp(
        module=module, op=op, layer=int(match.group(1)) if match else None,
        forward_pass=call.forward_pass, engine_step=layout.engine_step, positions=tuple(ch.positions),
        shape=call.shape, ulp=max(ulps) if ulps else None, max_abs_diff=max(diffs) if diffs else None,
        inputs_equal=equal, pass_evidence=dict(layout.evidence), eager=eager, still_diverged=still,
        note="; ".join(notes), status=status, kind=call.kind, within=call.within,
        op_class="kv-cache write" if call.kind == "kv_write" else op_class(module, op + " " + call.within),
    )


def _with_note(op: LocalizedOp, skipped: list[str]) -> LocalizedOp:
    if not skipped:
        return op
    from dataclasses import replace

    extra = f"earlier changes that did not reach the output: {'; '.join(skipped[:3])}"
    return replace(op, note="; ".join(x for x in (op.note, extra) if x))


def _kv_state(runs: _Runs, ch: _Change, eager: bool | None, still: bool) -> LocalizedOp:
    """The KV cache differed as an op was about to read it: `kv_state` when the differing positions are ones the
    target never computed in this run (another request's pass wrote them: a prefix-cache hit); else the target
    wrote them itself, and the capture either saw those writes agree or did not see them: `inconclusive`."""
    call = ch.call
    computed = {p for lay in runs.actual.passes if lay.forward_pass < call.forward_pass and lay.grids
                for p in lay.grids[0].positions}
    inherited = [p for p in ch.positions if p not in computed]
    if inherited:
        inherited_ch = _Change(call, inherited, [pr for p, pr in zip(ch.positions, ch.pairs, strict=True)
                                                 if p in inherited])
        note = (f"positions {_ranges(inherited)} were not computed by the target in this run (another request's "
                "pass wrote them: a prefix-cache hit) and differ from what its solo run wrote")
        return _located(runs, inherited_ch, None, eager, still, "kv_state", note)
    layer = _LAYER.search(call.key[0])
    written = {p for c in runs.actual.calls if c.kind == "kv_write" and c.forward_pass < call.forward_pass + 1
               and (m := _LAYER.search(c.key[0])) and layer and m.group(1) == layer.group(1) for p in c.positions}
    seen = [p for p in ch.positions if p in written]
    unseen = [p for p in ch.positions if p not in written]
    parts = []
    if seen:
        parts.append(f"the target wrote positions {_ranges(seen)} itself, and the captured writes agreed: the cache "
                     "changed between write and read where the capture could not see")
    if unseen:
        parts.append(f"the target computed positions {_ranges(unseen)} in an earlier pass, but no write of them into "
                     "this cache was captured: the op that wrote them is not known")
    return _located(runs, ch, None, eager, still, "inconclusive", "the KV cache differed as it was read; "
                    + "; ".join(parts))


def _after_capture(runs: _Runs, eager: bool | None, prompt_len: int | None) -> LocalizedOp:
    """Every captured op agreed but the outputs differ: name the last op that agreed in the pass that made the
    differing step (the pass that computed its position: for a logits change, that pass's lm_head)."""
    d = first_divergence(runs.expected.completion, runs.actual.completion)
    pos = (prompt_len + d.step - 1) if (d is not None and prompt_len is not None) else None
    made = next((lay.forward_pass for lay in runs.actual.passes
                 if pos is not None and any(pos in g.positions for g in lay.grids)), None)
    calls = [c for c in runs.actual.calls if c.kind in ("out", "write")
             and (made is None or c.forward_pass == made) and (pos is None or pos in c.positions)]
    calls = calls or list(runs.actual.calls)
    last = calls[-1] if calls else None
    if last is None:
        return LocalizedOp("", "", None, 0, None, (), (), None, None, None, eager=eager, still_diverged=True,
                           status="after_capture", note="no op of the target was captured")
    ch = _Change(last, [p for p in last.positions if pos is None or p == pos] or list(last.positions), [])
    step = f" at step {d.step}" if d is not None else ""
    return _located(runs, ch, True, eager, True, "after_capture",
                    f"every captured op agreed, yet the outputs differ{step}: the difference was made after "
                    "the last captured op (sampling, a logits processor, post-processing)")


def _ranges(positions: Sequence[int]) -> str:
    """[3, 4, 5, 9] -> "3-5, 9"."""
    parts: list[str] = []
    run_start = prev = None
    for p in positions:
        if prev is not None and p == prev + 1:
            prev = p
            continue
        if run_start is not None:
            parts.append(str(run_start) if run_start == prev else f"{run_start}-{prev}")
        run_start = prev = p
    if run_start is not None:
        parts.append(str(run_start) if run_start == prev else f"{run_start}-{prev}")
    return ", ".join(parts) or "-"
