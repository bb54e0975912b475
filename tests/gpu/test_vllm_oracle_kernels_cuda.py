"""vLLM on one CUDA GPU with `invariance: oracle_kernels` (configs/vllm-gpu-oracle-kernels.yaml): the claim is whole
(every class of ops covered, attention by vLLM's Triton kernel pinned by oracle's plugin), invariance passes, and
a setting that leaves an op to a kernel known to follow the batch keeps invariance from passing, naming the op.

Needs a CUDA device and vLLM installed with oracle (its plugin is found through the entry point):
`pytest -m gpu tests/gpu/test_vllm_oracle_kernels_cuda.py`.

Not yet run on a GPU as written: the shipped config's eager run passed on an H100 (vLLM 0.26.0,
docs/results/h100-vllm-0.26-oracle-kernels.md); these three cases (full decode graphs, FLASH_ATTN left
unpinned, a compiled graph) are waiting for a GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
pytest.importorskip("vllm")

from oracle.config import parse_config  # noqa: E402
from oracle.runner import run  # noqa: E402

CONFIG = Path(__file__).parents[2] / "configs" / "vllm-gpu-oracle-kernels.yaml"


def _run(model: Path, out: Path, trials: int, eager: bool = False, **engine_args: Any) -> Any:
    raw = yaml.safe_load(CONFIG.read_text())
    raw["model"] = str(model)
    raw["engine"]["options"]["enforce_eager"] = eager
    raw["schedule"]["trials"] = trials
    raw["checks"].update(fidelity="off", drift="off", negative_control="off")
    raw["engine"]["options"]["engine_args"] = engine_args
    return run(parse_config(raw), report_dir=out)


def _check(report: Any, name: str) -> Any:
    return next(c for c in report.checks if c.name == name)


def test_oracle_kernels_cover_every_op_and_invariance_passes(small_qwen3: Path, tmp_path: Path) -> None:
    report = _run(small_qwen3, tmp_path / "r", trials=16)
    coverage = report.posture.coverage["invariant"]
    assert {op: c.status for op, c in coverage.items() if c.status == "uncovered"} == {}
    assert coverage["attention"].status == "covered" and "TRITON_ATTN" in coverage["attention"].by
    assert coverage["matmul"].status == "covered" and coverage["norm"].status == "covered"
    inv = report.posture.modes["invariant"]
    assert "FULL" in str(inv.cuda_graphs) and inv.attention_backend == "TRITON_ATTN"
    ranks = report.environment["engines"]["invariant"]["ranks"]
    assert all(r["attention_pinned"] is True and r["kernels"] for r in ranks)
    assert all("aten::mm" in r["ops"]["batch_variant_covered"] for r in ranks)
    result = _check(report, "invariance")
    assert result.verdict == "pass", result.message
    assert _check(report, "repeatability").verdict == "pass"


def test_an_unpinned_attention_backend_keeps_invariance_from_passing(small_qwen3: Path, tmp_path: Path) -> None:
    report = _run(small_qwen3, tmp_path / "r", trials=6, eager=True, attention_backend="FLASH_ATTN")
    assert report.posture.coverage["invariant"]["attention"].status == "uncovered"
    result = _check(report, "invariance")
    assert result.verdict == "vacuous" and "does not cover attention (vLLM FLASH_ATTN" in result.message
    assert all(d.cause == "kernels" for d in report.divergences if d.check == "invariance")


def test_a_compiled_graph_is_not_taken_for_our_matmuls(small_qwen3: Path, tmp_path: Path) -> None:
    report = _run(small_qwen3, tmp_path / "r", trials=4, compilation_config={"mode": 3})
    assert report.posture.coverage["invariant"]["matmul"].status == "uncovered"
    assert _check(report, "invariance").verdict == "vacuous"
