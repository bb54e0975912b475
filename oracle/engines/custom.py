"""Engines named by import path: a user's `package.module:Class` and the `engine.preload` modules.

They import from the user's repository without PYTHONPATH: while they are imported, the working
directory and the config file's folder come first on `sys.path`. A class (a `module:Class` kind, or
one an `oracle.engines` entry point names) is called as `Class(model=..., mode=..., **keyword
arguments)`: the engine fields its constructor names and engine.options (`custom_engine_kwargs`).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from oracle.config import EngineConfig
from oracle.engines.contract import Engine, Mode, missing_members
from oracle.errors import ConfigError, OracleError, engine_error

# The validated engine fields a custom engine is given, as keyword arguments, when the config sets them
# and its constructor names them (or takes **kwargs); engine.options are passed besides, and win.
CUSTOM_ENGINE_FIELDS = ("device", "dtype", "max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill",
                        "enable_prefix_caching", "block_size", "num_threads")


def custom_engine_kwargs(cfg: EngineConfig, cls: object) -> dict[str, object]:
    """The keyword arguments of a custom engine's constructor besides model and mode: the engine fields
    the config sets away from their defaults (where it names them or takes **kwargs; otherwise its own
    defaults stand, which may differ from the config's) and those it requires, then engine.options. Such a field that the constructor cannot take is a ConfigError
    naming it, never silently dropped."""
    try:
        params = inspect.signature(cls).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):  # no introspectable signature: the options alone, as before
        return dict(cfg.options)
    named, required, var_kw = _keywords(params)
    kwargs: dict[str, object] = {}
    for field in CUSTOM_ENGINE_FIELDS:
        # "Set" means away from its default: a report's resolved config (replay) spells out every field.
        given = getattr(cfg, field) != EngineConfig.model_fields[field].default
        if field in required or (given and (field in named or var_kw)):
            kwargs[field] = getattr(cfg, field)
        elif given and field not in cfg.options:
            raise ConfigError(f"engine.{field}: {cfg.kind} takes no {field} argument, so the field would have "
                              f"no effect; add `{field}` to its __init__ or remove the field")
    kwargs.update(cfg.options)
    return kwargs


def _keywords(params: Mapping[str, inspect.Parameter]) -> tuple[set[str], set[str], bool]:
    """A constructor's parameters that can be passed by keyword, those of them without a default, and
    whether it takes **kwargs."""
    named = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    required = {n for n in named if params[n].default is inspect.Parameter.empty}
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
    return named, required, var_kw


def custom_class(cfg: EngineConfig) -> object:
    """The class a `module:Class` kind names, imported from the user's folders."""
    module, _, name = cfg.kind.partition(":")
    cls = getattr(import_module(module, "engine.kind", cfg), name, None)
    if cls is None or not callable(cls):
        raise ConfigError(f"engine.kind: {module!r} has no class {name!r}")
    return cls


def import_dirs(cfg: EngineConfig) -> list[str]:
    """Where a custom engine is looked for besides sys.path: the working directory, the config's folder."""
    dirs = [os.getcwd()]
    base = cfg.base_dir
    if base is not None:
        dirs.append(str(Path(base).resolve()))
    return list(dict.fromkeys(dirs))


@contextlib.contextmanager
def _user_path(cfg: EngineConfig) -> Iterator[None]:
    """The user's folders first on sys.path while importing; sys.path is restored afterwards."""
    before = list(sys.path)
    sys.path[:0] = [d for d in import_dirs(cfg) if d not in sys.path]
    try:
        yield
    finally:
        sys.path[:] = before


def import_module(module: str, field: str, cfg: EngineConfig) -> object:
    try:
        with _user_path(cfg):
            return importlib.import_module(module)
    except ImportError as e:
        where = ", ".join(import_dirs(cfg))
        raise ConfigError(f"{field}: cannot import {module!r} ({e}); looked in {where} and sys.path") from e
    except OracleError:
        raise
    except Exception as e:  # noqa: BLE001 - a user's module may raise anything while importing
        raise ConfigError(f"{field}: importing {module!r} raised {type(e).__name__}: {e}") from e


def construct_class(cfg: EngineConfig, cls: object, model_dir: Path, mode: Mode) -> Engine:
    """An engine class that is not built in (`module:Class`, or one an entry point names), called as
    `Class(model=..., mode=..., **custom_engine_kwargs(cfg, Class))`."""
    kwargs = custom_engine_kwargs(cfg, cls)
    try:
        engine = cls(model=model_dir, mode=mode, **kwargs)  # type: ignore[operator]
    except TypeError as e:
        raise ConfigError(f"engine.options: {cfg.kind}: {e}") from e
    except OracleError:
        raise
    except Exception as e:  # noqa: BLE001 - a user's engine may raise anything while starting
        raise engine_error(e, f"the start of {cfg.kind}") from e
    missing = missing_members(engine)
    if missing:
        raise ConfigError(f"engine.kind: {cfg.kind} lacks {', '.join(missing)} (see the engine protocol, "
                          "oracle.engines.contract.Engine)")
    return engine  # type: ignore[no-any-return]
