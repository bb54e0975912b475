"""docs/extending.md's walked examples work as written: its engine runs a config as `module:Class`, and its check
judges a run's results."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

from oracle.checks.base import Check, Runs
from oracle.config import parse_config
from oracle.runner import run

PAGE = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def _block(after: str) -> str:
    """The first ```python block after the heading `after`."""
    text = PAGE.read_text(encoding="utf-8")
    found = re.search(rf"^### {re.escape(after)}\n.*?^```python\n(.*?)^```", text, re.M | re.S)
    assert found, after
    return found.group(1)


def _module(name: str, code: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(code, f"docs/extending.md:{name}", "exec"), module.__dict__)  # noqa: S102 - the page's own code
    return module


def _config(model: Path, report_dir: Path) -> dict[str, object]:
    return {"model": str(model), "engine": {"kind": "echo_engine:EchoEngine"},
            "prompts": {"random": {"count": 3, "min_len": 2, "max_len": 5}}, "sampling": {"max_tokens": 4},
            "schedule": {"trials": 8, "seed": 3, "batch_size": [1, 6], "repeat_trials": 2},
            "checks": {"prefill_decode": "off", "prefix_cache": "off", "negative_control": "off"},
            "report_dir": str(report_dir)}


def test_the_walked_engine_runs_a_config(fake_model: Path, tmp_path: Path) -> None:
    sys.modules["echo_engine"] = _module("echo_engine", _block("Walked through: an engine of your own"))
    try:
        report = run(parse_config(_config(fake_model, tmp_path / "r")))
    finally:
        del sys.modules["echo_engine"]
    assert report.check("invariance").verdict == "pass"  # type: ignore[union-attr]
    assert report.check("repeatability").verdict == "pass"  # type: ignore[union-attr]


def test_the_walked_check_judges_a_runs_results(fake_model: Path, tmp_path: Path) -> None:
    from oracle.execute import ModeExecution
    from oracle.observer import Observer
    from oracle.plan import plan_run
    from oracle.runner import engine_builder

    sys.modules["echo_engine"] = _module("echo_engine", _block("Walked through: an engine of your own"))
    try:
        plan = plan_run(parse_config(_config(fake_model, tmp_path / "r")))
        execution = ModeExecution(plan, "invariant", Observer(), engine_builder(plan), check_runs={})
        execution.run()
    finally:
        del sys.modules["echo_engine"]
    check = _module("full_length", _block("Walked through: a check"))
    assert isinstance(check.ROW, Check) and check.ROW.name == "full_length"
    runs = Runs(plan.config, plan.targets, {t.trial_id: t for t in plan.trials}, execution.result(), None, {})
    judged = check.ROW.judge(runs, "required")
    assert judged.result.verdict == "pass" and judged.result.trials == len(plan.targets)
    short = execution.result()
    short = type(short)(short.mode, solo={0: type(short.solo[0])("r", [1], [-1.0])})
    judged = check.ROW.judge(Runs(plan.config, plan.targets, {}, short, None, {}), "required")
    assert judged.result.verdict == "fail" and "1 of 1 references are short" in judged.result.message
