"""Replaying a downloaded report never spends the user's credentials: a report whose openai base_url names
a server gets no key from the environment without --trust-report; localize's bad trial is exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_openai_engine import _stubs, _url

from oracle.cli import main
from oracle.trust import replay_command

KEY = "sk-user-own-key-0123456789abcdef"


@pytest.fixture
def server_report(tmp_path: Path) -> Any:
    pytest.importorskip("httpx")
    from oracle.models import make_model

    make_model("tiny-qwen3", tmp_path / "model")
    (server,) = _stubs(1)
    cfg = tmp_path / "server.yaml"
    cfg.write_text(yaml.safe_dump({
        "model": "model", "engine": {"kind": "openai", "options": {"base_url": _url(server)}},
        "prompts": {"texts": ["hello there"]}, "sampling": {"max_tokens": 2, "logits": "digest"},
        "schedule": {"trials": 2, "batch_size": [1, 2], "repeat_trials": 0, "shrink": False},
        "checks": {"prefill_decode": "off", "prefix_cache": "off"}}))
    assert main(["run", str(cfg), "--report-dir", str(tmp_path / "r"), "--seed", "1"]) in (0, 1)
    server.auth.clear()
    yield server, tmp_path / "r" / "report.json"
    server.shutdown()
    server.server_close()


def test_replay_of_a_report_naming_a_server_sends_no_key_without_trust(
        server_report: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    server, report = server_report
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    for verb in ("replay", "localize"):
        assert main([verb, str(report), "--trial", "0"]) == 2
        err = capsys.readouterr().err
        assert "OPENAI_API_KEY" in err and "--trust-report" in err and KEY not in err
    assert server.auth == [] and server.bodies  # nothing reached the server
    assert main(["replay", str(report), "--trial", "0", "--trust-report"]) in (0, 1)
    assert server.auth and all(a == f"Bearer {KEY}" for a in server.auth)  # trusted: the user said so


def test_a_redacted_api_key_is_not_restored_for_a_named_server(server_report: Any, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    server, report = server_report
    data = json.loads(report.read_text())
    data["config"]["engine"]["options"]["api_key"] = "<redacted: set, 30 chars>"
    report.write_text(json.dumps(data))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("ORACLE_SECRET_ENGINE_OPTIONS_API_KEY", KEY)
    assert main(["replay", str(report), "--trial", "0"]) == 2
    assert server.auth == []


def test_the_printed_replay_command_carries_the_flag_for_a_named_server() -> None:
    config = {"engine": {"kind": "openai", "options": {"base_url": "http://127.0.0.1:1"}}}
    assert replay_command("r.json", 3, config).endswith("--trust-report")
    assert not replay_command("r.json", 3, {"engine": {"kind": "native"}}).endswith("--trust-report")


def test_localize_of_a_trial_whose_target_is_out_of_range_is_exit_2(
        fake_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = 99
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"model": str(fake_model), "engine": {"kind": "fake_engine:FakeEngine"},
                                   "prompts": {"random": {"count": 2, "min_len": 2, "max_len": 4}},
                                   "sampling": {"max_tokens": 2}, "schedule": {"trials": 2, "seed": 1}}))
    from oracle.config import load_config
    from oracle.report import Report

    report = Report(oracle_version="0", seed=1, config=load_config(cfg).redacted(), config_digest="0" * 64)
    data = report.to_dict()
    data["schedule"] = [{"trial_id": 0, "target": target, "position": 0, "target_arrival_step": 0, "fillers": []}]
    path = tmp_path / "report.json"
    path.write_text(json.dumps(data))
    for verb in ("localize", "replay"):
        assert main([verb, str(path), "--trial", "0", "--trust-report"]) == 2
        assert f"names target {target}" in capsys.readouterr().err
