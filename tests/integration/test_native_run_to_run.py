"""Run-to-run apart from batch variance on the native engine: a planted fault that fires in one forward pass of
every 7 (tests/support/planted.py `FlakyEngine`), whatever the batch, is reported as run-to-run nondeterminism
by invariance (its failing trials rechecked before the batch is blamed) and fails the repeatability check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from oracle.config import parse_config
from oracle.report import Report
from oracle.runner import run


def _run(model: Path, tmp_path: Path, engine: dict[str, Any], sampling: dict[str, Any], batch_size: list[int]) -> Report:
    """Invariance (localize off) and repeatability required, every other check off."""
    return run(parse_config({
        "model": str(model), "engine": engine,
        "prompts": {"random": {"count": 3, "min_len": 4, "max_len": 8}},
        "sampling": sampling,
        "schedule": {"trials": 6, "seed": 7, "batch_size": batch_size, "repeat_trials": 2},
        "checks": {"invariance": {"requirement": "required", "localize": "off"}, "repeatability": "required",
                   "fidelity": "off", "drift": "off", "negative_control": "off", "prefill_decode": "off",
                   "prefix_cache": "off"},
        "report_dir": str(tmp_path / "report"),
    }))


def test_a_planted_run_to_run_fault_is_run_to_run_not_the_batch(tiny_qwen3: Path, tmp_path: Path) -> None:
    report = _run(tiny_qwen3, tmp_path, {"kind": "planted:FlakyEngine", "device": "cpu", "options": {"period": 7}},
                  {"max_tokens": 4}, [1, 4])
    checks = {c.name: c for c in report.checks}
    assert checks["repeatability"].verdict == "fail"
    assert "run-to-run nondeterminism" in checks["repeatability"].message
    invariance = [d for d in report.divergences if d.check == "invariance"]
    assert checks["invariance"].verdict == "fail" and invariance
    assert {d.cause for d in invariance} == {"nondeterminism"}
    assert "run-to-run nondeterminism, not batch variance" in checks["invariance"].message


def test_a_planted_sampler_fault_is_the_samplers(tiny_qwen3: Path, tmp_path: Path) -> None:
    # One generator for every seeded request of a call (tests/support/planted.py `SharedRngEngine`): in a batch the
    # target draws other noise from bitwise equal logits.
    report = _run(tiny_qwen3, tmp_path, {"kind": "planted:SharedRngEngine", "device": "cpu"},
                  {"max_tokens": 4, "temperature": 1.0, "seed": 3}, [2, 4])
    checks = {c.name: c for c in report.checks}
    invariance = [d for d in report.divergences if d.check == "invariance"]
    assert checks["invariance"].verdict == "fail" and invariance
    assert {d.cause for d in invariance} == {"sampling"}, [(d.cause, d.kind) for d in invariance]
    assert all(d.kind == "token" for d in invariance)
    assert "the sampler's (another token sampled from bitwise equal logits)" in checks["invariance"].message
    assert checks["repeatability"].verdict == "pass"  # the same call gives the same draws twice
