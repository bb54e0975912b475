"""What made a report: versions, devices and the environment variables that affect determinism."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

from oracle import __version__

# Variables that change kernel selection, threading or reduction order.
DETERMINISM_VARS = (
    "CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE", "ORACLE_KERNELS_MATMUL", "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "TORCH_DETERMINISTIC", "NVIDIA_TF32_OVERRIDE",
    "VLLM_BATCH_INVARIANT", "VLLM_ATTENTION_BACKEND", "VLLM_ENABLE_V1_MULTIPROCESSING",
    "VLLM_CPU_KVCACHE_SPACE", "TRITON_INTERPRET", "PYTHONHASHSEED",
)


def collect_environment() -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "oracle": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "torch_num_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "env": {k: os.environ[k] for k in DETERMINISM_VARS if k in os.environ},
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    return env
