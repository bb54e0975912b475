"""Turning the kernels on and off: process-wide torch.library overrides.

Each override is one row of `OVERRIDES`, one `Library.impl` line when enabled: an op, the
dispatch key it replaces, and the adapter with the op's exact signature. The CPU rows point at
kernels/cpu/, the `CUDA` rows at kernels/triton/adapters.py (which imports triton only when a CUDA
tensor first reaches it, so this module loads without triton). Enabling also turns split-K off in
torch's cuBLASLt calls, for the bf16/fp16 products that kernels/cublaslt.py sends there, and
disabling restores torch's flags.

Overrides in torch's dispatcher are global to the process, so this module keeps the one piece of
global state in the package: the live `Library` objects. `batch_invariant()` is the way to
change it that always restores it.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from . import cublaslt, fused
from .cpu import attention as cpu_attention
from .cpu import matmul, pointwise, reduction
from .triton import adapters as cuda


@dataclass(frozen=True)
class Override:
    """One registration: `namespace::op` on `dispatch_key` runs `kernel`."""

    namespace: str  # "aten", or "oracle_kernels" for our own ops (attention, the decoder's fused chains)
    op: str  # name and overload as in the schema: "mm", "sum.dim_IntList"
    dispatch_key: str  # "CPU"; "CUDA" for the Triton backend
    kernel: Callable[..., Any]

    @property
    def qualified_name(self) -> str:
        """As torch names the overload: "aten::mm", "aten::sum.dim_IntList"."""
        return f"{self.namespace}::{self.op}"


OVERRIDES: tuple[Override, ...] = (
    # CPU: torch's own kernels on canonical row tiles (kernels/cpu/).
    Override("aten", "mm", "CPU", matmul.mm_adapter),
    Override("aten", "addmm", "CPU", matmul.addmm_adapter),
    Override("aten", "bmm", "CPU", matmul.bmm_adapter),
    Override("aten", "_softmax", "CPU", reduction.softmax_adapter),
    Override("aten", "_log_softmax", "CPU", reduction.log_softmax_adapter),
    Override("aten", "sum.dim_IntList", "CPU", reduction.sum_adapter),
    Override("aten", "mean.dim", "CPU", reduction.mean_adapter),
    Override("aten", "silu", "CPU", pointwise.silu_adapter),
    Override("aten", "sigmoid", "CPU", pointwise.sigmoid_adapter),
    Override("aten", "rsqrt", "CPU", pointwise.rsqrt_adapter),
    Override("oracle_kernels", "paged_attention", "CPU", cpu_attention.paged_attention_adapter),
    # The decoder's fused chains (kernels/fused.py): on the CPU, their torch composition over the kernels above.
    *(Override("oracle_kernels", name, "CPU", composed) for name, composed in fused.COMPOSED.items()),
    # CUDA: Triton kernels (kernels/triton/); triton is imported on the first CUDA call.
    Override("aten", "mm", "CUDA", cuda.mm_adapter),
    Override("aten", "addmm", "CUDA", cuda.addmm_adapter),
    Override("aten", "bmm", "CUDA", cuda.bmm_adapter),
    Override("aten", "_softmax", "CUDA", cuda.softmax_adapter),
    Override("aten", "_log_softmax", "CUDA", cuda.log_softmax_adapter),
    Override("aten", "sum.dim_IntList", "CUDA", cuda.sum_adapter),
    Override("aten", "mean.dim", "CUDA", cuda.mean_adapter),
    # F.rms_norm's fused path on CUDA; the op exists from torch 2.8 (before, rms_norm reaches mean.dim).
    *([Override("aten", "_fused_rms_norm", "CUDA", cuda.fused_rms_norm_adapter)]
      if hasattr(torch.ops.aten, "_fused_rms_norm") else []),
    Override("aten", "silu", "CUDA", cuda.silu_adapter),
    Override("aten", "sigmoid", "CUDA", cuda.sigmoid_adapter),
    Override("aten", "rsqrt", "CUDA", cuda.rsqrt_adapter),
    Override("oracle_kernels", "paged_attention", "CUDA", cuda.paged_attention_adapter),
    Override("oracle_kernels", "rms_norm", "CUDA", cuda.rms_norm_adapter),
    Override("oracle_kernels", "add_rms_norm", "CUDA", cuda.add_rms_norm_adapter),
    Override("oracle_kernels", "qk_norm_rope", "CUDA", cuda.qk_norm_rope_adapter),
    Override("oracle_kernels", "silu_mul", "CUDA", cuda.silu_mul_adapter),
)

_DISPATCH_KEYS = {"cpu": "CPU", "cuda": "CUDA"}


class _Registrations:
    """The live torch.library registrations; none while the kernels are off."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._libraries: list[torch.library.Library] = []
        self._saved_flags: cublaslt.SavedFlags | None = None

    def is_enabled(self) -> bool:
        return bool(self._libraries)

    def enable(self) -> None:
        with self._lock:
            if self._libraries:
                return
            libraries: dict[str, torch.library.Library] = {}
            try:
                with warnings.catch_warnings():
                    # Replacing torch's CPU kernel is the point; torch warns about it once per process.
                    warnings.filterwarnings("ignore", message="(?s).*overriding a previously registered kernel")
                    for o in OVERRIDES:
                        if o.namespace not in libraries:
                            libraries[o.namespace] = torch.library.Library(o.namespace, "IMPL")
                        libraries[o.namespace].impl(o.op, o.kernel, o.dispatch_key)
            except BaseException:
                for library in libraries.values():
                    library._destroy()
                raise
            self._libraries = list(libraries.values())
            # Split-K off in cuBLASLt for the products it takes (kernels/cublaslt.py); a no-op without CUDA.
            self._saved_flags = cublaslt.flags_on()

    def disable(self) -> None:
        with self._lock:
            libraries, self._libraries = self._libraries, []
            for library in libraries:
                library._destroy()
            if libraries:
                saved, self._saved_flags = self._saved_flags, None
                cublaslt.flags_restore(saved)


_REGISTRATIONS = _Registrations()


def enable() -> None:
    """Register the batch-invariant kernels over torch's, process-wide. Enabling twice is harmless."""
    _REGISTRATIONS.enable()


def disable() -> None:
    """Remove every registration, which restores torch's own kernels exactly."""
    _REGISTRATIONS.disable()


def is_enabled() -> bool:
    """Whether the batch-invariant kernels are registered now."""
    return _REGISTRATIONS.is_enabled()


@contextlib.contextmanager
def batch_invariant() -> Iterator[None]:
    """Enable the kernels for the body, then restore the previous state, even if the body raises.

    Nests: an inner block leaves the kernels on if an outer block turned them on.
    """
    was_enabled = is_enabled()
    enable()
    try:
        yield
    finally:
        if not was_enabled:
            disable()


def covered_ops(device: str | torch.device = "cpu") -> list[str]:
    """The ops that `enable()` replaces for `device`, as torch names them ("aten::mm", ...), sorted.

    Covered means every call on that device runs our kernel. Reductions whose dims include dim 0
    of a tensor with two or more dims run across the rows themselves; our kernel passes those to
    torch's unchanged (there is no batch to be invariant to).
    """
    return sorted(covered_names(torch.device(device).type))


@functools.cache
def covered_names(device_type: str) -> frozenset[str]:
    """`covered_ops` as a set, for lookups on every op call (the audit)."""
    key = _DISPATCH_KEYS.get(device_type)
    return frozenset(o.qualified_name for o in OVERRIDES if o.dispatch_key == key)
