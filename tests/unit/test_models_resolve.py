"""resolve_model and is_checkpoint_dir: what an engine is handed, and errors that name the path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from oracle.errors import ConfigError, ModelError
from oracle.models import is_checkpoint_dir, make_model, resolve_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny-qwen3", tmp_path_factory.mktemp("resolve") / "tiny")


def test_a_made_model_is_a_checkpoint_and_resolves_to_itself(model_dir: Path) -> None:
    assert is_checkpoint_dir(model_dir)
    assert resolve_model(str(model_dir)) == model_dir


def test_relative_paths_resolve_to_absolute(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(model_dir.parent)
    assert resolve_model("tiny") == model_dir


def test_missing_path_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    assert not is_checkpoint_dir(missing)
    with pytest.raises(ModelError, match="does not exist") as info:
        resolve_model(str(missing))
    assert str(missing) in str(info.value)


def test_directory_without_config_json(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert not is_checkpoint_dir(tmp_path)
    with pytest.raises(ModelError, match="has no config.json"):
        resolve_model(str(tmp_path))


def test_directory_without_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert not is_checkpoint_dir(tmp_path)
    with pytest.raises(ModelError, match="has no weights"):
        resolve_model(str(tmp_path))


def test_sharded_safetensors_index_counts_as_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors.index.json").write_text("{}")
    assert is_checkpoint_dir(tmp_path)


def test_unparseable_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelError, match="unreadable config.json"):
        resolve_model(str(tmp_path))


def test_a_file_is_not_a_checkpoint(model_dir: Path) -> None:
    with pytest.raises(ModelError, match="is not a directory"):
        resolve_model(str(model_dir / "config.json"))


def test_preset_spec_makes_the_model_in_the_cache(tmp_path: Path) -> None:
    path = resolve_model("preset:tiny-llama", seed=4, cache_dir=tmp_path)
    assert path == tmp_path / "tiny-llama-seed4"
    assert is_checkpoint_dir(path)


def test_unknown_preset_spec_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tiny-gpt"):
        resolve_model("preset:tiny-gpt", cache_dir=tmp_path)


def test_importing_the_package_and_checking_paths_does_not_import_torch() -> None:
    # The CLI reports a bad model path instantly; torch costs seconds to import.
    code = (
        "import sys; import oracle.models as m; m.is_checkpoint_dir('/nonexistent'); m.get_preset('tiny-qwen3'); "
        "print(sorted(k for k in ('torch', 'tokenizers') if k in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert result.stdout.strip() == "[]"
