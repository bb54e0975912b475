"""The example configs that ship with the package (`configs/`, installed as `oracle/configs/`) and
`oracle config init`, which copies one into the user's folder.

In a wheel the configs sit inside the package (`[tool.setuptools.package-dir] oracle.configs`); in a
checkout they are the repository's `configs/` folder beside the package.
"""

from __future__ import annotations

from pathlib import Path

from oracle.engines.kinds import example_configs
from oracle.errors import ConfigError

# The example `oracle config init --engine KIND` writes for each built-in engine (each row's `example`).
BY_ENGINE = example_configs()
DEFAULT_PATH = Path("oracle.yaml")  # named oracle*.yaml, so pytest also collects it as a test


def example_dir() -> Path:
    """The folder of the shipped configs: inside the installed package, else the checkout's `configs/`."""
    package = Path(__file__).resolve().parent
    for folder in (package / "configs", package.parent / "configs"):
        if (folder / f"{BY_ENGINE['native']}.yaml").is_file():
            return folder
    raise ConfigError(f"the example configs are missing from this install (looked in {package / 'configs'}); "
                      "reinstall oracle-determinism")


def example_names() -> list[str]:
    """The shipped configs by name (file stem): tiny, server, vllm-cpu, ..."""
    return sorted(p.stem for p in example_dir().glob("*.yaml"))


def example_text(name: str) -> str:
    """The text of the shipped config `name` (ConfigError naming the choices for an unknown one)."""
    path = example_dir() / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"--example: no example config {name!r}; one of {', '.join(example_names())}")
    return path.read_text(encoding="utf-8")


def write_example(path: Path, *, engine: str | None = None, name: str | None = None, force: bool = False) -> str:
    """Write the example for `engine` (or the example `name`; default: the native engine's) to `path`;
    refuses to overwrite a file unless `force`. Returns the example's name."""
    if engine is not None and engine not in BY_ENGINE:
        raise ConfigError(f"--engine: no example config for {engine!r}; one of {', '.join(BY_ENGINE)}")
    chosen = name or BY_ENGINE[engine or "native"]
    text = example_text(chosen)
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder; give the config file to write")
    if path.exists() and not force:
        raise ConfigError(f"{path}: already exists; pass --force to overwrite it")
    header = f"# Written by `oracle config init` from the example {chosen}.yaml; `oracle run {path}` runs it.\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(header + text, encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot write the config ({e.strerror or e})") from e
    return chosen
