"""Every code block of README.md and docs/*.md works when copied: a workflow names the Action and a config
that exist, a config loads as written (and the ones on the native engine run, with a tiny model and few
trials), a Kubernetes manifest names shipped configs, Python compiles, every `oracle ...` command line
parses; and .ci/run runs exactly the README's set-up commands. docs/results/ holds measured figures, not
instructions, and is left out."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from oracle.cli import _parser, main
from oracle.config import load_config

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]  # glob("*.md"): docs/results/ is a folder


def blocks(lang: str) -> list[tuple[str, int, str]]:
    """(page, index, text) of every ```lang block of every page."""
    found = []
    for page in PAGES:
        texts = re.findall(rf"^```{lang}\n(.*?)^```", page.read_text(encoding="utf-8"), re.M | re.S)
        found += [(page.relative_to(ROOT).as_posix(), i, text) for i, text in enumerate(texts)]
    return found


def _is_workflow(data: Any) -> bool:
    return isinstance(data, dict) and "jobs" in data


def _is_kubernetes(data: Any) -> bool:
    """A Kubernetes manifest (an Indexed Job running oracle), not an oracle config."""
    return isinstance(data, dict) and "spec" in data and "model" not in data


def _is_hazards(data: Any) -> bool:
    """A hazards file (a list of entries; test_hazard_gate loads docs/hazards.md's as one)."""
    return isinstance(data, list)


def _is_config(data: Any) -> bool:
    return not (_is_workflow(data) or _is_kubernetes(data) or _is_hazards(data))


def _params(lang: str, keep: Any = lambda text: True) -> list[Any]:
    return [pytest.param(page, text, id=f"{page}-{lang}{i}") for page, i, text in blocks(lang) if keep(text)]


def test_the_pages_have_blocks_of_every_kind() -> None:
    assert any(p.name == "install.md" for p in PAGES) and not any("results" in p.parts for p in PAGES)
    yamls = [yaml.safe_load(text) for _, _, text in blocks("yaml")]
    assert sum(map(_is_config, yamls)) >= 3 and any(map(_is_workflow, yamls)) and any(map(_is_kubernetes, yamls))
    assert blocks("python") and blocks("bash")


@pytest.mark.parametrize(("page", "text"), _params("yaml", lambda t: _is_kubernetes(yaml.safe_load(t))))
def test_kubernetes_commands_name_shipped_configs(page: str, text: str) -> None:
    paths = re.findall(r"oracle run (\S+\.yaml)", text)
    assert paths
    for path in paths:
        assert (ROOT / path).is_file(), path


@pytest.mark.parametrize(("page", "text"), _params("yaml", lambda t: _is_config(yaml.safe_load(t))))
def test_every_config_loads_as_written(tmp_path: Path, page: str, text: str) -> None:
    path = tmp_path / "block.yaml"
    path.write_text(text)
    config = load_config(path)
    assert config.model


@pytest.mark.parametrize(("page", "text"), _params("yaml", lambda t: _is_workflow(yaml.safe_load(t))))
def test_every_workflow_names_files_that_exist(page: str, text: str) -> None:
    workflow = yaml.safe_load(text)
    steps = [s for job in workflow["jobs"].values() for s in job["steps"]]
    action = next(s for s in steps if str(s.get("uses", "")).startswith("./"))
    assert (ROOT / action["uses"] / "action.yml").is_file()
    assert (ROOT / action["with"]["config"]).is_file()


@pytest.mark.parametrize(("page", "text"), _params("python"))
def test_every_python_block_compiles(page: str, text: str) -> None:
    compile(text, page, "exec")


def _oracle_commands() -> list[Any]:
    """Every `oracle ...` command of a bash block; a synopsis line (`[--seed N]`, `a|b`) is not a command."""
    found = []
    for page, i, text in blocks("bash"):
        for line in text.replace("\\\n", " ").splitlines():  # continued lines joined
            line = re.sub(r"\s+#.*$", "", line).strip()
            line = re.sub(r"\s+\d?>.*$", "", line)  # a redirection is the shell's, not oracle's
            for part in re.split(r"&&|;|\|\|", line):
                part = part.strip()
                if part.startswith("oracle ") and not re.search(r"[\[\]|]|\.\.\.", part):
                    found.append(pytest.param(part, id=f"{page}-bash{i}: {part[:60]}"))
    return found


@pytest.mark.parametrize("command", _oracle_commands())
def test_every_oracle_command_line_parses(command: str) -> None:
    argv = shlex.split(command)[1:]
    try:
        _parser().parse_args(argv)
    except SystemExit as e:  # --version and --help exit 0 after printing; a usage error exits 2
        assert e.code == 0, command


def test_a_wrong_command_line_is_caught() -> None:
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(shlex.split("run configs/tiny.yaml --trails 3"))
    assert e.value.code == 2


def _setup_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Set-up\n")[1].split("\n## ")[0]
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_the_readme_set_up_is_two_commands_and_ci_runs_exactly_them() -> None:
    install_and_run, tests = _setup_commands()
    assert "oracle run configs/tiny.yaml" in install_and_run and "--index-url" in install_and_run
    assert tests.endswith("pytest -n 2")
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    # CI's machine holds the CPU wheel and cannot reach PyTorch's index: the same command from the machine's index.
    # CI runs each `&&` part on its own line, in order: under `set -e` a failure before the last `&&` goes on.
    for command in (install_and_run.replace(" --index-url https://download.pytorch.org/whl/cpu", ""), tests):
        parts = [p.strip() for p in command.split("&&")]
        assert any(ci[i:i + len(parts)] == parts for i in range(len(ci))), command


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs-model") / "tiny"
    assert main(["model", "make", "tiny-qwen3", str(out)]) == 0
    return out


def _native(text: str) -> bool:
    data = yaml.safe_load(text)
    return _is_config(data) and data.get("engine", {}).get("kind", "native") == "native"


@pytest.mark.slow
@pytest.mark.parametrize(("page", "text"), _params("yaml", _native))
def test_native_configs_run(tmp_path: Path, tiny_dir: Path, page: str, text: str) -> None:
    path = tmp_path / "block.yaml"
    path.write_text(text)
    report = tmp_path / "report"
    code = main(["run", str(path), "--model", str(tiny_dir), "--trials", "2", "--seed", "7",
                 "--report-dir", str(report)])
    assert code == 0, (report / "summary.md").read_text()
    assert (report / "report.json").is_file()
