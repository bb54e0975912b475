"""`oracle record` writes a golden file; the golden check passes on the same outputs and fails, naming
the target and step, when the references change."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from oracle.cli import main
from oracle.config import parse_config
from oracle.runner import run


def _config(model: Path, tmp_path: Path, golden: Path, **options: Any) -> dict[str, Any]:
    return {
        "model": str(model),
        "engine": {"kind": "fake_engine:FakeEngine", "options": options},
        "prompts": {"random": {"count": 3, "min_len": 2, "max_len": 5}},
        "sampling": {"max_tokens": 4},
        "schedule": {"trials": 6, "seed": 2, "batch_size": [1, 4], "repeat_trials": 1},
        "checks": {"golden": {"requirement": "required", "file": str(golden)}, "prefill_decode": "off"},
        "report_dir": str(tmp_path / "report"),
    }


def test_record_then_check(fake_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    golden = tmp_path / "golden.json"
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(_config(fake_model, tmp_path, golden)))
    assert main(["record", str(cfg_path), "--golden", str(golden)]) == 0
    data = json.loads(golden.read_text())
    assert data["format"] == "oracle-golden/1" and len(data["targets"]) == 3
    assert "torch" in data["environment"]

    same = run(parse_config(_config(fake_model, tmp_path, golden)))
    check = same.check("golden")
    assert check is not None and check.verdict == "pass" and check.trials == 3

    # Solo outputs perturbed from step 1 on (a batch of one counts): every target differs there.
    changed = run(parse_config(_config(fake_model, tmp_path, golden, diverge_from_batch=1, diverge_step=1)))
    check = changed.check("golden")
    assert check is not None and check.verdict == "fail" and changed.exit_code() == 1
    diffs = check.evidence["differing"]
    assert len(diffs) == 3 and all(d["step"] == 1 and d["tokens_differ"] is False for d in diffs)


def test_missing_golden_file_is_a_config_error(fake_model: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(_config(fake_model, tmp_path, tmp_path / "none.json")))
    assert main(["run", str(cfg_path)]) == 2
    assert "checks.golden.file" in capsys.readouterr().err
