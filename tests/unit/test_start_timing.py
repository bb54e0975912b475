"""Where an engine's start went (TimesItsStart): the parts it reports reach the report's timings as
`{mode}_engine_start_{part}_s`, and the vLLM worker times parts of vLLM's start by wrapping its methods."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from oracle.config import parse_config
from oracle.engines import vllm_worker
from oracle.engines.contract import capabilities, start_parts
from oracle.runner import run


def test_an_engines_start_parts_reach_the_report(fake_model: Path, tmp_path: Path) -> None:
    report = run(parse_config({
        "model": str(fake_model), "engine": {"kind": "timed_start_engine:TimedStartEngine"},
        "prompts": {"random": {"count": 2, "min_len": 2, "max_len": 4}}, "sampling": {"max_tokens": 3},
        "schedule": {"trials": 3, "seed": 1}, "report_dir": str(tmp_path / "r"),
    }))
    for mode in ("invariant", "production"):
        assert report.timings[f"{mode}_engine_start_load_s"] == 0.25
        assert report.timings[f"{mode}_engine_start_warm_s"] == 1.5
        assert not any(k.startswith(f"{mode}_engine_start_{bad}") for bad in ("nan", "back", "flag")
                       for k in report.timings)
        assert f"{mode}_engine_start_s" in report.timings  # the whole start, as before


def test_start_parts_keeps_names_and_finite_seconds_only() -> None:
    class Engine:
        start_seconds: Any = {"a": 1, "b": 2.5, "c": float("inf"), "d": -0.1, "e": False, "f": "3"}

    assert start_parts(Engine()) == {"a": 1.0, "b": 2.5}
    Engine.start_seconds = [("a", 1.0)]
    assert start_parts(Engine()) == {}
    assert start_parts(object()) == {}
    assert capabilities(Engine()).start_timing and not capabilities(object()).start_timing


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> type:
    """A module standing for vLLM's: a runner whose subclass's method calls its parent's."""
    module = types.ModuleType("fake_vllm_runner")

    class Runner:
        def load(self) -> str:
            return "runner"

    class Sub(Runner):
        def load(self) -> str:
            return "sub+" + super().load()

    module.Runner, module.Sub = Runner, Sub  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_vllm_runner", module)
    monkeypatch.setattr(vllm_worker, "VLLM_START_PARTS", (
        ("load", "fake_vllm_runner", "Runner", "load"),
        ("load", "fake_vllm_runner", "Sub", "load"),
        ("gone", "no_such_module_here", "X", "y"),  # a version without it: left out
        ("gone", "fake_vllm_runner", "Runner", "absent"),
    ))
    return Sub


def test_vllm_parts_count_a_nested_call_once_and_give_the_methods_back(fake_vllm: type) -> None:
    sub_load, runner_load = fake_vllm.__dict__["load"], fake_vllm.__mro__[1].__dict__["load"]
    ticks = iter(range(100))
    with vllm_worker.timed_vllm_parts(on_cpu=True, clock=lambda: float(next(ticks))) as seconds:
        assert fake_vllm().load() == "sub+runner"
    # The clock ticks once per read: the outer call's start (0), the inner's (1), the outer's end (2).
    assert seconds == {"load": 2.0}
    assert fake_vllm.__dict__["load"] is sub_load and fake_vllm.__mro__[1].__dict__["load"] is runner_load


def test_vllm_parts_are_given_back_when_the_build_raises(fake_vllm: type) -> None:
    sub_load = fake_vllm.__dict__["load"]
    with pytest.raises(RuntimeError), vllm_worker.timed_vllm_parts(on_cpu=False):
        assert fake_vllm.__dict__["load"] is not sub_load  # wrapped meanwhile
        raise RuntimeError("vLLM failed to build")
    assert fake_vllm.__dict__["load"] is sub_load
