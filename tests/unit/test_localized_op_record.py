"""A localized op is one type: the engine's answer is what report.json holds, and what a reader gets back."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hand_report import hand_report

from oracle.errors import ConfigError
from oracle.localized_op import LocalizedOp
from oracle.report import load_report, report_schema

OP = LocalizedOp("model.layers.1.mlp.down_proj", "aten.mm.default", 1, 0, 0, (0, 1, 2, 13), (69, 64), 1, 1.2e-7,
                 True, pass_evidence={"num_seqs": 3, "target_is_prefill": True}, op_class="matmul",
                 confirmation="not reproduced alone", confirm_note="the pass moved it",
                 depends_on={"rows": [14, 28]}, repro="repro/3", rank=None)

# A localized op as report.json held it before `status`, `kind`, `within`, `op_class`, `confirmation`,
# `confirm_note`, `depends_on`, `repro` and `rank` were recorded.
FIRST_FORM = {"module": "model.layers.1.mlp.down_proj", "op": "aten.mm.default", "layer": 1, "forward_pass": 2,
              "engine_step": 3, "positions": [4, 5], "shape": [8, 64], "ulp": 2, "max_abs_diff": 1.5e-7,
              "inputs_equal": True, "pass_evidence": {"num_seqs": 2}, "eager": None, "still_diverged": True,
              "note": ""}


def _report_with(tmp_path: Path, localized: Any) -> Path:
    """A hand report whose first localized divergence holds `localized` (an op, or raw JSON put in the file)."""
    report = hand_report()
    index = next(i for i, d in enumerate(report.divergences) if d.localized_op is not None)
    if isinstance(localized, LocalizedOp):
        report.divergences[index].localized_op = localized
        return report.write(tmp_path)
    path = report.write(tmp_path)
    data = json.loads(path.read_text())
    data["divergences"][index]["localized_op"] = localized
    path.write_text(json.dumps(data))
    return path


def _first_op(path: Path) -> LocalizedOp:
    op = next(d.localized_op for d in load_report(path).divergences if d.localized_op is not None)
    assert isinstance(op, LocalizedOp)
    return op


def test_the_engines_op_is_what_the_report_reads_back(tmp_path: Path) -> None:
    path = _report_with(tmp_path, OP)
    written = next(d["localized_op"] for d in json.loads(path.read_text())["divergences"] if d["localized_op"])
    assert written == OP.to_json() and list(written) == [f.name for f in dataclasses.fields(LocalizedOp)]
    assert _first_op(path) == OP


def test_a_localized_op_in_its_first_form_still_loads(tmp_path: Path) -> None:
    op = _first_op(_report_with(tmp_path, FIRST_FORM))
    assert (op.positions, op.shape, op.rank, op.status, op.confirmation) == ((4, 5), (8, 64), None, "localized",
                                                                            "not checked")
    assert op.summary() == ("model.layers.1.mlp.down_proj (aten.mm.default), layer 1, pass 2 (engine step 3), "
                            "2 ULP, other, not checked")


def test_a_localized_op_with_an_unknown_field_is_not_a_report(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"localized_op\.colour"):
        load_report(_report_with(tmp_path, {**FIRST_FORM, "colour": "red"}))


def test_the_schema_describes_the_op_from_its_one_definition() -> None:
    schema = report_schema()["$defs"]["LocalizedOp"]
    assert list(schema["properties"]) == [f.name for f in dataclasses.fields(LocalizedOp)]
    assert schema["properties"]["forward_pass"]["description"] == "forward pass of the diverging run (0-based)"
    assert schema["additionalProperties"] is False


def test_the_views_short_form_names_op_rank_pass_and_what_it_followed() -> None:
    assert OP.summary() == ("model.layers.1.mlp.down_proj (aten.mm.default), layer 1, pass 0 (engine step 0), "
                            "1 ULP, matmul, not reproduced alone (rows 14 vs 28)")
    kv = dataclasses.replace(OP, status="kv_state", rank=1, engine_step=None, ulp=None, depends_on={})
    assert kv.summary() == "KV cache read by model.layers.1.mlp.down_proj (aten.mm.default), layer 1, rank 1, pass 0"


def test_the_contract_hands_engines_the_same_type() -> None:
    """A third-party engine imports `LocalizedOp` from the contract (its `localize` returns one): the report's class,
    not a copy, so what its `localize` returns is what report.json holds."""
    from oracle.engines import contract

    assert contract.LocalizedOp is LocalizedOp and "LocalizedOp" in contract.__all__


def test_an_engines_op_is_checked_when_the_report_takes_it_not_when_the_run_ends() -> None:
    """An engine built on numpy hands numpy numbers: they become Python numbers when the divergence takes the
    op (report.json is written whole at the end), and a field of the wrong type is refused there and then."""
    import numpy as np
    import pydantic

    from oracle.report import DivergenceRecord

    record = next(d for d in hand_report().divergences if d.localized_op is not None)
    fields = {**record.model_dump(), "localized_op": None}
    numpy_op = dataclasses.replace(OP, ulp=np.int64(2), forward_pass=np.int64(3), max_abs_diff=np.float32(0.5))
    taken = DivergenceRecord(**{**fields, "localized_op": numpy_op}).localized_op
    assert taken is not None and (type(taken.ulp), type(taken.forward_pass), type(taken.max_abs_diff)) == (
        int, int, float)
    json.dumps(DivergenceRecord(**{**fields, "localized_op": numpy_op}).model_dump(mode="json"))
    with pytest.raises(pydantic.ValidationError, match="ulp"):
        DivergenceRecord(**{**fields, "localized_op": dataclasses.replace(OP, ulp="two")})  # type: ignore[arg-type]
