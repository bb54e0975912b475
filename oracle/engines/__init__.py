"""Engine adapters, and the checks and the constructor that read each kind's row (`oracle.engines.kinds`).

Before any model is made, `check_engine_config` checks the kind exists, its packages are installed
and every import resolves; `check_model` and `check_model_size` that the engine can run the
checkpoint and that it fits. `construct_engine` builds the engine `cfg.kind` for one mode, in this
thread; `oracle.lifecycle.watchdog.build_engine` does so under the start deadline. Engines named by
import path (`module:Class`, `engine.preload`) are `oracle.engines.custom`'s.
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
from oracle.engines.kinds import kind_of, known_row
from oracle.errors import ConfigError

if TYPE_CHECKING:
    from oracle.models.facts import ModelFacts

__all__ = ["CUSTOM_ENGINE_FIELDS", "check_engine_config", "check_engine_packages", "check_model", "check_model_size",
           "construct_engine", "custom_class", "custom_engine_kwargs", "import_dirs", "needs_weights"]


def check_engine_packages(cfg: EngineConfig) -> None:
    """Before the report folder is touched: the packages the engine's row names are installed (ConfigError
    naming the package and the install command otherwise). Imports nothing of them."""
    import importlib.util

    row = known_row(cfg.kind)
    if row is None:
        return  # a module:Class names its own imports; check_engine_config imports it
    needs = [("engine.kind", package, row.install) for package in row.packages] + row.config_packages(cfg)
    for field, package, install in needs:
        try:
            found = importlib.util.find_spec(package) is not None
        except (ImportError, ValueError):  # a None entry in sys.modules (a blocked import), a broken package
            found = False
        if not found:
            what = f"the {cfg.kind} engine" if field == "engine.kind" else "the server it starts"
            raise ConfigError(f"{field}: {what} needs the {package} package, which is not installed: {install}")


def check_engine_config(cfg: EngineConfig) -> None:
    """Fail fast, before any model is made: the kind exists, its packages are installed and every import
    resolves."""
    from oracle.device import check_device

    check_engine_packages(cfg)
    check_device(cfg)
    for i, module in enumerate(cfg.preload):
        import_module(module, f"engine.preload.{i}", cfg)
    if kind_of(cfg).user_code:  # an unknown kind, or a module:Class that does not import, fails in kind_of
        custom_engine_kwargs(cfg, custom_class(cfg))  # a field the class cannot take fails here, before any run


def needs_weights(cfg: EngineConfig) -> bool:
    """Whether the engine reads the checkpoint's weights (openai: config.json is enough). A custom engine
    gets them (a hub id is fetched with its weights) unless its class says `needs_weights = False`."""
    return kind_of(cfg).runs_weights


def check_model(cfg: EngineConfig, facts: ModelFacts) -> None:
    """Before any run: the engine can run the checkpoint's architecture (ModelError otherwise; the native
    engine's architectures are its own)."""
    row = kind_of(cfg)
    if row.check_model is not None:
        row.check_model(cfg, facts)


def check_model_size(cfg: EngineConfig, facts: ModelFacts, kv_tokens: int = 0,
                     kv_source: str = "schedule.batch_size or sampling.max_tokens") -> None:
    """Before any engine starts: the model's weights and KV cache (a lower bound, `oracle.models.size`) fit
    where the engine puts them (its row's `fits`); ModelError (exit 2), one line naming the field and the
    estimate, otherwise. Engines that do not load the weights here (openai, custom) are not checked."""
    row = kind_of(cfg)
    if row.fits is not None:
        row.fits(cfg, facts, kv_tokens, kv_source)


def construct_engine(cfg: EngineConfig, model_dir: Path, mode: Mode) -> Engine:
    """Build the engine `cfg.kind` for `mode`, after importing `cfg.preload`, in this thread, without a deadline.

    A built-in engine gets `cfg` itself (its typed options: `EngineConfig.options_as`); a custom one
    its keyword arguments (`custom_engine_kwargs`)."""
    for i, module in enumerate(cfg.preload):
        import_module(module, f"engine.preload.{i}", cfg)
    row = kind_of(cfg)
    # A mode's list of URLs (openai): the first server, unless the caller resolved another (cross_instance).
    return row.build(row.instance(cfg, mode, 0), model_dir, mode)


