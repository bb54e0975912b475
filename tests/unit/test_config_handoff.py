"""The config `oracle run`'s parent resolved, handed to its child: same values, same digest, same blame."""

from __future__ import annotations

from pathlib import Path

import pytest

from oracle.config import config_from_handoff, config_handoff, load_config
from oracle.errors import ConfigError


def test_the_handed_config_is_the_parents_and_its_errors_still_name_file_line_and_flag(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("model: preset:tiny\nprompts:\n  texts: [hi]\nsampling:\n  max_tokens: 7\n"
                    "engine:\n  kind: openai\n  options: {base_url: 'http://x', api_key: sk-secret}\n")
    parent = load_config(path, {"schedule.trials": 5}, flags={"schedule.trials": "--trials"})
    child = config_from_handoff(config_handoff(parent))
    assert child.digest() == parent.digest() and child.model_dump() == parent.model_dump()
    assert child.schedule.trials == 5 and child.engine.options["api_key"] == "sk-secret"
    assert str(child.error(("sampling", "max_tokens"), "too long")) == f"{path}:5: sampling.max_tokens: too long"
    assert str(child.error(("schedule", "trials"), "too many")) == "--trials: schedule.trials: too many"


def test_an_empty_handoff_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="passed no config"):
        config_from_handoff(b"")
