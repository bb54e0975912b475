"""The example configs that ship with the package (`configs/`, installed as `oracle/configs/`) and
`oracle config init`, which copies one into the user's folder.

In a wheel the configs sit inside the package (`[tool.setuptools.package-dir] oracle.configs`); in a
checkout they are the repository's `configs/` folder beside the package.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from oracle.engines.kinds import example_configs
from oracle.errors import ConfigError

# The example `oracle config init --engine KIND` writes for each built-in engine (each row's `example`).
BY_ENGINE = example_configs()
DEFAULT_PATH = Path("oracle.yaml")  # named oracle*.yaml, so pytest also collects it as a test


@dataclass(frozen=True)
class FileExample:
    """An example of `examples/` (installed as `oracle/examples/`): `main` is written to the PATH given
    (`default` when none is), each of `beside` under its own name in PATH's folder, where the config
    finds it (a custom engine's module is imported from the config file's folder)."""

    main: str
    beside: tuple[str, ...] = ()
    default: Path = DEFAULT_PATH
    is_config: bool = True


FILE_EXAMPLES = {
    "custom-engine": FileExample("custom_engine.yaml", ("custom_engine.py",)),
    "sharded-workflow": FileExample("oracle-sharded.yml", default=Path("oracle-sharded.yml"), is_config=False),
}


def example_dir() -> Path:
    """The folder of the shipped configs: inside the installed package, else the checkout's `configs/`."""
    package = Path(__file__).resolve().parent
    for folder in (package / "configs", package.parent / "configs"):
        if (folder / f"{BY_ENGINE['native']}.yaml").is_file():
            return folder
    raise ConfigError(f"the example configs are missing from this install (looked in {package / 'configs'}); "
                      "reinstall oracle-determinism")


def files_dir() -> Path:
    """The folder of `examples/`: inside the installed package, else the checkout's `examples/`."""
    package = Path(__file__).resolve().parent
    for folder in (package / "examples", package.parent / "examples"):
        if all((folder / f.main).is_file() for f in FILE_EXAMPLES.values()):
            return folder
    raise ConfigError(f"the examples are missing from this install (looked in {package / 'examples'}); "
                      "reinstall oracle-determinism")


def example_names() -> list[str]:
    """The shipped configs by name (file stem): tiny, server, vllm-cpu, ..."""
    return sorted(p.stem for p in example_dir().glob("*.yaml"))


def example_text(name: str) -> str:
    """The text of the shipped config `name` (ConfigError naming the choices for an unknown one)."""
    if name in FILE_EXAMPLES:
        return (files_dir() / FILE_EXAMPLES[name].main).read_text(encoding="utf-8")
    names = example_names()
    if name not in names:  # a name, never a path (`../x` would read a file outside the shipped examples)
        raise ConfigError(f"--example: no example {name[:80]!r}; one of {', '.join([*names, *FILE_EXAMPLES])}")
    return (example_dir() / f"{name}.yaml").read_text(encoding="utf-8")


def default_path(name: str | None) -> Path:
    """Where `oracle config init --example NAME` writes when no PATH is given."""
    return FILE_EXAMPLES[name].default if name in FILE_EXAMPLES else DEFAULT_PATH


def write_example(path: Path, *, engine: str | None = None, name: str | None = None, force: bool = False) -> str:
    """Write the example for `engine` (or the example `name`; default: the native engine's) to `path`, and
    the files a file example needs beside it; refuses to overwrite any file (or to write through a symbolic
    link) unless `force`. Returns the example's name."""
    chosen = _chosen(engine, name)
    text = example_text(chosen)
    extra = FILE_EXAMPLES.get(chosen, FileExample(""))
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder; give the file to write")
    targets = {path: text, **{path.parent / f: (files_dir() / f).read_text(encoding="utf-8") for f in extra.beside}}
    for target in targets:
        _refuse_special(target)
    if not force:
        for target in targets:
            _refuse_to_replace(target)
    if extra.is_config:
        targets[path] = (f"# Written by `oracle config init` from the example {chosen}; `oracle run {path}` "
                         "runs it.\n" + for_user(text, chosen, path))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for target, content in targets.items():
            _write_new(target, content, force)
    except OSError as e:
        raise ConfigError(f"{path}: cannot write the example ({e.strerror or e})") from e
    return chosen


# A shipped config named by its path in the repository (`configs/tiny.yaml`), which an installed wheel lacks.
_SHIPPED_PATH = re.compile(r"\bconfigs/([A-Za-z0-9_.-]+)\.yaml\b")


def for_user(text: str, name: str, path: Path) -> str:
    """An example's text as the user's file: its own repository path becomes `path`, another shipped config's
    the command that writes it (a wheel user has no `configs/` folder)."""
    def named(m: re.Match[str]) -> str:
        return str(path) if m.group(1) == name else f"the {m.group(1)} example (oracle config init --example {m.group(1)})"

    return _SHIPPED_PATH.sub(named, text)


def _chosen(engine: str | None, name: str | None) -> str:
    """The example's name: `name`, else the engine kind's (the native engine's by default)."""
    if engine is not None and engine not in BY_ENGINE:
        raise ConfigError(f"--engine: no example config for {engine!r}; one of {', '.join(BY_ENGINE)}")
    return name if name is not None else BY_ENGINE[engine or "native"]


def _refuse_to_replace(target: Path) -> None:
    """ConfigError where `target` is a file or a symbolic link already (without --force)."""
    _refuse_special(target)
    if target.is_symlink():  # dangling or not: writing through it would write where it points
        raise ConfigError(f"{target}: is a symbolic link (to {os.readlink(target)}); give the file's own "
                          "path, or pass --force to replace the link itself")
    if target.exists():
        raise ConfigError(f"{target}: already exists; pass --force to overwrite it")


def _refuse_special(target: Path) -> None:
    """ConfigError where `target` is a device, a FIFO or a socket (`/dev/full`): --force replaces a file or a
    link, never one of those, and a write into one is not a file the user can run."""
    if target.exists() and not target.is_symlink() and not target.is_file() and not target.is_dir():
        raise ConfigError(f"{target}: not a regular file (a device, FIFO or socket); give the path of a file to write")


def _write_new(path: Path, content: str, force: bool) -> None:
    """A new name, then a rename over `path`: never through a link that appears meanwhile (O_EXCL), and with
    `force` the link itself is replaced, not the file it points to."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "x", encoding="utf-8") as f:
        f.write(content)
    try:
        if not force and (path.exists() or path.is_symlink()):
            raise ConfigError(f"{path}: already exists; pass --force to overwrite it")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
