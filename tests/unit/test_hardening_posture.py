"""Posture read from odd describe() shapes or garbage vLLM engine_args reads `unknown`, never an exception."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from oracle.config import EngineConfig, parse_config
from oracle.engines.kinds import declared_posture
from oracle.posture import UNKNOWN, report_posture
from oracle.posture.hazards import match_hazards
from oracle.runner import run

ODD = '''
from fake_engine import FakeEngine


class OddEngine(FakeEngine):
    def describe(self):
        return {"engine": "vllm", "engine_version": ["0", "26"], "tensor_parallel": "two",
                "env": {1: "a", "B": ["c"], None: 2}, "posture": {"cuda_graphs": {"x": 1}, "dtype": {"a": [1]}}}
'''


def test_a_custom_engine_of_odd_describe_shapes_runs_to_a_report(fake_model: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "odd_engine.py").write_text(ODD)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = parse_config({"model": str(fake_model), "engine": {"kind": "odd_engine:OddEngine"},
                           "prompts": {"random": {"count": 2, "min_len": 2, "max_len": 4}},
                           "sampling": {"max_tokens": 2}, "schedule": {"trials": 2, "seed": 1}})
    report = run(config, report_dir=tmp_path / "r")
    assert report.complete and report.error is None, report.error
    assert report.posture is not None
    posture = report.posture.modes["invariant"]
    assert posture.engine_version == UNKNOWN and posture.tensor_parallel == UNKNOWN
    assert posture.cuda_graphs == UNKNOWN and posture.dtype == UNKNOWN
    assert posture.env == {"1": "a", "B": "['c']", "None": 2}
    report.to_json()


@pytest.mark.parametrize("args", [
    {"tensor_parallel_size": "two"}, {"tensor_parallel_size": [2], "pipeline_parallel_size": {}},
    {"compilation_config": "O3"}, {"compilation_config": {"pass_config": [1]}}, {"attention_backend": ["FA3"]},
])
def test_garbage_vllm_engine_args_read_unknown(args: dict[str, Any]) -> None:
    posture = declared_posture(EngineConfig.of("vllm", engine_args=args), "invariant")  # type: ignore[arg-type]
    match_hazards(posture, {}, {"temperature": 0.0, "max_tokens": 4})
    report_posture({"invariant": posture})
    if "tensor_parallel_size" in args:
        assert posture["tensor_parallel"] == UNKNOWN and posture["all_reduce"] == UNKNOWN
    if "attention_backend" in args:
        assert posture["attention_backend"] == UNKNOWN


def test_a_count_given_as_text_is_read_as_a_count() -> None:
    posture = report_posture({"invariant": {"engine": "x", "tensor_parallel": "2"}}).modes["invariant"]
    assert posture.tensor_parallel == 2
