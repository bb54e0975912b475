"""What a user gets: `oracle --version`, `python -m oracle`, the presets table, a config schema that
every shipped config passes, a package list that ships every module and data file, and the docs'
kernels snippet that runs. (.ci/run builds the wheel and runs it from outside the checkout.)"""

from __future__ import annotations

import fnmatch
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rich.console import Console

import oracle
from oracle.cli import main
from oracle.config import Config
from oracle.models import PRESETS
from oracle.render.console import print_presets

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
jsonschema = pytest.importorskip("jsonschema")
tomllib = pytest.importorskip("tomllib")


def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"oracle {oracle.__version__}"


def test_python_m_oracle() -> None:
    proc = subprocess.run([sys.executable, "-m", "oracle", "--help"], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "usage: oracle" in proc.stdout and "run" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "oracle", "--version"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == f"oracle {oracle.__version__}"


def test_presets_is_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "presets"]) == 0
    out = capsys.readouterr().out
    assert "ModelPreset(" not in out
    header = next(ln for ln in out.splitlines() if ln.split()[:1] == ["preset"])
    assert header.split()[:7] == ["preset", "arch", "layers", "hidden", "heads", "params", "size"]
    for name, p in PRESETS.items():
        row = next(ln for ln in out.splitlines() if ln.split()[:1] == [name])
        assert row.split()[1:5] == [p.architecture, str(p.num_hidden_layers), str(p.hidden_size),
                                    f"{p.num_attention_heads}/{p.num_key_value_heads}"]
    buf = io.StringIO()
    print_presets(Console(file=buf, width=80), PRESETS)
    assert max(len(ln) for ln in buf.getvalue().splitlines()) <= 80


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_validates_against_the_schema(path: Path) -> None:
    jsonschema.validate(yaml.safe_load(path.read_text()), Config.model_json_schema())


def test_schema_command_output_takes_the_shorthands_and_rejects_bad_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    base = {"model": "preset:tiny-qwen3", "prompts": {"texts": ["hi"]}}
    for checks in ({"invariance": "required", "prefix_cache": False, "golden": "off"},
                   {"drift": "report", "fidelity": {"requirement": "warn", "max_kl": 0.1}}, {"invariance": True}):
        jsonschema.validate({**base, "checks": checks}, schema)
    for checks in ({"invariance": "sometimes"}, {"invariance": "report"}, {"fidelity": {"max_kll": 1}}, {"drift": 3}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**base, "checks": checks}, schema)


def _pyproject() -> dict:  # type: ignore[type-arg]
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_and_data_file_ships() -> None:
    tool = _pyproject()["tool"]["setuptools"]
    listed = set(tool["packages"])
    dirs = {"oracle": ROOT / "oracle", **{k: ROOT / v for k, v in tool.get("package-dir", {}).items()}}
    for top, folder in dirs.items():
        for init in folder.rglob("__init__.py"):
            name = ".".join([top, *init.parent.relative_to(folder).parts])
            assert name in listed, f"{name} is not in [tool.setuptools] packages"
        data = {str(p.relative_to(folder)) for p in folder.rglob("*")
                if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts}
        patterns = tool["package-data"].get(top, [])
        unlisted = {d for d in data if not any(fnmatch.fnmatch(d, pattern) for pattern in patterns)}
        assert not unlisted, f"{top}: package data not listed: {sorted(unlisted)}"


def test_project_metadata_builds_cleanly() -> None:
    data = _pyproject()
    assert isinstance(data["project"]["license"], str)  # an SPDX expression, not the deprecated table
    assert any(r.startswith("setuptools>=77") for r in data["build-system"]["requires"])
    extras = data["project"]["optional-dependencies"]
    dev_extra, test_extra = " ".join(extras["dev"]), " ".join(extras["test"])
    for tool in ("build", "twine", "ruff", "mypy"):  # CI's tools, out of the test extra
        assert tool in dev_extra and tool not in test_extra, tool
    # What the tests run is in the test extra, so the documented test command runs them all (actionlint too).
    assert "pytest" in test_extra and "jsonschema" in test_extra and "actionlint" in test_extra
    assert "version" in data["project"]["dynamic"]
    assert data["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "oracle.__version__"}


def test_docs_kernels_snippet_runs(tmp_path: Path) -> None:
    section = (ROOT / "docs" / "kernels.md").read_text()
    code = section[section.index("```python\n") + len("```python\n"):]
    code = code[:code.index("```")]
    script = tmp_path / "snippet.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "aten::mm" in proc.stdout
