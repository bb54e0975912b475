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
from oracle.engines import check_engine_config
from oracle.errors import ConfigError
from oracle.lifecycle.watchdog import build_engine

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


FIELDS_ENGINE = '''
class FieldsEngine:
    needs_weights = {weights}
    def __init__(self, model, mode, *, max_num_seqs, enable_prefix_caching, num_threads, device, dtype,
                 max_num_batched_tokens, block_size=16, hidden=8):
        self.mode = mode
        self.got = dict(max_num_seqs=max_num_seqs, enable_prefix_caching=enable_prefix_caching,
                        num_threads=num_threads, device=device, dtype=dtype,
                        max_num_batched_tokens=max_num_batched_tokens, block_size=block_size, hidden=hidden)
    def generate(self, requests, max_num_batched_tokens=None):
        return []
    def describe(self):
        return {{"engine": "FieldsEngine"}}
    def close(self):
        pass
'''


def _fields_config(tmp_path: Path, module: str, engine: dict[str, object], weights: bool = True) -> object:
    (tmp_path / f"{module}.py").write_text(FIELDS_ENGINE.format(weights=weights))
    return parse_config({"model": "m", "engine": {"kind": f"{module}:FieldsEngine", **engine},
                         "prompts": {"random": {"count": 1}}, "base_dir": str(tmp_path)}).engine


def test_a_custom_engine_gets_the_validated_engine_fields(tmp_path: Path) -> None:
    cfg = _fields_config(tmp_path, "fields_engine_a", {"max_num_seqs": 16, "enable_prefix_caching": True,
                                                       "num_threads": 2, "dtype": "bfloat16",
                                                       "options": {"hidden": 4}})
    engine = build_engine(cfg, tmp_path, "invariant")  # type: ignore[arg-type]
    assert engine.got == {  # type: ignore[attr-defined]
        "max_num_seqs": 16, "enable_prefix_caching": True, "num_threads": 2, "device": "cpu", "dtype": "bfloat16",
        "max_num_batched_tokens": 2048, "block_size": 16, "hidden": 4}


def test_options_win_over_the_engine_fields(tmp_path: Path) -> None:
    cfg = _fields_config(tmp_path, "fields_engine_b", {"max_num_seqs": 16, "options": {"max_num_seqs": 3}})
    engine = build_engine(cfg, tmp_path, "production")  # type: ignore[arg-type]
    assert engine.got["max_num_seqs"] == 3  # type: ignore[attr-defined]


def test_an_engine_taking_kwargs_gets_the_fields_the_config_sets(tmp_path: Path) -> None:
    (tmp_path / "kw_engine.py").write_text(ENGINE_SOURCE.format(name="KwEngine"))
    cfg = parse_config({"model": "m", "engine": {"kind": "kw_engine:KwEngine", "enable_prefix_caching": True,
                                                 "options": {"x": 1}},
                        "prompts": {"random": {"count": 1}}, "base_dir": str(tmp_path)}).engine
    engine = build_engine(cfg, tmp_path, "production")
    assert engine.options == {"enable_prefix_caching": True, "x": 1}  # type: ignore[attr-defined]


def test_a_field_the_engine_cannot_take_is_a_config_error(tmp_path: Path) -> None:
    source = ENGINE_SOURCE.format(name="NarrowEngine").replace("**options", "hidden=1")
    (tmp_path / "narrow_engine.py").write_text(source)
    cfg = parse_config({"model": "m", "engine": {"kind": "narrow_engine:NarrowEngine", "enable_prefix_caching": True},
                        "prompts": {"random": {"count": 1}}, "base_dir": str(tmp_path)}).engine
    with pytest.raises(ConfigError, match=r"engine\.enable_prefix_caching: narrow_engine:NarrowEngine takes no"):
        check_engine_config(cfg)  # type: ignore[arg-type]


@pytest.mark.parametrize("weights", [True, False])
def test_a_custom_engine_gets_weights_unless_its_class_says_not(tmp_path: Path, weights: bool) -> None:
    from oracle.engines import needs_weights

    cfg = _fields_config(tmp_path, f"fields_engine_w{int(weights)}", {}, weights=weights)
    assert needs_weights(cfg) is weights  # type: ignore[arg-type]


def test_a_hub_id_is_fetched_with_weights_for_a_custom_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import oracle.models.resolve as resolve
    from oracle.plan import resolve_model

    asked: dict[str, object] = {}

    def fake_resolve(spec: str, **kw: object) -> Path:
        asked.update(spec=spec, **kw)
        raise ConfigError("stop here")

    monkeypatch.setattr(resolve, "read_checkpoint", fake_resolve)
    (tmp_path / "fields_engine_hub.py").write_text(FIELDS_ENGINE.format(weights=True))
    config = parse_config({"model": "Org/Model", "engine": {"kind": "fields_engine_hub:FieldsEngine"},
                           "prompts": {"random": {"count": 1}}, "base_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="stop here"):
        resolve_model(config)
    assert asked["spec"] == "Org/Model" and asked["weights"] is True


def test_a_resolved_config_with_every_field_at_its_default_passes_nothing_extra(tmp_path: Path) -> None:
    # A report's config spells out every engine field (replay reads it back): defaults are not "set".
    source = ENGINE_SOURCE.format(name="NarrowEngine2").replace("**options", "hidden=1").replace(
        "self.options = mode, options", "self.options = mode, hidden")
    (tmp_path / "narrow_engine2.py").write_text(source)
    first = parse_config({"model": "m", "engine": {"kind": "narrow_engine2:NarrowEngine2"},
                          "prompts": {"random": {"count": 1}}, "base_dir": str(tmp_path)})
    again = parse_config(first.model_dump(mode="json"))
    check_engine_config(again.engine)
    assert build_engine(again.engine, tmp_path, "production").mode == "production"
