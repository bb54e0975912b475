"""Replaying or localizing a report re-runs its config: fields that would run code need --trust-report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from oracle.cli import main
from oracle.trust import code_loading_fields, replay_command


@pytest.mark.parametrize(("engine", "fields"), [
    ({"kind": "native"}, []),
    ({"kind": "openai", "options": {"base_url": "http://127.0.0.1:1"}}, []),
    ({"kind": "my_pkg.engine:Engine"}, ["engine.kind"]),
    ({"kind": "native", "preload": ["evil"]}, ["engine.preload"]),
    ({"kind": "openai", "options": {"command": ["sh", "-c", "x {host}"], "env": {"LD_PRELOAD": "x.so"}}},
     ["engine.options.command", "engine.options.env"]),
    ({"kind": "openai", "options": {"mode_env": {"invariant": {"PYTHONPATH": "/x"}}}}, ["engine.options.mode_env"]),
    ({"kind": "vllm", "options": {"engine_args": {"trust_remote_code": True, "worker_extension_cls": "a.B",
                                                  "max_num_seqs": 4}}},
     ["engine.options.engine_args.trust_remote_code", "engine.options.engine_args.worker_extension_cls"]),
    ({"kind": "vllm", "options": {"engine_args": {"trust_remote_code": False}}}, []),
])
def test_code_loading_fields(engine: dict[str, Any], fields: list[str]) -> None:
    assert code_loading_fields({"engine": engine}) == fields


def test_replay_and_localize_refuse_a_report_that_runs_code(fake_model: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Refused before any engine starts, in the library as in the CLI: exit 2 naming the fields and the flag."""
    from oracle.errors import ConfigError
    from oracle.localize import localize_from_report
    from oracle.replay import replay

    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({"model": str(fake_model), "engine": {"kind": "fake_engine:FakeEngine",
                                                                       "preload": ["fake_engine"]},
                                  "prompts": {"random": {"count": 1, "min_len": 2, "max_len": 3}},
                                  "sampling": {"max_tokens": 2}, "schedule": {"trials": 1, "seed": 1}}))
    assert main(["run", str(config), "--report-dir", str(tmp_path / "r")]) in (0, 1)
    report = tmp_path / "r" / "report.json"
    capsys.readouterr()
    for verb in ("replay", "localize"):
        assert main([verb, str(report), "--trial", "0"]) == 2
        err = capsys.readouterr().err
        assert "engine.kind, engine.preload" in err and "--trust-report" in err and str(report) in err
    for call in (lambda: replay(report, 0), lambda: localize_from_report(report, 0)):
        with pytest.raises(ConfigError, match="engine.kind, engine.preload"):
            call()
    assert replay(report, 0, trusted=True).divergence is None  # the user's own report: it runs


def test_the_printed_replay_command_carries_the_flag_only_where_needed() -> None:
    assert replay_command("r/report.json", 3, {"engine": {"kind": "native"}}) == "oracle replay r/report.json --trial 3"
    assert replay_command("r/report.json", 3, {"engine": {"kind": "a.b:C"}}).endswith("--trial 3 --trust-report")
