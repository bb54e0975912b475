"""Invariant mode's coverage by op class: an op known to follow the batch that nothing pins keeps invariance from
passing and takes the blame for its divergences, and the line names it (oracle.op_coverage)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from oracle.cli import main
from oracle.config import parse_config
from oracle.engines.vllm_coverage import coverage
from oracle.op_coverage import coverage_of, uncovered
from oracle.render.markdown import render_markdown
from oracle.report_sections import PostureRecord
from oracle.runner import run


def _config(model: Path, tmp_path: Path, **options: Any) -> dict[str, Any]:
    return {
        "model": str(model), "engine": {"kind": "coverage_engine:CoverageEngine", "options": options},
        "prompts": {"random": {"count": 3, "min_len": 2, "max_len": 5}}, "sampling": {"max_tokens": 4},
        "schedule": {"trials": 10, "seed": 3, "batch_size": [1, 8], "repeat_trials": 1},
        "checks": {"negative_control": "off", "drift": "off"},
        "report_dir": str(tmp_path / "report"),
    }


def _invariance(report: Any) -> Any:
    return next(c for c in report.checks if c.name == "invariance")


def test_unpinned_attention_never_passes_and_the_line_names_the_op(fake_model: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(_config(fake_model, tmp_path)))
    assert main(["run", str(path)]) == 1  # every trial bitwise equal, yet the required check cannot pass
    written = json.loads((tmp_path / "report" / "report.json").read_text())
    inv = next(c for c in written["checks"] if c["name"] == "invariance")
    assert inv["verdict"] == "vacuous"
    assert inv["message"].startswith("invariant mode does not cover attention (vLLM TRITON_ATTN")
    assert inv["evidence"]["uncovered_ops"]["attention"]["status"] == "uncovered"
    assert set(written["environment"]["posture"]["coverage"]) == {"invariant"}
    out = capsys.readouterr().out
    assert "invariant mode runs: matmul oracle_kernels" in out and "attention UNCOVERED vLLM TRITON_ATTN" in out


def test_a_divergence_where_attention_is_uncovered_is_blamed_on_the_mode(fake_model: Path, tmp_path: Path) -> None:
    report = run(parse_config(_config(fake_model, tmp_path, diverge_from_batch=2)))
    inv = _invariance(report)
    assert inv.verdict == "vacuous" and inv.divergent > 0
    assert "diverged, blamed on the mode, not the engine" in inv.message
    divs = [d for d in report.divergences if d.check == "invariance"]
    assert divs and {d.cause for d in divs} == {"kernels"}
    assert "attention UNCOVERED" in render_markdown(report)


def test_pinned_attention_is_covered_and_invariance_can_pass(fake_model: Path, tmp_path: Path) -> None:
    report = run(parse_config(_config(fake_model, tmp_path, pinned=True)))
    assert _invariance(report).verdict == "pass"
    assert report.posture is not None
    ops = report.posture.coverage["invariant"]
    assert ops["attention"].status == "covered" and "pinned by oracle's plugin" in ops["attention"].by
    assert not uncovered(report.posture)


def test_pinned_attention_still_fails_on_a_real_divergence(fake_model: Path, tmp_path: Path) -> None:
    report = run(parse_config(_config(fake_model, tmp_path, pinned=True, diverge_from_batch=2)))
    assert _invariance(report).verdict == "fail"
    assert {d.cause for d in report.divergences if d.check == "invariance"} != {"kernels"}


def test_an_engine_that_reports_no_coverage_writes_none(fake_model: Path, tmp_path: Path) -> None:
    cfg = _config(fake_model, tmp_path)
    cfg["engine"] = {"kind": "fake_engine:FakeEngine"}
    run(parse_config(cfg))
    written = json.loads((tmp_path / "report" / "report.json").read_text())
    assert "coverage" not in written["environment"]["posture"]  # reports of such engines are as before


_CUDA = {"device": "cuda", "compile_mode": "none (eager)", "sampler": "pytorch", "all_reduce": "none", "env": {}}


def _rank(**extra: Any) -> dict[str, Any]:
    return {"rank": 0, "attention_backend": "TRITON_ATTN", "attention_pinned": True,
            "ops": {"opaque": []}, **extra}


@pytest.mark.parametrize(("posture", "rank", "op", "by"), [
    ({"compile_mode": "CompilationMode.VLLM_COMPILE"}, {}, "matmul", "torch.compile graph"),
    ({}, {"ops": {"opaque": ["_C::fused_add_rms_norm"]}}, "norm", "_C::fused_add_rms_norm"),
    ({}, {"attention_backend": "FLASH_ATTN"}, "attention", "vLLM FLASH_ATTN"),
    ({}, {"attention_pinned": False}, "attention", "vLLM TRITON_ATTN"),
    ({"sampler": "flashinfer (top-k/top-p)"}, {}, "sampler", "flashinfer"),
    ({"all_reduce": "custom all-reduce, then torch.distributed (NCCL)"}, {}, "all_reduce", "custom all-reduce"),
])
def test_vllm_ops_known_to_follow_the_batch_are_uncovered(posture: dict[str, Any], rank: dict[str, Any], op: str,
                                                          by: str) -> None:
    found = coverage("oracle_kernels", {**_CUDA, **posture}, [_rank(**rank)])
    assert found[op]["status"] == "uncovered" and by in found[op]["by"] and found[op]["why"]
    assert [o for o, c in found.items() if c["status"] == "uncovered"] == [op]


def test_vllm_eager_triton_pinned_on_cuda_is_covered_or_unclaimed() -> None:
    found = coverage("oracle_kernels", _CUDA, [_rank()])
    assert {o: c["status"] for o, c in found.items()} == {
        "matmul": "covered", "norm": "covered", "attention": "covered", "sampler": "unclaimed",
        "all_reduce": "covered"}


def test_vllm_cpu_without_kv_split_and_its_own_mode() -> None:
    cpu = {**_CUDA, "device": "cpu", "env": {"VLLM_CPU_ATTN_SPLIT_KV": "0"}}
    found = coverage("oracle_kernels", cpu, [_rank(attention_backend="CPU_ATTN", attention_pinned=None,
                                                    ops={"opaque": ["_C::rms_norm"]})])
    assert not [o for o, c in found.items() if c["status"] == "uncovered"]
    assert found["attention"]["status"] == "covered"
    assert all(c["status"] == "covered" for c in coverage("vllm", _CUDA, [_rank(attention_pinned=False)]).values())
    assert coverage("none", _CUDA, [_rank()]) == {}


def test_a_coverage_entry_that_does_not_read_is_uncovered() -> None:
    read = coverage_of({"coverage": {"attention": "ours, trust me", "matmul": {"status": "covered", "by": "x"}}})
    assert read["attention"].status == "uncovered" and read["matmul"].status == "covered"
    record = PostureRecord(modes={}, digest="0" * 16, coverage={"invariant": read})
    assert list(uncovered(record)) == ["attention"]
    assert PostureRecord.model_validate(record.model_dump()).coverage == record.coverage


def test_oracle_kernels_ask_vllm_for_decode_graphs_up_to_max_num_seqs() -> None:
    """Above vLLM's default largest graph (512 sequences) a decode step would run eagerly, with no compiled code
    in its place; the mode asks for graphs up to max_num_seqs there, and leaves a user's sizes and eager alone."""
    from oracle.engines.vllm_coverage import oracle_kernels_args

    def capture(args: dict[str, Any], eager: bool = False, seqs: int | None = 1024) -> Any:
        return oracle_kernels_args(args, eager, seqs)["compilation_config"].get("max_cudagraph_capture_size")

    assert capture({}) == 1024
    assert capture({}, seqs=1000) == 1008 and capture({}, seqs=520) == 528  # on vLLM's grid of 16 above 256
    assert capture({"max_num_seqs": 600}, seqs=64) == 608  # engine_args' max_num_seqs wins, as in the worker
    assert capture({}, seqs=512) is None and capture({}, seqs=None) is None  # vLLM's default covers it
    assert capture({}, eager=True) is None
    assert capture({"compilation_config": {"max_cudagraph_capture_size": 64}}) == 64
    given = oracle_kernels_args({"compilation_config": {"cudagraph_capture_sizes": [1, 2]}}, False, 1024)
    assert "max_cudagraph_capture_size" not in given["compilation_config"]
