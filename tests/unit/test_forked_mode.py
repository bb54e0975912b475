"""Production mode in a fork of the run's process while invariant mode runs (oracle.forked_mode), on the native
engine on the CPU: the report is byte for byte a sequential run's but for its timings, a fault in the fork still
ends in a report that names production mode, and only configs that may fork do."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from oracle import device
from oracle.config import EngineConfig, parse_config
from oracle.engines import kinds
from oracle.overlap import ENV
from oracle.render.timings import timing_line
from oracle.runner import run


@pytest.fixture(autouse=True)
def _two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule asks for cores for both modes: this machine's count must not decide whether the test forks."""
    monkeypatch.setattr(device, "cores", lambda: 2)


def _config(model: Path, out: Path, **checks: Any) -> dict[str, Any]:
    return {
        "model": str(model),
        "engine": {"kind": "native", "device": "cpu", "dtype": "float32", "max_num_seqs": 16,
                   "max_num_batched_tokens": 64, "num_threads": 1},
        "prompts": {"random": {"count": 3, "min_len": 4, "max_len": 12, "seed": 0}},
        "sampling": {"max_tokens": 4, "logits": "full"},
        "schedule": {"trials": 10, "seed": 5, "batch_size": [1, 6], "max_num_batched_tokens": [16, 64],
                     "repeat_trials": 2},
        "checks": {"prefill_decode": "warn", "prefix_cache": "warn", **checks},
        "report_dir": str(out),
    }


def _report(out: Path) -> dict[str, Any]:
    return json.loads((out / "report.json").read_text())


def _without_timings(out: Path) -> str:
    report = _report(out)
    report.pop("timings")
    return json.dumps(report, sort_keys=True)


def test_forked_report_equals_the_sequential_one(tiny_qwen3: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Byte for byte, timings aside, on the native engine (production drifts: divergences in both reports)."""
    out = tmp_path / "r"  # one folder: the config (and so the report) names it
    monkeypatch.setenv(ENV, "0")
    sequential = run(parse_config(_config(tiny_qwen3, out)))
    seq = _without_timings(out)
    assert "production_wait_s" not in sequential.timings
    monkeypatch.setenv(ENV, "1")
    report = run(parse_config(_config(tiny_qwen3, out)))
    assert "production_wait_s" in report.timings and "overlap_s" in report.timings  # it did fork
    assert _without_timings(out) == seq
    assert report.exit_code() == sequential.exit_code() == 0
    assert _report(out)["environment"]["engines"]["production"]["engine"] == "native"
    line = timing_line(report.timings)
    assert line is not None and "production (beside invariant" in line and "wall clock" in line


def test_fault_in_the_fork_names_production(tiny_qwen3: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Production's engine raising in the fork: invariant mode completes and is judged, the report says
    production failed (exit 3), the same report as a sequential run's."""
    row = kinds.BUILTIN["native"]

    def build(cfg: EngineConfig, model_dir: Path, mode: Any) -> Any:
        engine = row.build(cfg, model_dir, mode)
        if mode == "production":
            calls = [0]
            generate = engine.generate

            def failing(*args: Any, **kwargs: Any) -> Any:
                calls[0] += 1
                if calls[0] > 5:
                    raise RuntimeError("planted production failure")
                return generate(*args, **kwargs)

            engine.generate = failing
        return engine

    monkeypatch.setitem(kinds.BUILTIN, "native", dataclasses.replace(row, build=build))
    seen = []
    for value in ("0", "1"):
        monkeypatch.setenv(ENV, value)
        report = run(parse_config(_config(tiny_qwen3, tmp_path / "r")))
        seen.append(_without_timings(tmp_path / "r"))
    assert "production_wait_s" in report.timings
    assert report.exit_code() == 3 and "planted production failure" in (report.error or "")
    assert report.check("invariance").verdict == "pass"  # type: ignore[union-attr]
    assert seen[0] == seen[1]


def test_a_fork_that_dies_is_an_engine_error_naming_production(tiny_qwen3: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    row, here = kinds.BUILTIN["native"], os.getpid()

    def build(cfg: EngineConfig, model_dir: Path, mode: Any) -> Any:
        if mode == "production":
            if os.getpid() == here:
                raise AssertionError("production mode did not run in a fork")
            os.kill(os.getpid(), signal.SIGKILL)
        return row.build(cfg, model_dir, mode)

    monkeypatch.setitem(kinds.BUILTIN, "native", dataclasses.replace(row, build=build))
    monkeypatch.delenv(ENV, raising=False)
    report = run(parse_config(_config(tiny_qwen3, tmp_path / "r")))
    assert report.exit_code() == 3
    assert report.error is not None and "production mode's process" in report.error and "SIGKILL" in report.error
    assert report.check("invariance").verdict == "pass"  # type: ignore[union-attr]


def test_only_configs_that_may_fork_do(tiny_qwen3: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads unset (torch's own count), more threads than half the cores, drift localized (the run's one
    repro), turned off: a sequential run."""
    monkeypatch.delenv(ENV, raising=False)
    row = kinds.BUILTIN["native"]
    assert row.forks_beside(EngineConfig.model_validate({"kind": "native", "num_threads": 1}))
    assert not row.forks_beside(EngineConfig.model_validate({"kind": "native"}))
    assert not row.forks_beside(EngineConfig.model_validate({"kind": "native", "num_threads": 2}))
    assert not row.forks_beside(EngineConfig.model_validate(
        {"kind": "native", "num_threads": 1, "options": {"tensor_parallel_size": 2}}))
    for name in ("vllm", "transformers", "openai"):
        assert not kinds.BUILTIN[name].forks_beside(EngineConfig.model_validate({"kind": name, "num_threads": 1}))
    cfg = _config(tiny_qwen3, tmp_path / "r", drift={"requirement": "report", "localize": "first"})
    assert "production_wait_s" not in run(parse_config(cfg)).timings
    monkeypatch.setenv(ENV, "0")
    assert "production_wait_s" not in run(parse_config(_config(tiny_qwen3, tmp_path / "r"))).timings
