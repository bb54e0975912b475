"""Where a target's bits first moved, inside the model: `LocalizedOp`, one type from the engine to report.json.

An engine's localization answers with it (`oracle.engines.contract` re-exports it: a third-party engine imports it
from there), the capture builds it, and a report's divergence holds it as its `localized_op`: pydantic reads the
dataclass as it is, so its fields, and their descriptions in `oracle/report.schema.json`, are written once, here.
The module imports nothing of oracle, so the report, the pytest plugin and the views load it without the engines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

__all__ = ["LocalizedOp", "position_ranges"]

# `after_capture`: no op is to blame; the op named is the last one that agreed.
AFTER_MODEL = ("every captured op agreed; the difference came after the model (post-processing, sampling, a "
               "logits processor); the last op that agreed: ")
# The line a status starts with in `LocalizedOp.describe`.
_STATUS_HEADS = {"localized": "", "kv_state": "KV cache: ", "after_capture": AFTER_MODEL,
                 "inconclusive": "inconclusive, within "}
# The same, in `LocalizedOp.summary`.
_SUMMARY_HEADS = {"kv_state": "KV cache read by ", "after_capture": AFTER_MODEL, "inconclusive": "inconclusive, within "}
_INPUTS = {True: "inputs equal", False: "inputs differed", None: "inputs unchecked"}
_SHARED = ("num_seqs", "num_tokens", "num_prefill_tokens", "num_decode_tokens")


@dataclass(frozen=True)
class LocalizedOp:
    """Where a target's bits first moved, inside the model: an engine's answer, and a report's `localized_op`."""

    # How pydantic reads this class inside the report (a plain dict, so this module imports no pydantic): the
    # report's schema is generated from these fields, each one's description from the docstring below it. An
    # engine's instance is checked (and numpy scalars made Python numbers) when the report takes it, not when
    # report.json is written at the end of the run.
    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid", "use_attribute_docstrings": True,
                                                      "revalidate_instances": "always"}

    module: str
    """module path, e.g. model.layers.1.mlp.down_proj (for `inconclusive`, the narrowest bound)"""
    op: str
    """aten op, e.g. aten.mm.default (for `after_capture`, the last captured op: it agreed)"""
    layer: int | None
    forward_pass: int
    """forward pass of the diverging run (0-based)"""
    engine_step: int | None
    positions: tuple[int, ...]
    """the target's token positions whose rows differed"""
    shape: tuple[int, ...]
    """the result's full shape in the failing run"""
    ulp: int | None
    """the largest distance between differing elements on the ordered integer line of their bit patterns"""
    max_abs_diff: float | None
    inputs_equal: bool | None
    """every row-aligned input was bitwise equal (null: unchecked)"""
    pass_evidence: dict[str, Any] = field(default_factory=dict)
    """what shared the pass: target_is_prefill, num_seqs, num_tokens, ..."""
    eager: bool | None = None
    """the localizing rerun ran eagerly (no CUDA graphs or compile)"""
    still_diverged: bool = True
    """the localizing rerun still diverged"""
    note: str = ""
    """what else the localizer found: why it is inconclusive, the ops or ranks it passed over"""
    status: str = "localized"
    """localized (an op), kv_state (the KV cache it read differed), after_capture, inconclusive (a bound)"""
    kind: str = "out"
    """out (a returned tensor), write (an argument the op wrote), kv_write, kv_read"""
    within: str = ""
    """the custom op the named op ran inside"""
    op_class: str = "other"
    """attention, matmul, norm, sampling, communication, kv-cache write or other"""
    confirmation: str = "not checked"
    """confirmed (alone on each run's captured inputs it reproduces the difference), not reproduced alone, not checked"""
    confirm_note: str = ""
    """what confirming found, or why it was not checked"""
    depends_on: dict[str, Any] = field(default_factory=dict)
    """launch quantities that differed between the two calls: {name: [expected, actual]}"""
    repro: str | None = None
    """folder of the standalone one-op repro"""
    rank: int | None = None
    """the tensor-parallel rank the op ran in (null: one process)"""

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["positions"] = list(self.positions)
        d["shape"] = list(self.shape)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LocalizedOp:
        return cls(**{**d, "positions": tuple(d["positions"]), "shape": tuple(d["shape"])})

    def describe(self) -> str:
        """The full line `oracle localize` prints: positions, shape, inputs, the pass, the rerun and the note."""
        op = self.op + (f" inside {self.within}" if self.within else "")
        layer = f" (layer {self.layer})" if self.layer is not None else ""
        if self.rank is not None:
            layer += f" in rank {self.rank}"
        line = (f"{_STATUS_HEADS.get(self.status, '')}{self.module or '<model>'} {op}{layer} at {self._where()}, "
                f"positions {position_ranges(self.positions)}, shape {list(self.shape)}: {self._size()}, "
                f"{_INPUTS[self.inputs_equal]}; pass: {self._pass()}")
        tail = [self._confirmed(), self._rerun(), f"; {self.note}" if self.note else ""]
        return line + "".join(tail)

    def summary(self) -> str:
        """The short form a report's views show: module (op), layer, rank, pass, step, ULP, class and confirmation."""
        layer = f", layer {self.layer}" if self.layer is not None else ""
        layer += f", rank {self.rank}" if self.rank is not None else ""
        step = f" (engine step {self.engine_step})" if self.engine_step is not None else ""
        ulp = f", {self.ulp} ULP" if self.ulp is not None else ""
        op = self.op + (f" inside {self.within}" if self.within else "")
        head = _SUMMARY_HEADS.get(self.status, "")
        tail = f", {self.op_class}, {self.confirmation}" if self.status == "localized" else ""
        if self.depends_on:
            tail += " (" + ", ".join(f"{k} {v[0]} vs {v[1]}" for k, v in self.depends_on.items()) + ")"
        return f"{head}{self.module} ({op}){layer}, pass {self.forward_pass}{step}{ulp}{tail}"

    def finding(self) -> str:
        """The summary as a finding: `first diverging op: ...`, or for `after_capture` that every captured op
        agreed and the difference came after the model (the op named is the last that agreed, not a culprit)."""
        return self.summary() if self.status == "after_capture" else f"first diverging op: {self.summary()}"

    def _where(self) -> str:
        return f"pass {self.forward_pass}" + (f", step {self.engine_step}" if self.engine_step is not None else "")

    def _size(self) -> str:
        size = f"{self.ulp} ULP" if self.ulp is not None else "differs"
        return size + (f", max abs {self.max_abs_diff:.3g}" if self.max_abs_diff is not None else "")

    def _pass(self) -> str:
        """What shared the pass: prefill or decode for the target, and the pass's sizes."""
        ev = self.pass_evidence
        shared = ", ".join(f"{k} {ev[k]}" for k in _SHARED if k in ev)
        kind = ("prefill" if ev["target_is_prefill"] else "decode") if "target_is_prefill" in ev else ""
        return ", ".join(x for x in (kind, shared) if x)

    def _confirmed(self) -> str:
        """A named op's class and confirmation, with the launch quantities that differed."""
        if self.status != "localized":
            return ""
        depends = ", ".join(f"{k} {v[0]} vs {v[1]}" for k, v in self.depends_on.items())
        return f"; {self.op_class}; {self.confirmation}" + (f" ({depends})" if depends else "")

    def _rerun(self) -> str:
        if self.eager:
            return "; rerun eager" + ("" if self.still_diverged else " (no longer diverged)")
        return "" if self.still_diverged else "; the rerun's outputs did not diverge"


def position_ranges(positions: Sequence[int]) -> str:
    """[3, 4, 5, 9] -> "3-5, 9" (positions in order; "-" for none)."""
    runs: list[list[int]] = []
    for p in positions:
        if runs and p == runs[-1][-1] + 1:
            runs[-1].append(p)
        else:
            runs.append([p])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs) or "-"
