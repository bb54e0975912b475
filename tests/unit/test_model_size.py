"""Absurd model dimensions are refused before anything is allocated: exit 2, one line naming the field
and the estimate (oracle.models.size), for every engine that loads the weights here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from oracle.config import EngineConfig, parse_config
from oracle.engines import check_model_size
from oracle.errors import ModelError
from oracle.models import PRESETS, make_config_dict, memory
from oracle.models.facts import read_model_facts
from oracle.models.layout import tensor_layout
from oracle.models.memory import Memory
from oracle.models.size import check_fits, estimate, read_dims, weight_params

HANG_GUARD_S = 120  # only reached when the check is missing and the engine builds a billion layers


def _model(tiny_qwen3: Path, tmp_path: Path, **changes: Any) -> Path:
    model = tmp_path / "model"
    shutil.copytree(tiny_qwen3, model)
    raw = json.loads((model / "config.json").read_text())
    raw.update(changes)
    (model / "config.json").write_text(json.dumps(raw))
    return model


def _run(model: Path, tmp_path: Path, engine: dict[str, Any] | None = None) -> tuple[int, str]:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({
        "model": str(model), "engine": engine or {"kind": "native"},
        "prompts": {"random": {"count": 2, "min_len": 2, "max_len": 4}}, "sampling": {"max_tokens": 2},
        "schedule": {"trials": 2, "batch_size": [1, 2]}, "report_dir": str(tmp_path / "report"),
    }))
    proc = subprocess.Popen([sys.executable, "-m", "oracle", "run", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "CI": "1"})
    try:
        _, err = proc.communicate(timeout=HANG_GUARD_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError("oracle run hung on an absurd model") from None
    return proc.returncode, err


@pytest.mark.parametrize("layers", [10**9, 1e9])
def test_a_billion_layers_is_refused_before_loading(tiny_qwen3: Path, tmp_path: Path, layers: float) -> None:
    model = _model(tiny_qwen3, tmp_path, num_hidden_layers=layers)
    code, err = _run(model, tmp_path)
    assert code == 2, err
    line = next(x for x in err.splitlines() if x.startswith("oracle: error:"))
    assert f"{model / 'config.json'}: num_hidden_layers: 1,000,000,000 is beyond any real model" in line
    assert "the weights need at least 148 TB in float32" in line and "of RAM available" in line, line
    assert "Traceback" not in err


def test_absurd_dims_are_refused_for_localize_and_replay_too(tiny_qwen3: Path, tmp_path: Path) -> None:
    """resolve_model (run, replay, localize) checks the weights: no path reaches the engine."""
    from oracle.plan import resolve_model

    model = _model(tiny_qwen3, tmp_path, hidden_size=10**8, intermediate_size=10**8)
    config = parse_config({"model": str(model), "prompts": {"random": {"count": 1}}})
    with pytest.raises(ModelError, match=r"config.json: (hidden_size|intermediate_size): 100,000,000 is beyond"):
        resolve_model(config)


@pytest.mark.parametrize(("value", "shown"), [("big", "'big'"), (0, "0"), (-3, "-3"), (2.5, "2.5"), (True, "True")])
def test_a_dimension_that_is_not_a_positive_integer_names_the_key(tmp_path: Path, value: Any, shown: str) -> None:
    raw = {"vocab_size": 100, "hidden_size": value, "num_hidden_layers": 2}
    with pytest.raises(ModelError, match=rf"config.json: hidden_size: must be a positive integer \(got {shown}\)"):
        read_dims(raw, tmp_path / "config.json")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_the_weight_estimate_is_a_tight_lower_bound(name: str) -> None:
    preset = PRESETS[name]
    exact = sum(t.numel for t in tensor_layout(preset))
    est = weight_params(read_dims(make_config_dict(preset), Path("config.json")))
    assert est is not None and 0.999 * exact <= est <= exact


def test_other_spellings_and_a_text_config_are_read(tmp_path: Path) -> None:
    gpt2 = {"vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12, "activation_function": "gelu_new"}
    params = weight_params(read_dims(gpt2, tmp_path))
    assert params is not None and 0.9 * 124e6 < params < 124.5e6  # GPT-2 small: 124M (positions not counted)
    nested = {"architectures": ["X"], "text_config": {"vocab_size": 10, "hidden_size": 4, "num_hidden_layers": 10**12}}
    size = estimate(read_dims(nested, tmp_path / "config.json"), "bfloat16")
    assert size is not None and size.blame == "num_hidden_layers"


def test_a_config_without_dimensions_is_not_estimated(tmp_path: Path) -> None:
    assert estimate(read_dims({"vocab_size": 97}, tmp_path / "config.json"), "float32") is None


def test_the_kv_cache_is_blamed_when_it_is_what_does_not_fit(tmp_path: Path) -> None:
    raw = make_config_dict(PRESETS["tiny-qwen3"])
    size = estimate(read_dims(raw, tmp_path / "config.json"), "float32", kv_tokens=10**9)
    assert size is not None and size.kv_bytes > size.weights_bytes
    with pytest.raises(ModelError, match=r"the KV cache for 1,000,000,000 tokens at once needs .*; lower schedule"):
        check_fits(size, 10**9, "RAM available", tmp_path / "config.json", "schedule.batch_size")
    check_fits(size, size.total_bytes, "RAM available", tmp_path / "config.json", "schedule.batch_size")


def test_a_sane_model_too_large_for_the_machine_says_so(tmp_path: Path) -> None:
    size = estimate(read_dims(make_config_dict(PRESETS["qwen3-8b-shape"]), tmp_path / "config.json"),
                    "bfloat16")
    assert size is not None and size.blame == ""
    with pytest.raises(ModelError, match=r"too large for this machine: the weights need at least 16.4 GB in "
                                         r"bfloat16, more than the 8 GB of RAM available"):
        check_fits(size, 8 * 10**9, "RAM available", tmp_path / "config.json", "")


def _memory(monkeypatch: pytest.MonkeyPatch, ram: int | None, cuda: int | None = None, gpus: int | None = None) -> None:
    monkeypatch.setattr(memory, "ram_available", lambda: None if ram is None else Memory(ram, "RAM available"))
    monkeypatch.setattr(memory, "cuda_free", lambda d: None if cuda is None else Memory(cuda, f"free memory of {d}"))
    monkeypatch.setattr(memory, "gpus_free", lambda: None if gpus is None else Memory(gpus, "free memory of 1 GPU"))


def test_each_engine_is_checked_where_it_holds_the_model(tiny_qwen3: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    weights = 106_816 * 4  # tiny-qwen3 in float32 (the estimate)
    facts = read_model_facts(tiny_qwen3)
    _memory(monkeypatch, ram=weights - 1, cuda=weights, gpus=weights)
    with pytest.raises(ModelError, match="of RAM available"):
        check_model_size(EngineConfig(kind="native"), facts)
    check_model_size(EngineConfig(kind="native", device="cuda:0"), facts)  # the device's memory counts
    check_model_size(EngineConfig(kind="vllm"), facts)  # vLLM's worker takes the GPU; its pool is there
    _memory(monkeypatch, ram=weights + (1 << 30) - 1)
    with pytest.raises(ModelError, match=r"\+ 1.07 GB of KV cache"):  # no GPU: vLLM's CPU KV pool is in RAM
        check_model_size(EngineConfig(kind="vllm"), facts)
    _memory(monkeypatch, ram=1)
    check_model_size(EngineConfig(kind="openai", options={"base_url": "http://127.0.0.1:1"}), facts)
    check_model_size(EngineConfig(kind="fake_engine:FakeEngine"), facts)  # not loaded here: not checked
    _memory(monkeypatch, ram=None)
    check_model_size(EngineConfig(kind="native"), facts)  # memory unknown: nothing to compare with


def test_the_run_checks_the_kv_cache_of_its_largest_trial(tiny_qwen3: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from oracle.plan import kv_tokens, plan_run

    config = parse_config({"model": str(tiny_qwen3), "engine": {"block_size": 4},
                           "prompts": {"random": {"count": 3, "min_len": 5, "max_len": 9}},
                           "sampling": {"max_tokens": 3}, "schedule": {"trials": 5, "seed": 1, "batch_size": [2, 4]}})
    plan = plan_run(config)
    tokens = kv_tokens(config, plan.targets, plan.trials)
    largest = max(sum(-(-n // 4) * 4 for n in [len(plan.targets[t.target].token_ids) + 3,
                                                *(f.length + f.max_tokens for f in t.fillers)])
                  for t in plan.trials)
    assert tokens == largest
    weights = 106_816 * 4
    raw = make_config_dict(PRESETS["tiny-qwen3"])
    per_token = 2 * raw["num_hidden_layers"] * raw["num_key_value_heads"] * raw["head_dim"] * 4
    _memory(monkeypatch, ram=weights + tokens * per_token - 1)
    with pytest.raises(ModelError, match=f"the KV cache for {tokens} tokens at once"):
        plan_run(config)
    _memory(monkeypatch, ram=weights + tokens * per_token)
    plan_run(config)


def test_ram_is_read_within_the_containers_limit(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32000000 kB\nMemAvailable:   20000000 kB\n")
    assert memory._meminfo_available(meminfo) == 20000000 * 1024
    cgroup, proc = tmp_path / "cgroup", tmp_path / "self-cgroup"
    (cgroup / "job").mkdir(parents=True)
    proc.write_text("0::/job\n")
    (cgroup / "job" / "memory.max").write_text("8000000000\n")
    (cgroup / "job" / "memory.current").write_text("3000000000\n")
    assert memory._cgroup_headroom(cgroup, proc) == 5_000_000_000
    (cgroup / "job" / "memory.max").write_text("max\n")  # no limit
    assert memory._cgroup_headroom(cgroup, proc) is None
