"""A fake engine that describes itself as vLLM 0.26 on FlashAttention 3 (a posture the hazards file knows)."""

from __future__ import annotations

from typing import Any

from fake_engine import FakeEngine

FA3_POSTURE = {
    "engine": "vllm", "engine_version": "0.26.0", "device": "cuda:0", "dtype": "bfloat16",
    "attention_backend": "FLASH_ATTN (FA3)", "cuda_graphs": "off", "compile_mode": "none (eager)",
    "async_scheduling": False, "sequence_parallel": False, "tensor_parallel": 1, "pipeline_parallel": 1,
    "all_reduce": "none", "sampler": "pytorch", "kv_cache_dtype": "auto", "quantization": "none",
}


class PostureEngine(FakeEngine):
    def describe(self) -> dict[str, Any]:
        mechanism = "VLLM_BATCH_INVARIANT=1" if self.mode == "invariant" else "none (vLLM's default kernels)"
        return {"engine": "vllm", "invariance_mechanism": mechanism,
                "posture": {**FA3_POSTURE, "invariance_mechanism": mechanism}}
