"""A fake engine that describes itself as vLLM 0.26 on CUDA with `invariance: oracle_kernels` on TRITON_ATTN, its
coverage read by the vLLM worker's own rules (`oracle.engines.vllm_coverage`) from a rank report like a real
rank's: with `pinned` false, attention runs outside our overrides, as it did before oracle's plugin pinned it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fake_engine import FakeEngine

from oracle.engines.contract import Mode
from oracle.engines.vllm_coverage import coverage

TRITON_POSTURE = {
    "engine": "vllm", "engine_version": "0.26.0", "device": "cuda", "dtype": "bfloat16",
    "attention_backend": "TRITON_ATTN", "cuda_graphs": "off", "compile_mode": "none (eager)",
    "async_scheduling": False, "sequence_parallel": False, "tensor_parallel": 1, "pipeline_parallel": 1,
    "all_reduce": "none", "sampler": "pytorch (vLLM's TopKTopPSampler)", "kv_cache_dtype": "auto",
    "quantization": "none", "env": {"VLLM_USE_FLASHINFER_SAMPLER": "0"},
}


class CoverageEngine(FakeEngine):
    def __init__(self, model: Path, mode: Mode, *, pinned: bool = False, backend: str = "TRITON_ATTN",
                 **kwargs: Any) -> None:
        super().__init__(model, mode, **kwargs)
        self.pinned = pinned
        self.backend = backend

    def describe(self) -> dict[str, Any]:
        posture = {**TRITON_POSTURE, "attention_backend": self.backend}
        if self.mode != "invariant":
            return {"engine": "vllm", "invariance_mechanism": "none (vLLM's default kernels)", "posture": posture}
        rank = {"rank": 0, "device": "cuda:0", "attention_backend": self.backend, "attention_pinned": self.pinned,
                "ops": {"batch_variant_covered": ["aten::mm"], "batch_variant_uncovered": [],
                        "opaque": ["vllm::unified_attention_with_output"]}}
        return {"engine": "vllm", "invariance_mechanism": "oracle_kernels", "posture": posture,
                "coverage": coverage("oracle_kernels", posture, [rank])}
