"""Run-to-run apart from batch variance on the native engine: a planted fault that fires in one forward pass of
every 7 (tests/support/planted.py `FlakyEngine`), whatever the batch, is reported as run-to-run nondeterminism
by invariance (its failing trials rechecked before the batch is blamed) and fails the repeatability check."""

from __future__ import annotations

from pathlib import Path

from oracle.config import parse_config
from oracle.runner import run


def test_a_planted_run_to_run_fault_is_run_to_run_not_the_batch(tiny_qwen3: Path, tmp_path: Path) -> None:
    report = run(parse_config({
        "model": str(tiny_qwen3),
        "engine": {"kind": "planted:FlakyEngine", "device": "cpu", "options": {"period": 7}},
        "prompts": {"random": {"count": 3, "min_len": 4, "max_len": 8}},
        "sampling": {"max_tokens": 4},
        "schedule": {"trials": 6, "seed": 7, "batch_size": [1, 4], "repeat_trials": 2},
        "checks": {"invariance": {"requirement": "required", "localize": "off"}, "repeatability": "required",
                   "fidelity": "off", "drift": "off", "negative_control": "off", "prefill_decode": "off",
                   "prefix_cache": "off"},
        "report_dir": str(tmp_path / "report"),
    }))
    checks = {c.name: c for c in report.checks}
    assert checks["repeatability"].verdict == "fail"
    assert "run-to-run nondeterminism" in checks["repeatability"].message
    invariance = [d for d in report.divergences if d.check == "invariance"]
    assert checks["invariance"].verdict == "fail" and invariance
    assert {d.cause for d in invariance} == {"nondeterminism"}
    assert "run-to-run nondeterminism, not batch variance" in checks["invariance"].message
