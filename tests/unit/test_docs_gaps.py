"""What a newcomer reads first says what holds: how long the tests take, what replay and localize exit with,
a recipe whose names are imported."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_says_how_long_the_tests_take() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert re.search(r"about 7 minutes on 2 CPU cores", readme)


def test_cli_md_says_replay_and_localize_exit_1_when_the_divergence_reproduces() -> None:
    text = " ".join((ROOT / "docs" / "cli.md").read_text(encoding="utf-8").split())
    assert "`oracle replay` and `oracle localize` exit 1 when the divergence reproduces" in text


def test_the_subclass_recipe_runs_as_written() -> None:
    """The recipe's block, run: its names are imported, and the class it defines is a native engine."""
    text = (ROOT / "docs" / "engines.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"^```python\n(.*?)^```", text, re.M | re.S) if "(NativeEngine)" in b)
    namespace: dict[str, object] = {}
    exec(compile(block, "docs/engines.md", "exec"), namespace)  # noqa: S102 - the docs' own code
    from oracle.engines.native import NativeEngine

    engine_class = namespace["MyEngine"]
    assert isinstance(engine_class, type) and issubclass(engine_class, NativeEngine)
