"""Engine adapters and the one function that builds them from the config.

A custom engine (`engine.kind: package.module:Class`) and the `engine.preload` modules import
from the user's repository without PYTHONPATH: while they are imported, the working directory
and the config file's folder come first on `sys.path`.

`build_engine` bounds the whole start (preload imports, the constructor: model load, a vLLM
worker's handshake, a started server and the first probe of a server) by the watchdog's start
deadline (`oracle.lifecycle.watchdog.start_timeout`), so an engine that never finishes starting is an
`EngineError` naming the phase, never a hang.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from oracle.config import EngineConfig, VllmOptions
from oracle.engines.contract import Engine, Mode, class_needs_weights, missing_members
from oracle.errors import ConfigError, EngineError, OracleError

if TYPE_CHECKING:
    from oracle.lifecycle.watchdog import Worker

BUILTIN = ("native", "vllm", "openai", "transformers")
# Engines that run the model themselves and so need its weights; the others need config.json only.
RUN_WEIGHTS = ("native", "vllm", "transformers")
# What an engine's start does, for the message when it does not finish in time.
START_WORK = {"native": "model load", "transformers": "model load", "vllm": "worker start and handshake",
              "openai": "server start and first probe"}


# Packages a built-in engine imports beyond the base install, and how to get them (the message names the
# distribution, oracle-determinism, and the extra that brings the package).
ENGINE_PACKAGES: dict[str, tuple[str, str]] = {
    "openai": ("httpx", "pip install 'oracle-determinism[openai]' (or pip install httpx)"),
    "transformers": ("transformers", "pip install 'oracle-determinism[transformers]'"),
}
OPENAI_INSTALL = ENGINE_PACKAGES["openai"][1]


def check_engine_packages(cfg: EngineConfig) -> None:
    """Before the report folder is touched: the packages the built-in engine imports are installed
    (ConfigError naming the package and the install command otherwise). Imports nothing."""
    import importlib.util

    need = ENGINE_PACKAGES.get(cfg.kind)
    if need is None:
        return
    package, install = need
    try:
        found = importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a None entry in sys.modules (a blocked import), a broken package
        found = False
    if not found:
        raise ConfigError(f"engine.kind: the {cfg.kind} engine needs the {package} package, which is not "
                          f"installed: {install}")


def check_engine_config(cfg: EngineConfig) -> None:
    """Fail fast, before any model is made: the kind exists, its packages are installed and every import
    resolves."""
    from oracle.device import check_device

    check_engine_packages(cfg)
    check_device(cfg)
    for i, module in enumerate(cfg.preload):
        _import(module, f"engine.preload.{i}", cfg)
    if ":" in cfg.kind:
        custom_engine_kwargs(cfg, _custom_class(cfg))  # a field the class cannot take fails here, before any run
    elif cfg.kind not in BUILTIN:
        raise ConfigError(f"engine.kind: {cfg.kind!r} is not one of {', '.join(BUILTIN)} or package.module:Class")


def needs_weights(cfg: EngineConfig) -> bool:
    """Whether the engine reads the checkpoint's weights (openai: config.json is enough). A custom engine
    gets them (a hub id is fetched with its weights) unless its class says `needs_weights = False`."""
    if ":" in cfg.kind:
        return class_needs_weights(_custom_class(cfg))
    return cfg.kind in RUN_WEIGHTS


# The validated engine fields a custom engine is given, as keyword arguments, when the config sets them
# and its constructor names them (or takes **kwargs); engine.options are passed besides, and win.
CUSTOM_ENGINE_FIELDS = ("device", "dtype", "max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill",
                        "enable_prefix_caching", "block_size", "num_threads")


def custom_engine_kwargs(cfg: EngineConfig, cls: object) -> dict[str, object]:
    """The keyword arguments of a custom engine's constructor besides model and mode: the engine fields
    the config sets away from their defaults (where it names them or takes **kwargs; otherwise its own
    defaults stand, which may differ from the config's) and those it requires, then engine.options. Such a field that the constructor cannot take is a ConfigError
    naming it, never silently dropped."""
    import inspect

    try:
        params = inspect.signature(cls).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):  # no introspectable signature: the options alone, as before
        return dict(cfg.options)
    named = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    required = {n for n in named if params[n].default is inspect.Parameter.empty}
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
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


def _custom_class(cfg: EngineConfig) -> object:
    module, _, name = cfg.kind.partition(":")
    cls = getattr(_import(module, "engine.kind", cfg), name, None)
    if cls is None or not callable(cls):
        raise ConfigError(f"engine.kind: {module!r} has no class {name!r}")
    return cls


def check_model(cfg: EngineConfig, model_dir: Path) -> None:
    """Before any run: the native engine supports the checkpoint's architecture (ModelError otherwise)."""
    if cfg.kind == "native":
        from oracle.models.architectures import native_architecture

        native_architecture(model_dir)


def check_model_size(cfg: EngineConfig, model_dir: Path, kv_tokens: int = 0,
                     kv_source: str = "schedule.batch_size or sampling.max_tokens") -> None:
    """Before any engine starts: the model's weights and KV cache (a lower bound, `oracle.models.size`) fit
    where the engine puts them; ModelError (exit 2), one line naming the field and the estimate, otherwise.

    native and transformers hold the model on `engine.device` (RAM, or the CUDA device's free
    memory) with `kv_tokens` tokens of KV cache at once (twice that for the native engine's prefix
    cache); vLLM's worker holds it on its GPUs (their free memory) or, without one, in RAM beside its
    fixed KV pool (`engine.options.kv_cache_space_gib`). Engines that do not load the weights here
    (openai, custom) are not checked.
    """
    if cfg.kind not in RUN_WEIGHTS:
        return
    from oracle.models import memory, size
    from oracle.models.architectures import read_config_json

    raw = read_config_json(model_dir)
    path = model_dir / "config.json"
    if cfg.kind == "vllm":
        gpus = memory.gpus_free()
        places = [m for m in (memory.ram_available(), gpus) if m is not None]
        place = max(places, key=lambda m: m.bytes) if places else None
        pool = 0 if gpus is not None else cfg.options_as(VllmOptions).kv_cache_space_gib << 30
        estimate = size.estimate(raw, path, cfg.dtype, kv_bytes=pool)
    else:
        cuda = cfg.device.startswith("cuda")
        place = memory.cuda_free(cfg.device) if cuda else memory.ram_available()
        if cfg.kind == "native" and cfg.enable_prefix_caching:
            kv_tokens *= 2  # the native engine keeps twice the blocks asked for, so cached ones survive
        estimate = size.estimate(raw, path, cfg.dtype, kv_tokens=kv_tokens)
    if estimate is not None and place is not None:
        size.check_fits(estimate, place.bytes, place.what, path, kv_source)


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


def _import(module: str, field: str, cfg: EngineConfig) -> object:
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


CLOSE_LATE_S = 30.0  # how long the run waits for an abandoned engine's close


def build_engine(cfg: EngineConfig, model_dir: Path, mode: Mode, *, worker: Worker | None = None) -> Engine:
    """Build the engine `cfg.kind` for `mode` under the start deadline; EngineError naming the phase when
    it does not finish in time (or raises, or calls sys.exit()).

    The constructor runs on `worker`'s thread (a fresh one when None). An engine whose start was
    abandoned and that finishes starting later is closed at once, so a server or worker it started
    does not outlive the run's error.
    """
    from oracle.lifecycle.watchdog import call, start_timeout

    timeout, limit = start_timeout(cfg)
    lock = threading.Lock()
    given_up = False
    built: list[Engine] = []

    def construct() -> Engine:
        nonlocal given_up
        engine = construct_engine(cfg, model_dir, mode)
        with lock:  # finished and abandoned exclude each other: exactly one side closes a late engine
            late = given_up
            built.append(engine)
        if late:
            _close_quietly(engine)
        return engine

    work = START_WORK.get(cfg.kind, f"{cfg.kind}'s constructor")
    try:
        return call(construct, timeout, "start", worker, f"the {mode} engine's start ({work})", limit)
    except BaseException:
        with lock:
            given_up = True
            late_engines = list(built)
        for engine in late_engines:  # finished in the instant the deadline passed: nobody else will close it
            _close_quietly(engine)
        raise


def _close_quietly(engine: Engine) -> None:
    """Close an engine the run gave up on, in a thread of its own for at most CLOSE_LATE_S: the run is
    already stopping with an error, and the server or worker it started must not outlive it."""
    def close() -> None:
        with contextlib.suppress(BaseException):
            engine.close()

    closer = threading.Thread(target=close, name="oracle-late-close", daemon=True)
    closer.start()
    closer.join(CLOSE_LATE_S)


def construct_engine(cfg: EngineConfig, model_dir: Path, mode: Mode) -> Engine:
    """Build the engine `cfg.kind` for `mode`, after importing `cfg.preload`, in this thread, without a deadline.

    A built-in engine gets `cfg` itself (its typed options: `EngineConfig.options_as`); a custom one
    its keyword arguments (`custom_engine_kwargs`)."""
    for i, module in enumerate(cfg.preload):
        _import(module, f"engine.preload.{i}", cfg)
    if ":" in cfg.kind:
        return _construct_custom(cfg, model_dir, mode)
    from oracle.instances import instance_config

    # A mode's list of URLs (openai): the first server, unless the caller resolved another (cross_instance).
    return builtin_class(cfg.kind)(model_dir, mode, instance_config(cfg, mode, 0))


def builtin_class(kind: str) -> Callable[[Path, Mode, EngineConfig], Engine]:
    """The class of built-in engine `kind`, imported now (each pulls in what it drives: torch, httpx)."""
    if kind == "native":
        from oracle.engines.native import NativeEngine

        return NativeEngine
    if kind == "transformers":
        from oracle.engines.transformers_engine import TransformersEngine

        return TransformersEngine
    if kind == "vllm":
        from oracle.engines.vllm_engine import VllmEngine

        return VllmEngine
    if kind == "openai":
        from oracle.engines.openai_engine import OpenAIEngine

        return OpenAIEngine
    raise ConfigError(f"engine.kind: {kind!r} is not one of {', '.join(BUILTIN)} or package.module:Class")


def _construct_custom(cfg: EngineConfig, model_dir: Path, mode: Mode) -> Engine:
    """A user's `module:Class`, called as `Class(model=..., mode=..., **custom_engine_kwargs(cfg, Class))`."""
    cls = _custom_class(cfg)
    kwargs = custom_engine_kwargs(cfg, cls)
    try:
        engine = cls(model=model_dir, mode=mode, **kwargs)  # type: ignore[operator]
    except TypeError as e:
        raise ConfigError(f"engine.options: {cfg.kind}: {e}") from e
    except OracleError:
        raise
    except Exception as e:  # noqa: BLE001 - a user's engine may raise anything while starting
        raise EngineError(f"engine {cfg.kind} failed to start: {type(e).__name__}: {e}") from e
    missing = missing_members(engine)
    if missing:
        raise ConfigError(f"engine.kind: {cfg.kind} lacks {', '.join(missing)} (see the engine protocol, "
                          "oracle.engines.contract.Engine)")
    return engine  # type: ignore[no-any-return]
