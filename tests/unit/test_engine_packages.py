"""A built-in engine's missing package is a config error naming the distribution's extra, raised before
the report folder is touched (friction: the openai engine needs httpx)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from oracle.cli import main
from oracle.config import EngineConfig
from oracle.engines import check_engine_packages
from oracle.errors import ConfigError

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[2]

OPENAI_CONFIG = """\
model: preset:tiny-qwen3
engine:
  kind: openai
  options: {base_url: {invariant: "http://127.0.0.1:1", production: "http://127.0.0.1:2"}}
prompts: {random: {count: 2}}
"""


def test_httpx_is_in_the_base_install_and_the_openai_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(d.startswith("httpx") for d in project["dependencies"])
    assert any(d.startswith("httpx") for d in project["optional-dependencies"]["openai"])


def test_missing_httpx_names_the_openai_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "httpx", None)
    with pytest.raises(ConfigError, match=r"pip install 'oracle-determinism\[openai\]'"):
        check_engine_packages(EngineConfig(kind="openai", options={"base_url": "http://127.0.0.1:1"}))


def test_the_native_engine_needs_no_extra_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "httpx", None)
    check_engine_packages(EngineConfig(kind="native"))


def test_the_cli_refuses_before_the_report_folder_is_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "httpx", None)
    config = tmp_path / "server.yaml"
    config.write_text(OPENAI_CONFIG)
    report_dir = tmp_path / "report"
    assert main(["run", str(config), "--report-dir", str(report_dir)]) == 2
    err = capsys.readouterr().err
    assert "oracle-determinism[openai]" in err and "oracle[vllm]" not in err
    assert not report_dir.exists()
