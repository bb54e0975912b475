"""Hub ids as models, from a hub cache on disk with HF_HUB_OFFLINE=1: nothing here touches the network."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hub_cache import add_snapshot

from oracle.config import parse_config
from oracle.errors import ConfigError, ModelError
from oracle.models import make_model, resolve_model
from oracle.models.hub import is_hub_id
from oracle.plan import resolve_model as resolve_for_run

pytest.importorskip("huggingface_hub")

MAIN = "a" * 40
TAGGED = "b" * 40


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny-qwen3", tmp_path_factory.mktemp("hub-src") / "tiny")


@pytest.fixture
def hub(made: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub"
    add_snapshot(cache, "acme/tiny", made, MAIN)
    add_snapshot(cache, "acme/tiny", made, TAGGED, refs=("v1",))
    add_snapshot(cache, "acme/no-weights", made, MAIN, skip=("model.safetensors",))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    return cache


def test_hub_ids_are_told_apart_from_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert is_hub_id("Qwen/Qwen3-0.6B")
    assert not is_hub_id("./Qwen/Qwen3-0.6B") and not is_hub_id("/abs/path") and not is_hub_id("a/b/c")
    (tmp_path / "Qwen" / "Qwen3-0.6B").mkdir(parents=True)
    assert not is_hub_id("Qwen/Qwen3-0.6B")  # a directory on disk wins


def test_a_hub_id_resolves_to_its_cached_snapshot(hub: Path) -> None:
    path = resolve_model("acme/tiny")
    assert path.name == MAIN and path.parent.name == "snapshots"
    assert json.loads((path / "config.json").read_text())["model_type"] == "qwen3"


@pytest.mark.parametrize(("revision", "commit"), [("v1", TAGGED), (TAGGED, TAGGED), ("main", MAIN)])
def test_a_revision_picks_its_snapshot(hub: Path, revision: str, commit: str) -> None:
    assert resolve_model("acme/tiny", revision=revision).name == commit


def test_an_id_missing_offline_is_a_model_error_naming_it(hub: Path) -> None:
    with pytest.raises(ModelError, match=r"model acme/absent: not in the hub cache .*offline \(HF_HUB_OFFLINE=1\)"):
        resolve_model("acme/absent")


def test_an_unknown_revision_offline_names_the_id_and_revision(hub: Path) -> None:
    with pytest.raises(ModelError, match="model acme/tiny@v9: "):
        resolve_model("acme/tiny", revision="v9")


def test_weights_are_required_only_where_the_engine_runs_the_model(hub: Path) -> None:
    with pytest.raises(ModelError, match="acme/no-weights: the hub snapshot .* has no weights"):
        resolve_model("acme/no-weights")
    assert resolve_model("acme/no-weights", weights=False).name == MAIN


def test_without_huggingface_hub_a_hub_id_is_a_model_error(hub: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(ModelError, match="acme/tiny: a hub id needs huggingface_hub"):
        resolve_model("acme/tiny")


def _config(model: str, **extra: object) -> dict[str, object]:
    return {"model": model, "prompts": {"random": {"count": 2, "min_len": 4, "max_len": 8}}, **extra}


def test_the_openai_engine_resolves_a_snapshot_without_weights(hub: Path) -> None:
    config = parse_config(_config("acme/no-weights", engine={"kind": "openai", "options": {"base_url": "http://x"}}))
    assert resolve_for_run(config).model_dir.name == MAIN


def test_model_revision_applies_to_hub_ids_only(hub: Path, made: Path) -> None:
    assert resolve_for_run(parse_config(_config("acme/tiny", model_revision="v1"))).model_dir.name == TAGGED
    with pytest.raises(ConfigError, match="model_revision: applies to hub ids"):
        resolve_for_run(parse_config(_config(str(made), model_revision="v1")))


@pytest.mark.slow
def test_oracle_run_on_a_hub_id_offline(hub: Path, tmp_path: Path) -> None:
    """The CLI in a fresh process: HF_HUB_OFFLINE=1 and HF_HUB_CACHE, model: acme/tiny at v1."""
    cfg = tmp_path / "hub.yaml"
    cfg.write_text(yaml.safe_dump(_config(
        "acme/tiny", model_revision="v1", engine={"kind": "native", "num_threads": 1},
        sampling={"max_tokens": 3}, schedule={"trials": 3, "batch_size": [1, 3], "repeat_trials": 1},
        checks={"prefill_decode": "off", "prefix_cache": "off"},
    )))
    env = dict(os.environ, HF_HUB_CACHE=str(hub), HF_HUB_OFFLINE="1")
    result = subprocess.run([sys.executable, "-m", "oracle", "run", str(cfg), "--report-dir", str(tmp_path / "r"),
                             "--seed", "3"], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["environment"]["model_dir"].endswith(f"snapshots/{TAGGED}")
    assert {c["name"]: c["verdict"] for c in report["checks"]}["invariance"] in ("pass", "vacuous")


@pytest.mark.slow
def test_an_unreachable_hub_is_a_model_error_naming_the_id(tmp_path: Path) -> None:
    """Online mode, the hub endpoint refusing connections, nothing cached: one line naming the id, exit 2."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(_config("acme/unreachable")))
    env = dict(os.environ, HF_HUB_OFFLINE="0", TRANSFORMERS_OFFLINE="0", HF_ENDPOINT="http://127.0.0.1:9",
               HF_HUB_CACHE=str(tmp_path / "empty-hub"))
    result = subprocess.run([sys.executable, "-m", "oracle", "run", str(cfg), "--report-dir", str(tmp_path / "r")],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "model acme/unreachable: not in the hub cache" in result.stderr + result.stdout
    assert "the hub cannot be reached" in result.stderr + result.stdout
    assert "Traceback" not in result.stderr
