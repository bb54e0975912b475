"""`oracle config init` writes a working config from the shipped examples (also from a wheel, where the
examples are package data), and `oracle run --model` replaces the config's model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import write_fake_checkpoint

from oracle.cli import main
from oracle.config import load_config
from oracle.example_configs import BY_ENGINE, example_dir, example_names

ROOT = Path(__file__).resolve().parents[2]


def test_every_engine_has_a_shipped_example() -> None:
    assert {f"{name}.yaml" for name in BY_ENGINE.values()} <= {p.name for p in (ROOT / "configs").glob("*.yaml")}
    assert set(example_names()) == {p.stem for p in (ROOT / "configs").glob("*.yaml")}


@pytest.mark.parametrize("engine", sorted(BY_ENGINE))
def test_init_writes_a_config_that_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str], engine: str) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["config", "init", "--engine", engine]) == 0
    assert "oracle run oracle.yaml" in capsys.readouterr().out
    config = load_config(tmp_path / "oracle.yaml")
    assert config.engine.kind == engine


def test_init_writes_a_named_example_to_a_path(tmp_path: Path) -> None:
    out = tmp_path / "ci" / "gpu.yaml"
    assert main(["config", "init", "--example", "gpu", str(out)]) == 0
    assert load_config(out).engine.device == "cuda"


def test_init_refuses_to_overwrite_without_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "mine.yaml"
    out.write_text("model: mine\n")
    assert main(["config", "init", str(out)]) == 2
    assert "--force" in capsys.readouterr().err and out.read_text() == "model: mine\n"
    assert main(["config", "init", "--force", str(out)]) == 0
    assert load_config(out).model == "preset:tiny-qwen3"


def test_init_names_the_examples_for_an_unknown_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "init", "--example", "nope", str(tmp_path / "x.yaml")]) == 2
    assert "tiny" in capsys.readouterr().err and not (tmp_path / "x.yaml").exists()


def test_examples_ship_in_the_wheel_as_package_data() -> None:
    tomllib = pytest.importorskip("tomllib")
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "oracle.configs" in tool["packages"]
    assert tool["package-dir"]["oracle.configs"] == "configs"
    assert example_dir().resolve() == (ROOT / "configs").resolve()  # a checkout reads the folder itself


def test_run_model_override_replaces_the_configs_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write_fake_checkpoint(tmp_path / "mine")
    config = tmp_path / "oracle.yaml"
    config.write_text(yaml.safe_dump({
        "model": "preset:does-not-exist", "engine": {"kind": "fake_engine:FakeEngine"},
        "prompts": {"random": {"count": 2, "min_len": 2, "max_len": 5}}, "sampling": {"max_tokens": 3},
        "schedule": {"trials": 3, "seed": 1, "batch_size": [2, 4], "repeat_trials": 1},
        "checks": {"prefill_decode": "off", "prefix_cache": "off"}}))
    # A relative folder on the command line is the working directory's.
    assert main(["run", str(config), "--model", "mine", "--report-dir", "out"]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["config"]["model"] == str((tmp_path / "mine").resolve())


def test_a_bad_model_override_blames_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "oracle.yaml"
    assert main(["config", "init", str(config)]) == 0
    assert main(["run", str(config), "--model", "preset:nope", "--report-dir", str(tmp_path / "out")]) == 2
    assert "nope" in capsys.readouterr().err


def test_init_custom_engine_writes_the_engine_beside_its_config_and_it_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], model_cache: Path) -> None:
    """What a wheel in an empty folder gets: the example engine's module beside the config, imported from
    the config's folder without PYTHONPATH, and the config runs."""
    monkeypatch.chdir(tmp_path)
    assert main(["config", "init", "--example", "custom-engine", "ci/oracle.yaml"]) == 0
    out = capsys.readouterr().out
    assert "ci/custom_engine.py" in out and "oracle run ci/oracle.yaml" in out
    assert (tmp_path / "ci" / "custom_engine.py").read_text() == (ROOT / "examples" / "custom_engine.py").read_text()
    assert load_config(tmp_path / "ci" / "oracle.yaml").engine.kind == "custom_engine:BigramEngine"
    code = main(["run", "ci/oracle.yaml", "--trials", "3", "--seed", "2", "--report-dir", "report"])
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert code == 0, report.get("error")
    assert report["environment"]["engines"]["invariant"]["engine"] == "bigram-example"


def test_init_custom_engine_refuses_to_overwrite_the_module(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "custom_engine.py").write_text("# mine\n")
    assert main(["config", "init", "--example", "custom-engine", str(tmp_path / "oracle.yaml")]) == 2
    assert "custom_engine.py: already exists" in capsys.readouterr().err
    assert (tmp_path / "custom_engine.py").read_text() == "# mine\n" and not (tmp_path / "oracle.yaml").exists()


def test_init_writes_the_sharded_workflow_as_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["config", "init", "--example", "sharded-workflow"]) == 0
    assert (tmp_path / "oracle-sharded.yml").read_text() == (ROOT / "examples" / "oracle-sharded.yml").read_text()


def test_the_examples_ship_in_the_wheel() -> None:
    tomllib = pytest.importorskip("tomllib")
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "oracle.examples" in tool["packages"] and tool["package-dir"]["oracle.examples"] == "examples"
    shipped = tool["package-data"]["oracle.examples"]
    assert {"*.py", "*.yaml", "*.yml"} <= set(shipped)
