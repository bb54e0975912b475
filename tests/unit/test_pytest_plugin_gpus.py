"""pytest-xdist: each worker gets one of the caller's GPUs, as CUDA_VISIBLE_DEVICES in its environment."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest

from oracle import pytest_plugin
from oracle.pytest_plugin.gpus import ENV, visible_devices, worker_device
from oracle.pytest_plugin.runs import STATE, SessionState


def _none() -> int:
    raise AssertionError("nvidia-smi must not be asked when CUDA_VISIBLE_DEVICES is set")


def test_the_callers_devices_in_the_callers_order() -> None:
    assert visible_devices({ENV: "3,1, GPU-abc"}, _none) == ["3", "1", "GPU-abc"]
    assert visible_devices({ENV: ""}, _none) == []
    assert visible_devices({}, lambda: 4) == ["0", "1", "2", "3"]


def test_one_device_per_worker_round_robin() -> None:
    devices = ["3", "1", "5"]
    assert [worker_device(f"gw{k}", devices) for k in range(5)] == ["3", "1", "5", "3", "1"]
    assert worker_device("gw0", ["7"]) is None and worker_device("gw0", []) is None
    assert worker_device("master", devices) is None


def _node(option: str, workerid: str) -> Any:
    state = SessionState(seed=1, seed_forced=False, seed_source="test", trials=None, base_config=None,
                         report_root=os.getcwd())  # type: ignore[arg-type]
    config = SimpleNamespace(stash={STATE: state}, getoption=lambda name: option)
    return SimpleNamespace(config=config, workerinput={"workerid": workerid})


def test_controller_hands_each_worker_its_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "2,6")
    nodes = [_node("auto", f"gw{k}") for k in range(3)]
    for node in nodes:
        pytest_plugin.pytest_configure_node(node)
    assert [n.workerinput.get("oracle_cuda_device") for n in nodes] == ["2", "6", "2"]
    off = _node("off", "gw1")
    pytest_plugin.pytest_configure_node(off)
    assert "oracle_cuda_device" not in off.workerinput


def test_worker_sets_its_device_in_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "2,6")
    config = SimpleNamespace(workerinput={"oracle_cuda_device": "6", "oracle_seed": 1, "oracle_seed_forced": False},
                             addinivalue_line=lambda *a: None, getoption=lambda name: None, stash={},
                             pluginmanager=SimpleNamespace(register=lambda *a: None), cache=None)
    pytest_plugin.pytest_configure(config)  # type: ignore[arg-type]
    assert os.environ[ENV] == "6"
