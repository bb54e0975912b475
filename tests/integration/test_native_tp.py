"""The native engine at tensor parallel 2 on the CPU (ranks over gloo): invariance holds in every rank, a rank
without the kernels or one that dies stops the engine naming it, and a planted fault is caught, shrunk and
localized to the op, layer and rank where it is (tests/support/planted_tp.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from planted_tp import DyingRank, NoKernelsInRank, PlantedTPEngine
from pydantic import TypeAdapter

from oracle.capture import LocalizedOp
from oracle.cli import main
from oracle.config import EngineConfig
from oracle.engines.contract import Completion, Request, RunSpec, SamplingParams
from oracle.engines.native import NativeEngine
from oracle.engines.vllm_engine import KernelsNotInForce
from oracle.errors import EngineError
from oracle.localize import localize_runs
from oracle.posture import posture_of

ALL_REDUCE = "oracle_tp.all_reduce.default"
DOWN_PROJ_0 = "model.layers.0.mlp.down_proj"
SAMPLING = SamplingParams(max_tokens=3, logits="full")
TARGET = Request("target", tuple(range(3, 15)), SAMPLING)
FILLERS = (Request("f0", tuple(range(20, 30)), SAMPLING), Request("f1", tuple(range(40, 52)), SAMPLING))
SOLO, TRIAL = RunSpec((TARGET,), 0), RunSpec((TARGET, *FILLERS), 0)


def _tp2(**options: Any) -> EngineConfig:
    return EngineConfig.of("native", tensor_parallel_size=2, num_threads=1, **options)


def _gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        return False
    return True


def _bitwise(a: Completion, b: Completion) -> bool:
    assert a.logits is not None and b.logits is not None
    return a.token_ids == b.token_ids and all(
        torch.equal(torch.as_tensor(x).view(torch.int32), torch.as_tensor(y).view(torch.int32))
        for x, y in zip(a.logits, b.logits, strict=True))


@pytest.fixture(scope="module")
def clean(tiny_qwen3: Path) -> Iterator[NativeEngine]:
    engine = NativeEngine(tiny_qwen3, "invariant", _tp2())
    yield engine
    engine.close()


def test_tp2_invariant_is_batch_invariant_and_every_rank_proves_its_kernels(clean: NativeEngine) -> None:
    solo = clean.generate([TARGET])[0]
    batched = clean.generate([TARGET, *FILLERS])[0]
    assert _bitwise(solo, batched)
    described = clean.describe()
    assert described["tensor_parallel_size"] == 2 and described["all_reduce"] == "gloo"
    ranks = described["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["kernels"] for r in ranks)
    assert all("aten::mm" in r["batch_variant_covered"] and not r["batch_variant_uncovered"] for r in ranks)
    assert ranks[1]["pid"] != os.getpid()
    posture = posture_of(described)
    assert (posture["tensor_parallel"], posture["all_reduce"], posture["rank_devices"]) == (2, "gloo", ["cpu", "cpu"])


def test_control_without_a_fault_localizes_nothing(clean: NativeEngine) -> None:
    assert localize_runs(clean, SOLO, TRIAL) is None


def test_tp2_logits_agree_with_tp1_to_rounding(tiny_qwen3: Path, clean: NativeEngine) -> None:
    one = NativeEngine(tiny_qwen3, "invariant", EngineConfig.of("native", num_threads=1))
    try:
        a = one.generate([TARGET])[0]
    finally:
        one.close()
    b = clean.generate([TARGET])[0]
    assert a.token_ids == b.token_ids
    assert a.logits is not None and b.logits is not None
    assert max(float((torch.as_tensor(x) - torch.as_tensor(y)).abs().max()) for x, y in zip(a.logits, b.logits,
                                                                                              strict=True)) < 1e-4


def test_close_ends_every_rank(tiny_qwen3: Path) -> None:
    engine = NativeEngine(tiny_qwen3, "production", _tp2())
    assert engine.ranks is not None
    pids = engine.ranks.pids
    assert pids and not _gone(pids)
    engine.close()
    engine.close()  # twice is harmless
    assert _gone(pids)
    assert engine.describe()["engine"] == "native"


@pytest.mark.slow
def test_a_rank_without_the_kernels_stops_invariant_mode_naming_it(tiny_qwen3: Path) -> None:
    with pytest.raises(KernelsNotInForce, match=r"rank 1 \(pid \d+, cpu\): oracle_kernels are not registered"):
        NativeEngine(tiny_qwen3, "invariant", _tp2(), reducer=NoKernelsInRank(1))


def test_a_rank_that_dies_is_an_engine_error_naming_it_and_no_process_is_left(tiny_qwen3: Path) -> None:
    engine = NativeEngine(tiny_qwen3, "production", _tp2(), reducer=DyingRank(1, min_tokens=30))
    assert engine.ranks is not None
    pids = engine.ranks.pids
    try:
        with pytest.raises(EngineError, match=r"rank 1 \(pid \d+\) died during a forward pass \(exit code 7\)"):
            engine.generate([Request("long", tuple(range(1, 40)), SamplingParams(max_tokens=2))])
    finally:
        engine.close()
    assert _gone(pids)


def _run_config(tmp_path: Path, model: Path, engine: dict[str, Any], checks: dict[str, Any] | None = None,
                **schedule: Any) -> Path:
    config: dict[str, Any] = {
        "model": str(model),
        "engine": engine,
        "prompts": {"random": {"count": 2, "min_len": 8, "max_len": 16, "seed": 0}},
        "sampling": {"max_tokens": 3, "logits": "full"},
        "schedule": {"trials": 4, "seed": 1, "batch_size": [2, 4], "filler_len": [4, 16],
                     "filler_max_tokens": [1, 3], **{"repeat_trials": 0, **schedule}},
        "checks": {"fidelity": "off", "drift": "off", "negative_control": "off", "prefill_decode": "off",
                   "prefix_cache": "off", **(checks or {})},
    }
    path = tmp_path / "tp2.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_size_that_does_not_divide_the_model_is_exit_2_naming_the_field(
        tiny_qwen3: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _run_config(tmp_path, tiny_qwen3, {"kind": "native", "options": {"tensor_parallel_size": 3}})
    assert main(["run", str(path), "--report-dir", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err
    assert "engine.options.tensor_parallel_size" in err and "attention heads (4)" in err


@pytest.fixture(scope="module")
def planted_all_reduce(tiny_qwen3: Path) -> Iterator[NativeEngine]:
    engine = PlantedTPEngine(tiny_qwen3, "invariant", fault="all_reduce", fault_module=DOWN_PROJ_0, fault_rank=1,
                             tensor_parallel_size=2, num_threads=1)
    yield engine
    engine.close()


@pytest.mark.slow
def test_the_planted_all_reduce_is_localized_to_its_layer_and_rank_and_confirmed(
        planted_all_reduce: NativeEngine) -> None:
    solo = planted_all_reduce.generate([TARGET])[0]
    assert not _bitwise(solo, planted_all_reduce.generate([TARGET, *FILLERS])[0])  # the fault is caught
    op = localize_runs(planted_all_reduce, SOLO, TRIAL)
    assert op is not None, "localization never returns nothing where the outputs differ"
    assert (op.module, op.op, op.layer, op.rank) == (DOWN_PROJ_0, ALL_REDUCE, 0, 1)
    assert op.status == "localized" and op.op_class == "communication" and op.inputs_equal is True
    assert op.confirmation == "confirmed", op.confirm_note
    assert op.depends_on["num_tokens"][0] == 1 and op.depends_on["num_tokens"][1] > 1
    assert "rank 1" in op.describe()


@pytest.mark.slow
def test_a_planted_matmul_fault_in_one_rank_is_named_as_that_op_with_its_rank(tiny_qwen3: Path) -> None:
    engine = PlantedTPEngine(tiny_qwen3, "invariant", fault="matmul", fault_module=DOWN_PROJ_0, fault_rank=1,
                             tensor_parallel_size=2, num_threads=1)
    try:
        op = localize_runs(engine, SOLO, TRIAL)
    finally:
        engine.close()
    assert op is not None
    assert (op.module, op.op, op.layer, op.rank, op.op_class) == (DOWN_PROJ_0, "aten.mm.default", 0, 1, "matmul")
    assert op.inputs_equal is True


def test_the_localized_op_round_trips_its_rank() -> None:
    op = LocalizedOp(DOWN_PROJ_0, ALL_REDUCE, 0, 1, 1, (12,), (3, 64), 64, 1e-7, True, op_class="communication",
                     rank=1)
    data = op.to_json()
    assert data["rank"] == 1 and LocalizedOp.from_json(data) == op
    as_report_reads = TypeAdapter(LocalizedOp)
    assert as_report_reads.validate_python(data) == op
    old = {k: v for k, v in data.items() if k != "rank"}  # a report written before ranks were recorded
    assert LocalizedOp.from_json(old).rank is None and as_report_reads.validate_python(old).rank is None


@pytest.mark.slow
def test_oracle_run_at_tp2_passes_invariance(tiny_qwen3: Path, tmp_path: Path) -> None:
    path = _run_config(tmp_path, tiny_qwen3, {"kind": "native", "options": {"tensor_parallel_size": 2},
                                              "num_threads": 1}, {"tp_parity": "report"}, shrink=False,
                       repeat_trials=1)
    assert main(["run", str(path), "--report-dir", str(tmp_path / "report")]) == 0
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    invariance = next(c for c in report["checks"] if c["name"] == "invariance")
    assert invariance["verdict"] == "pass" and not report["divergences"]
    posture = report["environment"]["posture"]["modes"]["invariant"]
    assert (posture["tensor_parallel"], posture["all_reduce"]) == (2, "gloo")
    # tp_parity: the same targets at TP 1, where o_proj and down_proj sum all of K in one matmul instead of two
    # halves added by the all-reduce: reported with the size of the difference, never a failed run
    parity = next(c for c in report["checks"] if c["name"] == "tp_parity")
    assert parity["requirement"] == "report" and parity["trials"] == 2 and parity["verdict"] in ("pass", "fail")
    assert parity["evidence"]["tensor_parallel_size"] == 2 and parity["evidence"]["compared_with"] == 1
    # on this host: 2 of 2 targets differ from step 0, by 5 and 39 ULP in the logprob, no token flipped
    assert all(d["ulp"] is None or d["ulp"] > 0 for d in parity["evidence"]["differing"])
    assert parity["divergent"] == len(parity["evidence"]["differing"])
    if parity["verdict"] == "fail":  # where the sizes part: the first row-parallel layer's reduction, confirmed
        op = parity["evidence"]["localized_op"]
        assert (op["module"], op["op"], op["layer"], op["op_class"]) == (
            "model.layers.0.self_attn.o_proj", "oracle_tp.all_reduce.default", 0, "communication"), op
        assert op["inputs_equal"] and op["confirmation"] == "confirmed", op["confirm_note"]
        assert op["depends_on"] == {"tensor_parallel_size": [1, 2]} and "first diverging op" in parity["message"]
        repro = subprocess.run([sys.executable, str(Path(op["repro"]) / "repro.py")], capture_output=True, text=True,
                               timeout=120)
        assert repro.returncode == 0, repro.stdout + repro.stderr  # 0: the two sizes' bits differ alone too
        assert "TP 1 alone gives the engine's bits" in repro.stdout and "TP 2 alone gives" in repro.stdout


@pytest.mark.slow
def test_oracle_run_catches_shrinks_and_localizes_the_planted_all_reduce(
        tiny_qwen3: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    engine = {"kind": "planted_tp:PlantedTPEngine",
              "options": {"fault": "all_reduce", "fault_module": DOWN_PROJ_0, "fault_rank": 1,
                          "tensor_parallel_size": 2, "num_threads": 1}}
    path = _run_config(tmp_path, tiny_qwen3, engine, shrink=True)
    assert main(["run", str(path), "--report-dir", str(tmp_path / "report")]) == 1  # invariance fails
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    found = [d for d in report["divergences"] if d["check"] == "invariance"]
    assert found
    shrunk = [d for d in found if d["evidence"].get("shrunk")]
    assert shrunk, "the failing trial is shrunk"
    small = shrunk[0]["trial"]
    parent = next(d["trial"] for d in found if d["trial_id"] == small["parent"])

    def size(trial: dict[str, Any]) -> int:  # what the shrinker reduces: fillers, their lengths and outputs
        return sum(1 + f["length"] + f["max_tokens"] for f in trial["fillers"])

    assert small["origin"] == "shrink" and size(small) < size(parent)
    located = [d["localized_op"] for d in found if d.get("localized_op")]
    assert located
    for op in located:
        assert (op["module"], op["op"], op["layer"], op["rank"]) == (DOWN_PROJ_0, ALL_REDUCE, 0, 1)
        assert op["op_class"] == "communication" and op["confirmation"] == "confirmed"
    assert f"first diverging op: {DOWN_PROJ_0} ({ALL_REDUCE}), layer 0, rank 1" in capsys.readouterr().out
