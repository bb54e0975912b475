"""Every YAML block of README.md works when copied: a workflow names the Action and a config that exist, a
config loads as written, and the ones on the native engine run (with a tiny model and few trials)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from oracle.cli import main
from oracle.config import load_config

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = re.findall(r"^```yaml\n(.*?)^```", (ROOT / "README.md").read_text(encoding="utf-8"), re.M | re.S)


def _is_workflow(data: Any) -> bool:
    return isinstance(data, dict) and "jobs" in data


def _is_kubernetes(data: Any) -> bool:
    """A Kubernetes manifest (an Indexed Job running oracle), not an oracle config."""
    return isinstance(data, dict) and "spec" in data and "model" not in data


def _is_config(data: Any) -> bool:
    return not (_is_workflow(data) or _is_kubernetes(data))


def _configs() -> list[Any]:
    return [pytest.param(i, text, id=f"block{i}") for i, text in enumerate(BLOCKS)
            if _is_config(yaml.safe_load(text))]


def test_the_readme_has_yaml_blocks() -> None:
    assert len(BLOCKS) >= 4
    assert sum(_is_workflow(yaml.safe_load(b)) for b in BLOCKS) == 1


def test_readme_kubernetes_commands_name_shipped_configs() -> None:
    for text in BLOCKS:
        if _is_kubernetes(yaml.safe_load(text)):
            for path in re.findall(r"oracle run (\S+\.yaml)", text):
                assert (ROOT / path).is_file(), path


@pytest.mark.parametrize(("index", "text"), _configs())
def test_every_readme_config_loads_as_written(tmp_path: Path, index: int, text: str) -> None:
    path = tmp_path / f"readme-{index}.yaml"
    path.write_text(text)
    config = load_config(path)
    assert config.model


def test_the_readme_workflow_names_files_that_exist() -> None:
    workflow = next(yaml.safe_load(b) for b in BLOCKS if _is_workflow(yaml.safe_load(b)))
    steps = [s for job in workflow["jobs"].values() for s in job["steps"]]
    action = next(s for s in steps if str(s.get("uses", "")).startswith("./"))
    assert (ROOT / action["uses"] / "action.yml").is_file()
    assert (ROOT / action["with"]["config"]).is_file()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("readme-model") / "tiny"
    assert main(["model", "make", "tiny-qwen3", str(out)]) == 0
    return out


def _native() -> list[Any]:
    found = []
    for i, text in enumerate(BLOCKS):
        data = yaml.safe_load(text)
        if _is_config(data) and data.get("engine", {}).get("kind", "native") == "native":
            found.append(pytest.param(i, text, id=f"block{i}"))
    return found


@pytest.mark.slow
@pytest.mark.parametrize(("index", "text"), _native())
def test_readme_native_configs_run(tmp_path: Path, tiny_dir: Path, index: int, text: str) -> None:
    path = tmp_path / f"readme-{index}.yaml"
    path.write_text(text)
    report = tmp_path / "report"
    code = main(["run", str(path), "--model", str(tiny_dir), "--trials", "2", "--seed", "7",
                 "--report-dir", str(report)])
    assert code == 0, (report / "summary.md").read_text()
    assert (report / "report.json").is_file()
