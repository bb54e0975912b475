"""`oracle run` on a planted one-op fault: the failing invariance trial is localized to that op."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from oracle.cli import main
from oracle.localize import localize_from_report

DOWN_PROJ = "model.layers.1.mlp.down_proj"


@pytest.fixture(scope="module")
def failing_report(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose every batched trial trips the fault: prompts of 8-20 tokens, fillers of 10+, fault above 24."""
    root = tmp_path_factory.mktemp("planted-run")
    config: dict[str, Any] = {
        "model": str(tiny_qwen3),
        "engine": {"kind": "planted:PlantedEngine",
                   "options": {"fault_module": DOWN_PROJ, "min_tokens": 24, "num_threads": 1,
                               "max_num_batched_tokens": 256}},
        "prompts": {"random": {"count": 2, "min_len": 8, "max_len": 20, "seed": 0}},
        "sampling": {"max_tokens": 3, "logits": "full"},
        "schedule": {"trials": 4, "seed": 1, "batch_size": [3, 5], "filler_len": [10, 30],
                     "filler_max_tokens": [1, 3], "repeat_trials": 0, "shrink": False},
        "checks": {"fidelity": "off", "drift": "off", "negative_control": "off", "prefill_decode": "off",
                   "prefix_cache": "off"},
    }
    path = root / "planted.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["run", str(path), "--report-dir", str(root / "report")]) == 1  # invariance fails
    return root / "report" / "report.json"


def invariance_divergences(report_path: Path) -> list[dict[str, Any]]:
    report = json.loads(report_path.read_text())
    return [d for d in report["divergences"] if d["check"] == "invariance"]


def test_localize_from_report_names_the_planted_op(failing_report: Path) -> None:
    divergence = invariance_divergences(failing_report)[0]
    loc = localize_from_report(failing_report, divergence["trial_id"], trusted=True)
    assert loc is not None
    assert (loc.module, loc.op, loc.layer) == (DOWN_PROJ, "aten.mm.default", 1)
    assert loc.inputs_equal is True and loc.still_diverged
    assert loc.pass_evidence["num_tokens"] > 24


def test_report_divergence_carries_the_localized_op(failing_report: Path) -> None:
    divergence = invariance_divergences(failing_report)[0]
    localized = divergence["localized_op"]
    assert localized["module"] == DOWN_PROJ
    assert localized["op"] == "aten.mm.default" and localized["layer"] == 1


def test_localize_command_names_the_op(failing_report: Path, capsys: pytest.CaptureFixture[str]) -> None:
    divergence = invariance_divergences(failing_report)[0]
    assert main(["localize", str(failing_report), "--trial", str(divergence["trial_id"]), "--trust-report"]) == 1
    out = capsys.readouterr().out
    assert DOWN_PROJ in out and "aten.mm.default" in out


def test_a_key_cache_write_fault_is_named_as_the_write_in_every_failing_trial(
        tiny_qwen3: Path, tmp_path: Path) -> None:
    """`localize: all` over a run whose fault is layer 0's key-cache write (`index_put_`) in every pass above 24
    tokens: prefills and one-token decodes beside others alike. Every failing trial names the write."""
    config: dict[str, Any] = {
        "model": str(tiny_qwen3),
        "engine": {"kind": "planted:PlantedEngine",
                   "options": {"fault_module": "model.layers.0.self_attn", "fault_op": "aten.index_put_.default",
                               "min_tokens": 20, "num_threads": 1, "max_num_batched_tokens": 256}},
        "prompts": {"random": {"count": 2, "min_len": 8, "max_len": 16, "seed": 0}},
        "sampling": {"max_tokens": 6, "logits": "full"},
        "schedule": {"trials": 10, "seed": 3, "batch_size": [2, 4], "filler_len": [16, 40],
                     "filler_max_tokens": [1, 4], "arrival_step": [0, 3], "repeat_trials": 0, "shrink": False},
        "checks": {"invariance": {"requirement": "required", "localize": "all"}, "fidelity": "off", "drift": "off",
                   "negative_control": "off", "prefill_decode": "off", "prefix_cache": "off"},
    }
    path = tmp_path / "kv.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["run", str(path), "--report-dir", str(tmp_path / "report")]) == 1
    divergences = invariance_divergences(tmp_path / "report" / "report.json")
    assert divergences
    decodes = 0
    for d in divergences:
        loc = d["localized_op"]
        assert loc is not None, d["trial_id"]
        assert (loc["module"], loc["op"], loc["kind"], loc["status"]) == (
            "model.layers.0.self_attn", "aten.index_put_.default", "kv_write", "localized"), (d["trial_id"], loc)
        decodes += not loc["pass_evidence"]["target_is_prefill"]
    assert decodes, "no failing trial put the fault in a one-token decode pass"


def test_the_runs_repro_exits_as_its_confirmation_says(failing_report: Path) -> None:
    """The planted fault lives in the pass (a dispatch layer), not in aten.mm: confirmation says
    `not reproduced alone`, and the report folder's repro.py, run as a kernel engineer would, exits 1."""
    import subprocess
    import sys

    localized = [d["localized_op"] for d in invariance_divergences(failing_report) if d.get("localized_op")]
    with_repro = [loc for loc in localized if loc.get("repro")]
    assert with_repro, localized
    loc = with_repro[0]
    assert loc["confirmation"] == "not reproduced alone", loc["confirm_note"]
    done = subprocess.run([sys.executable, str(Path(loc["repro"]) / "repro.py")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1, (done.stdout, done.stderr)


def test_the_report_says_where_localizing_went(failing_report: Path) -> None:
    """TimesItsLocalize: the native engine's parts of each localization, summed per mode, inside the whole."""
    timings = json.loads(failing_report.read_text())["timings"]
    parts = {p: timings.get(f"invariant_localize_{p}_s") for p in ("capture", "rule", "confirm", "repro")}
    assert all(isinstance(v, float) and v >= 0 for v in parts.values()), parts
    assert parts["capture"] > 0 and parts["confirm"] > 0  # both runs captured, then again to confirm
    assert sum(parts.values()) <= timings["invariant_localize_s"] + 0.01
