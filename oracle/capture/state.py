"""The state an op ran in inside the engine, beyond its arguments: what its re-run alone must restore.

Recorded when the op's inputs are copied (`oracle.capture.rows.Snapshot`), written to repro/op.json and
put back for every re-run (`applied`): whether `oracle_kernels`' overrides were registered (the
invariant native engine runs every op inside `oracle_kernels.batch_invariant()`; alone, outside it,
`aten.mm` would run torch's own kernel, whose bits follow M), torch's intra-op threads (a CPU kernel's
blocking can follow them), the precision flags of torch's matmuls, and the environment variables that
select kernels at import or start (read by the engine, not by the op: recorded, put back in a repro).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

# Environment variables that choose kernels or their precision (read once, at import or engine start).
KERNEL_ENV = ("VLLM_BATCH_INVARIANT", "VLLM_CPU_KVCACHE_SPACE", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
              "ONEDNN_DEFAULT_FPMATH_MODE", "DNNL_DEFAULT_FPMATH_MODE", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
              "CUBLAS_WORKSPACE_CONFIG", "NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE")


def _oracle_kernels_on() -> bool:
    try:
        import oracle_kernels
    except ImportError:
        return False
    return oracle_kernels.is_enabled()


@dataclass(frozen=True)
class OpState:
    """Everything outside an op's arguments that its kernel choice can follow, as it was when the op ran."""

    oracle_kernels: bool  # oracle_kernels' overrides registered (the batch-invariant kernels)
    threads: int  # torch's intra-op threads
    float32_matmul_precision: str  # "highest" | "high" | "medium" (TF32 / bf16 passes allowed)
    deterministic_algorithms: bool
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def now(cls) -> OpState:
        return cls(oracle_kernels=_oracle_kernels_on(), threads=torch.get_num_threads(),
                   float32_matmul_precision=torch.get_float32_matmul_precision(),
                   deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
                   env={k: os.environ[k] for k in KERNEL_ENV if k in os.environ})

    @property
    def kernel_mode(self) -> str:
        return "oracle_kernels (batch-invariant overrides on)" if self.oracle_kernels else "torch's default kernels"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> OpState:
        return cls(**d)

    def describe(self) -> str:
        return f"{self.kernel_mode}, {self.threads} thread{'s' if self.threads != 1 else ''}"


@contextlib.contextmanager
def applied(state: OpState) -> Iterator[None]:
    """Put `state` in force for the body (kernel overrides, threads, matmul precision), restored after.

    Environment variables are not set here: the kernels that read them did so when they were loaded.
    """
    threads = torch.get_num_threads()
    precision = torch.get_float32_matmul_precision()
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    with contextlib.ExitStack() as stack:
        if state.oracle_kernels != _oracle_kernels_on():
            stack.enter_context(_kernels(state.oracle_kernels))
        torch.set_num_threads(state.threads)
        torch.set_float32_matmul_precision(state.float32_matmul_precision)
        torch.use_deterministic_algorithms(state.deterministic_algorithms, warn_only=warn_only)
        try:
            yield
        finally:
            torch.set_num_threads(threads)
            torch.set_float32_matmul_precision(precision)
            torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)


@contextlib.contextmanager
def _kernels(on: bool) -> Iterator[None]:
    """oracle_kernels' overrides on (or off) for the body, as they were after."""
    import oracle_kernels

    if on:
        with oracle_kernels.batch_invariant():
            yield
        return
    oracle_kernels.disable()
    try:
        yield
    finally:
        oracle_kernels.enable()
