"""Engine adapters, and the checks and the constructor that read each kind's row (`oracle.engines.kinds`).

Before any model is made, `resolve_engine` checks the kind exists, its packages are installed and every
import resolves, and returns its row: a run resolves it once (the plan's `engine`) and hands it to every
later reader; `check_model` and `check_model_size` check that the engine can run the checkpoint and that
it fits. `construct_engine` builds the engine `cfg.kind` for one mode, in this thread;
`oracle.lifecycle.watchdog.build_engine` does so under the start deadline. Engines named by import path
(`module:Class`, `engine.preload`) are `oracle.engines.custom`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from oracle.config import EngineConfig
from oracle.engines.contract import Engine, Mode
from oracle.engines.custom import (
    CUSTOM_ENGINE_FIELDS,
    custom_class,
    custom_engine_kwargs,
    import_dirs,
    import_module,
)
from oracle.engines.kinds import EngineKind, class_row, kind_of, known_row, unknown_kind
from oracle.errors import ConfigError

if TYPE_CHECKING:
    from oracle.models.facts import ModelFacts

__all__ = ["CUSTOM_ENGINE_FIELDS", "check_device", "check_engine_config", "check_engine_packages", "check_model", "check_model_size",
           "construct_engine", "custom_class", "custom_engine_kwargs", "import_dirs", "needs_weights", "resolve_engine"]


def check_engine_packages(cfg: EngineConfig, row: EngineKind | None = None) -> None:
    """Before the report folder is touched: the packages the engine's row names are installed (ConfigError
    naming the package and the install command otherwise). Imports nothing of them. `row`: the kind's, when
    known (else looked up without importing a `module:Class`)."""
    _check_packages(cfg, row or known_row(cfg.kind))


def _check_packages(cfg: EngineConfig, row: EngineKind | None) -> None:
    import importlib.util

    if row is None:
        return  # a module:Class names its own imports; resolve_engine imports it
    needs = [("engine.kind", package, row.install) for package in row.packages] + row.config_packages(cfg)
    for field, package, install in needs:
        try:
            found = importlib.util.find_spec(package) is not None
        except (ImportError, ValueError):  # a None entry in sys.modules (a blocked import), a broken package
            found = False
        if not found:
            what = f"the {cfg.kind} engine" if field == "engine.kind" else "the server it starts"
            raise ConfigError(f"{field}: {what} needs the {package} package, which is not installed: {install}")


def check_device(cfg: EngineConfig, row: EngineKind | None = None) -> None:
    """`engine.device` is one this torch can give (oracle.device), where the engine runs the model in this
    process (its row's `uses_device`; vLLM picks its device in its own worker, a server is wherever it runs).
    `row`: the kind's, when known (else looked up, a `module:Class` not imported)."""
    _check_device(cfg, row or known_row(cfg.kind))


def _check_device(cfg: EngineConfig, row: EngineKind | None) -> None:
    from oracle import device

    if row is None or row.uses_device:
        device.check_device(cfg)


def resolve_engine(cfg: EngineConfig) -> EngineKind:
    """The engine's row, resolved once for a run, failing fast before any model is made: the kind exists, its
    packages are installed, `engine.device` is one this torch can give (where the engine runs here), and every
    import resolves (the preloads first, then a `module:Class`, imported here once)."""
    row = known_row(cfg.kind)
    _check_packages(cfg, row)
    _check_device(cfg, row)
    for i, module in enumerate(cfg.preload):
        import_module(module, f"engine.preload.{i}", cfg)
    if row is None:  # a module:Class, imported once here; an unknown kind, or one that does not import, fails
        if ":" not in cfg.kind:
            raise unknown_kind(cfg.kind)
        cls = custom_class(cfg)
        row = class_row(cfg.kind, cls, user_code=True)
        custom_engine_kwargs(cfg, cls)  # a field the class cannot take fails here, before any run
    return row


def check_engine_config(cfg: EngineConfig) -> None:
    """Fail fast, before any model is made: the kind exists, its packages are installed and every import
    resolves (`resolve_engine`)."""
    resolve_engine(cfg)


def needs_weights(cfg: EngineConfig, row: EngineKind | None = None) -> bool:
    """Whether the engine reads the checkpoint's weights (openai: config.json is enough). A custom engine
    gets them (a hub id is fetched with its weights) unless its class says `needs_weights = False`."""
    return (row or kind_of(cfg)).runs_weights


def check_model(cfg: EngineConfig, facts: ModelFacts, row: EngineKind | None = None) -> None:
    """Before any run: the engine can run the checkpoint's architecture (ModelError otherwise; the native
    engine's architectures are its own)."""
    row = row or kind_of(cfg)
    if row.check_model is not None:
        row.check_model(cfg, facts)


def check_model_size(cfg: EngineConfig, facts: ModelFacts, kv_tokens: int = 0,
                     kv_source: str = "schedule.batch_size or sampling.max_tokens", row: EngineKind | None = None) -> None:
    """Before any engine starts: the model's weights and KV cache (a lower bound, `oracle.models.size`) fit
    where the engine puts them (its row's `fits`); ModelError (exit 2), one line naming the field and the
    estimate, otherwise. Engines that do not load the weights here (openai, custom) are not checked."""
    row = row or kind_of(cfg)
    if row.fits is not None:
        row.fits(cfg, facts, kv_tokens, kv_source)


def construct_engine(cfg: EngineConfig, model_dir: Path, mode: Mode, row: EngineKind | None = None) -> Engine:
    """Build the engine `cfg.kind` for `mode`, after importing `cfg.preload`, in this thread, without a deadline.

    A built-in engine gets `cfg` itself (its typed options: `EngineConfig.options_as`); a custom one
    its keyword arguments (`custom_engine_kwargs`). `row`: the kind's, resolved by the plan (else here)."""
    for i, module in enumerate(cfg.preload):
        import_module(module, f"engine.preload.{i}", cfg)
    row = row or kind_of(cfg)
    # A mode's list of URLs (openai): the first server, unless the caller resolved another (cross_instance).
    return row.build(row.instance(cfg, mode, 0), model_dir, mode)


