"""What a vLLM worker resolved at start, read from its `VllmConfig` and from its ranks' own reports: the posture
(`oracle.posture.FIELDS`) and the threads. Imports nothing of vLLM: it reads attributes, and what a vLLM version
does not expose reads "unknown", never guessed."""

from __future__ import annotations

import contextlib
from typing import Any

_UNKNOWN = "unknown"
# Environment variables of the worker that decide kernels, reductions or scheduling (the posture's `env`).
_POSTURE_ENV = ("VLLM_BATCH_INVARIANT", "VLLM_ATTENTION_BACKEND", "VLLM_FLASH_ATTN_VERSION",
                "VLLM_USE_FLASHINFER_SAMPLER", "VLLM_CPU_ATTN_SPLIT_KV", "CUBLAS_WORKSPACE_CONFIG", "NCCL_ALGO",
                "NCCL_PROTO", "OMP_NUM_THREADS")
_THREAD_ENV = ("OMP_NUM_THREADS", "VLLM_CPU_ATTN_SPLIT_KV", "VLLM_BATCH_INVARIANT", "VLLM_CPU_OMP_THREADS_BIND")
# Compilation passes that shard activations across ranks (sequence parallelism and its fused kin).
_SP_PASSES = ("enable_sp", "enable_sequence_parallelism", "fuse_gemm_comms")


def agreed(values: list[Any]) -> Any:
    """One value where every rank agrees, else each rank's value in rank order ("rank 0: x; rank 1: y")."""
    if not values:
        return _UNKNOWN
    if all(v == values[0] for v in values):
        return values[0]
    return "; ".join(f"rank {i}: {v}" for i, v in enumerate(values))


def _per_rank(ranks: list[dict[str, Any]], key: str) -> list[Any]:
    """Each rank's `key`, in rank order ("unknown" where a rank did not report it)."""
    return [r.get(key, _UNKNOWN) for r in ranks]


def _environ(keys: tuple[str, ...]) -> dict[str, str]:
    import os

    return {k: os.environ[k] for k in keys if k in os.environ}


def _read(obj: Any, *path: str) -> Any:
    """`obj.a.b...` along `path`, "unknown" where an attribute on the way is missing or None."""
    for name in path:
        obj = getattr(obj, name, None)
        if obj is None:
            return _UNKNOWN
    return obj


def _text(value: Any) -> Any:
    """A setting as a report holds it: a scalar as it is, anything else as its text."""
    return value if isinstance(value, (bool, int, float, str)) else str(value)


def _attention(cfg: Any, ranks: list[dict[str, Any]]) -> Any:
    """The ranks' attention backend (at TP > 1 this process holds no attention layer), with FlashAttention's
    version where it is FlashAttention."""
    attention = agreed(_per_rank(ranks, "attention_backend"))
    if "FLASH_ATTN" not in attention:
        return attention
    fa_version = _read(cfg, "attention_config", "flash_attn_version")
    with contextlib.suppress(Exception):
        from vllm.v1.attention.backends.fa_utils import get_flash_attn_version

        fa_version = get_flash_attn_version() if fa_version == _UNKNOWN else fa_version
    return attention + (f" (FA{fa_version})" if fa_version not in (_UNKNOWN, None) else "")


def _is_sp_pass(name: str) -> bool:
    return name in _SP_PASSES or "sequence_parallel" in name or "async_tp" in name


def _sequence_parallel(cfg: Any) -> bool:
    """Whether any compilation pass that shards activations across ranks is on."""
    passes = _read(cfg, "compilation_config", "pass_config")
    flags = {k: v for k, v in vars(passes).items() if isinstance(v, bool)} if passes != _UNKNOWN else {}
    return any(v for k, v in flags.items() if _is_sp_pass(k))


def _graphs(cfg: Any, enforce_eager: bool) -> dict[str, Any]:
    """CUDA graphs (mode and captured sizes) and torch.compile's mode; all off when eager."""
    if enforce_eager:
        return {"cuda_graphs": "off", "cuda_graph_sizes": [], "compile_mode": "none (eager)"}
    sizes = _read(cfg, "compilation_config", "cudagraph_capture_sizes")
    return {"cuda_graphs": _text(_read(cfg, "compilation_config", "cudagraph_mode")),
            "cuda_graph_sizes": list(sizes) if isinstance(sizes, list) else [],
            "compile_mode": _text(_read(cfg, "compilation_config", "mode"))}


def _spec_decoding(cfg: Any) -> Any:
    spec_cfg = _read(cfg, "speculative_config")
    return "none" if spec_cfg in (_UNKNOWN, None) else _text(getattr(spec_cfg, "method", spec_cfg))


def _sampler(device: Any) -> str:
    """vLLM's top-k/top-p sampler: FlashInfer's on CUDA unless VLLM_USE_FLASHINFER_SAMPLER=0, else PyTorch's."""
    import os

    if str(device).startswith("cuda") and os.environ.get("VLLM_USE_FLASHINFER_SAMPLER", "1") != "0":
        return "flashinfer (top-k/top-p)"
    return "pytorch (vLLM's TopKTopPSampler)"


def read_posture(engine: Any, enforce_eager: bool, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The settings vLLM resolved at start (`oracle.posture.FIELDS`), read from its `VllmConfig` and, for what
    only the processes that run the model know (device, attention backend, all-reduce, linear kernels), from
    each rank's own report (`ranks`); whatever this vLLM version does not expose is "unknown", never guessed."""
    cfg = getattr(engine, "vllm_config", None)
    device = _text(_read(cfg, "device_config", "device"))
    return {
        "engine": "vllm", "device": device, "dtype": _text(_read(cfg, "model_config", "dtype")).removeprefix("torch."),
        "attention_backend": _attention(cfg, ranks),
        **_graphs(cfg, enforce_eager),
        "async_scheduling": _text(_read(cfg, "scheduler_config", "async_scheduling")),
        "chunked_prefill": _text(_read(cfg, "scheduler_config", "enable_chunked_prefill")),
        "prefix_caching": _text(_read(cfg, "cache_config", "enable_prefix_caching")),
        "spec_decoding": _spec_decoding(cfg),
        "tensor_parallel": _text(_read(cfg, "parallel_config", "tensor_parallel_size")),
        "pipeline_parallel": _text(_read(cfg, "parallel_config", "pipeline_parallel_size")),
        "sequence_parallel": _sequence_parallel(cfg), "all_reduce": agreed(_per_rank(ranks, "all_reduce")),
        "rank_devices": _per_rank(ranks, "device") or _UNKNOWN,
        "sampler": _sampler(device), "kv_cache_dtype": _text(_read(cfg, "cache_config", "cache_dtype")),
        "quantization": _text(getattr(getattr(cfg, "model_config", None), "quantization", None) or "none"),
        "linear_kernel": agreed(_per_rank(ranks, "linear_kernel")),
        "env": _environ(_POSTURE_ENV),
    }


def threads() -> dict[str, Any]:
    import torch

    return {"torch_threads": torch.get_num_threads(), "env": _environ(_THREAD_ENV)}
