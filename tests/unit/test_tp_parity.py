"""tp_parity: invariant mode's references at two tensor-parallel sizes, reported with the size of their
difference; off by default, reported (not required) when on, a config error for engines without ranks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from oracle.config import parse_config
from oracle.errors import ConfigError
from oracle.render.files import write_formats
from oracle.runner import run
from oracle.shards.merge import merge


def _config(model: Path, report_dir: Path, tp_parity: Any = "report", **options: Any) -> dict[str, Any]:
    return {
        "model": str(model),
        "engine": {"kind": "tp_engine:TpEngine", "options": {"tensor_parallel_size": 2, **options}},
        "prompts": {"random": {"count": 3, "min_len": 2, "max_len": 5}},
        "sampling": {"max_tokens": 4},
        "schedule": {"trials": 6, "seed": 7, "batch_size": [1, 4]},
        "checks": {"tp_parity": tp_parity},
        "report_dir": str(report_dir),
    }


def test_off_by_default(fake_model: Path, tmp_path: Path) -> None:
    data = _config(fake_model, tmp_path / "r")
    del data["checks"]
    report = run(parse_config(data))
    assert report.check("tp_parity") is None
    assert "tp_parity_s" not in json.dumps(report.timings)


def test_a_difference_between_sizes_is_reported_with_its_size_and_does_not_fail_the_run(
        fake_model: Path, tmp_path: Path) -> None:
    report = run(parse_config(_config(fake_model, tmp_path / "r")))
    check = report.check("tp_parity")
    assert check is not None and check.verdict == "fail" and check.requirement == "report"
    assert check.trials == 3 and check.divergent == 3
    ev = check.evidence
    assert ev["tensor_parallel_size"] == 2 and ev["compared_with"] == 1 and ev["targets"] == 3
    assert all(d["step"] == 1 and d["kind"] == "logprob" and d["ulp"] == 6 for d in ev["differing"])
    assert ev["max_ulp"] == 6 and ev["token_flips"] == 0 and 0 < ev["max_abs_logprob_diff"] < 1e-5
    assert "3 of 3 targets differ between TP 2 and TP 1" in check.message and "6 ULP" in check.message
    assert report.check("invariance").verdict == "pass"  # type: ignore[union-attr]
    assert report.exit_code() == 0  # reported, never required unless asked


def test_required_makes_a_difference_fail_the_run(fake_model: Path, tmp_path: Path) -> None:
    report = run(parse_config(_config(fake_model, tmp_path / "r", tp_parity="required", tp_flip=True)))
    check = report.check("tp_parity")
    assert check is not None and check.verdict == "fail" and report.exit_code() == 1
    assert check.evidence["token_flips"] == 3 and "tokens differ in 3" in check.message


def test_sizes_that_agree_bitwise_pass(fake_model: Path, tmp_path: Path) -> None:
    report = run(parse_config(_config(fake_model, tmp_path / "r", tp_exact=True)))
    check = report.check("tp_parity")
    assert check is not None and check.verdict == "pass", check.message
    assert check.message == "3 targets bitwise equal at TP 2 and TP 1"


def test_the_same_size_twice_is_vacuous_not_a_pass(fake_model: Path, tmp_path: Path) -> None:
    data = _config(fake_model, tmp_path / "r", tensor_parallel_size=1)
    report = run(parse_config(data))
    check = report.check("tp_parity")
    assert check is not None and check.verdict == "vacuous"
    assert "the run itself is at tensor_parallel_size 1" in check.message


def test_the_other_size_is_the_checks_own(fake_model: Path, tmp_path: Path) -> None:
    report = run(parse_config(_config(fake_model, tmp_path / "r", tp_parity={"requirement": "report",
                                                                               "tensor_parallel_size": 4},
                                      tensor_parallel_size=1)))
    check = report.check("tp_parity")
    assert check is not None and check.verdict == "fail"
    assert check.evidence["tensor_parallel_size"] == 1 and check.evidence["compared_with"] == 4
    assert check.evidence["max_ulp"] == 12  # the fake moves 3 ULP a rank
    assert "between TP 1 and TP 4" in check.message


@pytest.mark.parametrize("kind", ["transformers", "openai"])
def test_an_engine_without_ranks_is_a_config_error_naming_the_check(fake_model: Path, tmp_path: Path,
                                                                    kind: str) -> None:
    data = _config(fake_model, tmp_path / "r")
    data["engine"] = {"kind": kind, "options": {"base_url": "http://127.0.0.1:9"} if kind == "openai" else {}}
    with pytest.raises(ConfigError, match=r"checks\.tp_parity: engine kind .* has no engine\.options\."
                                          r"tensor_parallel_size"):
        parse_config(data)


def test_shards_merge_to_the_unsharded_verdict(fake_model: Path, tmp_path: Path) -> None:
    data = _config(fake_model, tmp_path / "whole")
    whole = run(parse_config(data))
    folders = []
    for i in range(2):
        folders.append(tmp_path / f"shard-{i}")
        run(parse_config(data), report_dir=folders[-1], shard=(i, 2))
    merged = merge(folders, tmp_path / "merged", trusted=True, views=[write_formats])
    a, b = whole.check("tp_parity"), merged.check("tp_parity")
    assert a is not None and b is not None
    assert (b.verdict, b.message, b.evidence) == (a.verdict, a.message, a.evidence)


def test_the_second_size_starts_once_the_runs_own_engine_has_closed(fake_model: Path, tmp_path: Path) -> None:
    """Two engines of one model at once could need twice the memory (a GPU's): the engine at the check's size
    starts after invariant mode's own has closed, timed as its own phase."""
    from tp_engine import TpEngine

    TpEngine.live = TpEngine.most_live = 0
    report = run(parse_config(_config(fake_model, tmp_path / "r")))
    assert report.check("tp_parity").trials == 3  # type: ignore[union-attr]
    assert TpEngine.most_live == 1 and TpEngine.live == 0
    keys = list(report.timings)
    assert keys.index("invariant_close_s") < keys.index("invariant_tp_parity_s")
