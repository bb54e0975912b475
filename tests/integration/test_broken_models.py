"""Broken models on real engines (issue 17, class 2): NaN or Inf weights are refused when loaded, naming the
tensor (exit 2); weights that overflow while running give NaN outputs, an engine error (exit 3). Never a pass."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from oracle.cli import main


def _broken_copy(tiny_qwen3: Path, tmp_path: Path, name: str, value: float) -> Path:
    from safetensors.torch import load_file, save_file

    model = tmp_path / "model"
    shutil.copytree(tiny_qwen3, model)
    weights = load_file(str(model / "model.safetensors"))
    weights[name] = weights[name].clone()
    weights[name].view(-1)[5] = value
    save_file(weights, str(model / "model.safetensors"))
    return model


def _run(model: Path, tmp_path: Path, engine: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    cfg = {"model": str(model), "engine": engine, "prompts": {"random": {"count": 2, "min_len": 4, "max_len": 8}},
           "sampling": {"max_tokens": 4, "logits": "full"},
           "schedule": {"trials": 4, "seed": 3, "batch_size": [1, 4], "repeat_trials": 1, "shrink": False},
           "checks": {"prefill_decode": "off", "prefix_cache": "off"}, "report_dir": str(tmp_path / "report")}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    code = main(["run", str(path)])
    return code, json.loads((tmp_path / "report" / "report.json").read_text())


NATIVE = {"kind": "native", "device": "cpu", "dtype": "float32", "num_threads": 1}


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_native_refuses_non_finite_weights_naming_the_tensor(tiny_qwen3: Path, tmp_path: Path, value: float) -> None:
    model = _broken_copy(tiny_qwen3, tmp_path, "model.layers.1.mlp.down_proj.weight", value)
    code, report = _run(model, tmp_path, NATIVE)
    assert code == 2 and report["exit_code"] == 2 and report["complete"] is False
    assert "tensor model.layers.1.mlp.down_proj.weight holds 1 non-finite values" in report["error"]


def test_native_weights_that_overflow_while_running_are_an_engine_error(tiny_qwen3: Path, tmp_path: Path) -> None:
    """Finite weights (3e38, float32) whose products overflow: NaN logits in every run, bitwise equal to each
    other. Before: every check passed."""
    model = _broken_copy(tiny_qwen3, tmp_path, "model.layers.0.mlp.up_proj.weight", 3e38)
    code, report = _run(model, tmp_path, NATIVE)
    assert code == 3 and report["exit_code"] == 3 and report["complete"] is False
    assert "engine, request solo-" in report["error"] and "not a finite number" in report["error"]


def test_transformers_refuses_non_finite_weights(tiny_qwen3: Path, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    model = _broken_copy(tiny_qwen3, tmp_path, "model.layers.0.self_attn.q_proj.weight", float("nan"))
    code, report = _run(model, tmp_path, {"kind": "transformers", "device": "cpu", "dtype": "float32"})
    assert code == 2 and report["exit_code"] == 2
    assert "q_proj.weight holds 1 non-finite values (1 NaN" in report["error"]
