"""prefix_cache's runs: per target one run to cache the prompt's blocks (one token) and the warm run; its cold
run is the reference the run already made (alone, from an emptied cache), not made again."""

from __future__ import annotations

from pathlib import Path

import pytest
from recording_engine import RecordingEngine

from oracle.config import parse_config
from oracle.runner import run


def test_the_cold_run_is_the_reference_not_a_second_run(tiny_qwen3: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORACLE_OVERLAP", "0")  # both modes in this process, one after the other
    monkeypatch.setattr(RecordingEngine, "requests", [])
    config = parse_config({
        "model": str(tiny_qwen3),
        "engine": {"kind": "recording_engine:RecordingEngine", "options": {"enable_prefix_caching": True}},
        "prompts": {"random": {"count": 3, "min_len": 20, "max_len": 40, "seed": 0}},
        "sampling": {"max_tokens": 4, "logits": "full"},
        "schedule": {"trials": 2, "batch_size": [1, 2], "repeat_trials": 0, "shrink": False},
        "checks": {"fidelity": "off", "drift": "off", "negative_control": "off", "prefill_decode": "off",
                   "repeatability": "off", "prefix_cache": "required"},
    })
    report = run(config, seed=1, report_dir=tmp_path / "report")
    check = report.check("prefix_cache")
    assert check is not None and check.verdict == "pass", check
    assert check.evidence["warm_runs_with_cache_hits"] == 3 and check.evidence["cold_runs_with_cache_hits"] == 0
    prefix = [(rid, n) for mode, rid, n in RecordingEngine.requests if mode == "invariant" and rid.startswith("prefix-")]
    # the targets by their references' ids (solo-NAME), in the order the references ran
    names = list(dict.fromkeys(rid.removeprefix("solo-") for mode, rid, _ in RecordingEngine.requests
                               if mode == "invariant" and rid.startswith("solo-")))
    assert len(names) == 3
    assert prefix == [x for name in names for x in ((f"prefix-{name}-warmup", 1), (f"prefix-{name}", 4))]
