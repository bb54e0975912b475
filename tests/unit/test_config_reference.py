"""The committed config reference is what the models generate, and the schema command works."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oracle.cli import main
from oracle.render.config_reference import render_reference

DOCS = Path(__file__).resolve().parents[2] / "docs" / "config-reference.md"


def test_docs_are_current() -> None:
    assert DOCS.read_text() == render_reference(), "run: oracle config reference > docs/config-reference.md"


def test_reference_lists_every_section() -> None:
    text = render_reference()
    for section in ("## Config", "## EngineConfig", "## ScheduleConfig", "## FidelityConfig", "## DriftConfig"):
        assert section in text
    assert "| `trials` | `int` | `50` |" in text


def test_config_schema_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["additionalProperties"] is False and "model" in schema["required"]

