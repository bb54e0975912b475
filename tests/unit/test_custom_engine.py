"""A custom engine (`engine.kind: module:Class`) imports from the user's repository without PYTHONPATH:
the working directory and the config's folder are on the import path while it is imported."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from oracle.config import parse_config
from oracle.engines import build_engine, check_engine_config
from oracle.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ENGINE_SOURCE = '''
class {name}:
    def __init__(self, model, mode, **options):
        self.mode, self.options = mode, options
    def generate(self, requests, max_num_batched_tokens=None):
        return []
    def describe(self):
        return {{"engine": "{name}"}}
    def close(self):
        pass
'''


def _engine_config(kind: str, base_dir: Path, **options: object) -> object:
    return parse_config({"model": "m", "engine": {"kind": kind, "options": options},
                         "prompts": {"random": {"count": 1}}, "base_dir": str(base_dir)}).engine


def test_a_module_in_the_working_directory_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "repo_engine_cwd.py").write_text(ENGINE_SOURCE.format(name="CwdEngine"))
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    cfg = _engine_config("repo_engine_cwd:CwdEngine", tmp_path / "elsewhere", depth=3)
    check_engine_config(cfg)  # type: ignore[arg-type]
    engine = build_engine(cfg, tmp_path, "invariant")  # type: ignore[arg-type]
    assert engine.describe() == {"engine": "CwdEngine"} and engine.options == {"depth": 3}  # type: ignore[attr-defined]
    assert sys.path == before  # restored after the import


def test_a_module_beside_the_config_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config_dir = tmp_path / "ci"
    config_dir.mkdir()
    (config_dir / "repo_engine_beside.py").write_text(ENGINE_SOURCE.format(name="BesideEngine"))
    monkeypatch.chdir(tmp_path)
    check_engine_config(_engine_config("repo_engine_beside:BesideEngine", config_dir))  # type: ignore[arg-type]


def test_a_missing_module_names_where_it_was_looked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=rf"engine.kind: cannot import 'no_such_engine_mod' .*looked in {tmp_path}"):
        check_engine_config(_engine_config("no_such_engine_mod:X", tmp_path))  # type: ignore[arg-type]


def test_a_module_that_raises_while_importing_is_a_config_error(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "repo_engine_broken.py").write_text("raise RuntimeError('broken on import')\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="importing 'repo_engine_broken' raised RuntimeError: broken on import"):
        check_engine_config(_engine_config("repo_engine_broken:X", tmp_path))  # type: ignore[arg-type]


def test_custom_engine_options_stay_free(tmp_path: Path) -> None:
    cfg = _engine_config("anything:Engine", tmp_path, whatever={"nested": [1, 2]})
    assert cfg.options == {"whatever": {"nested": [1, 2]}}  # type: ignore[attr-defined]


@pytest.mark.slow
def test_the_shipped_example_runs_from_a_repository_without_pythonpath(tmp_path: Path) -> None:
    """The example engine and config copied into a repo's ci/ folder, run from the repo root."""
    repo = tmp_path / "repo"
    (repo / "ci").mkdir(parents=True)
    shutil.copy(EXAMPLES / "custom_engine.py", repo / "ci" / "custom_engine.py")
    shutil.copy(EXAMPLES / "custom_engine.yaml", repo / "ci" / "oracle.yaml")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-m", "oracle", "run", "ci/oracle.yaml", "--trials", "4", "--seed", "2",
                             "--report-dir", "report"], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((repo / "report" / "report.json").read_text())
    assert report["environment"]["engines"]["invariant"]["engine"] == "bigram-example"
    assert {c["name"]: c["verdict"] for c in report["checks"]}["invariance"] in ("pass", "vacuous")
