"""The vendor path of the bf16/fp16 matrix products on CUDA: cuBLASLt with split-K off, where it gives our bits.

Why it exists: speed. Without split-K the Triton kernel (kernels/triton/matmul.py) gets its parallelism
from output tiles alone, which leaves it at 0.5-0.9x of cuBLAS for 128 <= M <= 1024 on an H200, while
cuBLASLt without split-K runs at 0.94-1.04x there (the issue's Qwen3-8B shapes, `python -m
oracle_kernels.bench`).

Why it is allowed: since torch 2.10, `torch.backends.cuda.matmul.allow_{bf16,fp16}_reduced_precision_reduction
= (False, False)` makes torch ask cuBLASLt's heuristics for algorithms without any split-K reduction, and
`preferred_blas_library("cublaslt")` sends every torch gemm there. Measured on an H200 (torch 2.11, CUDA
13), every algorithm cuBLASLt then picks for the Qwen3-8B projections is one chain of wgmma k-steps over K
in order, like ours: for bf16 and fp16, mm, addmm and linear, M from 1 to 4096, its product is bitwise the
Triton kernel's. Not for every problem: with N = 333 (no 16-byte aligned rows of the output) it picks
kernels whose bits differ.

So nothing here is assumed: a product goes to cuBLASLt only where this process has seen, on its GPU, that
cuBLASLt and the Triton kernel give the same bits for exactly that problem (device, dtype, M, K, N, strides,
16-byte alignment). The first call of a problem (outside CUDA-graph capture) computes both on random rows
of A and the call's B and compares; equal bits admit the problem, different bits bar its (K, N, layout)
from cuBLASLt for the rest of the process. Because an admitted problem gives the Triton kernel's bits, which
of the two runs it never changes a result, only the time: calls with M below `CUBLASLT_MIN_M` (config.py)
stay on Triton, where cuBLASLt without split-K can be slow (0.1x at M = 1 on K = 12288, N = 4096).

The torch flags are process-wide: `flags_on()` sets them when the kernels are enabled and `flags_restore()`
puts back what was there when they are disabled (registry.py). `ORACLE_KERNELS_MATMUL=triton` turns the
vendor path off (every product on Triton).
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .triton.config import CUBLASLT_MIN_M

_ENV = "ORACLE_KERNELS_MATMUL"  # "auto" (default) or "triton"
_HALF = (torch.bfloat16, torch.float16)


@functools.cache
def _torch_can() -> bool:
    """Whether this torch can turn split-K off in cuBLASLt (torch >= 2.10, built with CUDA and cuBLASLt)."""
    if torch.version.cuda is None or not torch.cuda.is_available():
        return False
    try:
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction_split_k  # noqa: B018 - torch >= 2.10
    except AttributeError:
        return False
    return True


def available() -> bool:
    """Whether the vendor path may be used in this process (torch and the ORACLE_KERNELS_MATMUL setting)."""
    return os.environ.get(_ENV, "auto").strip().lower() != "triton" and _torch_can()


# --- the torch flags ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SavedFlags:
    """torch's cuBLAS settings as they were before `flags_on()`."""

    bf16: tuple[bool, bool]
    fp16: tuple[bool, bool]
    backend: Any  # torch._C._BlasBackend


def flags_on() -> SavedFlags | None:
    """Set split-K off and cuBLASLt preferred; returns what to restore, or None where the path is unavailable."""
    if not available():
        return None
    m = torch.backends.cuda.matmul
    saved = SavedFlags(
        bf16=(m.allow_bf16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction_split_k),
        fp16=(m.allow_fp16_reduced_precision_reduction, m.allow_fp16_reduced_precision_reduction_split_k),
        backend=torch.backends.cuda.preferred_blas_library(),
    )
    m.allow_bf16_reduced_precision_reduction = (False, False)
    m.allow_fp16_reduced_precision_reduction = (False, False)
    torch.backends.cuda.preferred_blas_library("cublaslt")
    return saved


def flags_restore(saved: SavedFlags | None) -> None:
    """Put back the settings `flags_on()` replaced."""
    if saved is None:
        return
    m = torch.backends.cuda.matmul
    m.allow_bf16_reduced_precision_reduction = saved.bf16
    m.allow_fp16_reduced_precision_reduction = saved.fp16
    torch.backends.cuda.preferred_blas_library(saved.backend)


def _flags_are_on() -> bool:
    """Checked on every routed call: someone may have changed torch's flags since `flags_on()`."""
    return (
        tuple(torch._C._get_cublas_allow_bf16_reduced_precision_reduction()) == (False, False)
        and tuple(torch._C._get_cublas_allow_fp16_reduced_precision_reduction()) == (False, False)
        and torch._C._get_blas_preferred_backend() == torch._C._BlasBackend.Cublaslt
    )


# --- which problems cuBLASLt may take -----------------------------------------------------------------

Layout = tuple[int, torch.dtype, int, int, tuple[int, ...], tuple[int, ...]]  # device, dtype, K, N, strides


@dataclass
class _Verdicts:
    """What this process has seen: admitted (layout, M) problems and barred layouts, with the reason."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    admitted: set[tuple[Layout, int]] = field(default_factory=set)
    barred: dict[Layout, str] = field(default_factory=dict)


_VERDICTS = _Verdicts()


def _layout(a: torch.Tensor, b: torch.Tensor) -> Layout | None:
    """The problem's key without M, or None if cuBLASLt is not tried for it at all."""
    if a.dim() != 2 or b.dim() != 2 or a.dtype not in _HALF or a.dtype != b.dtype or not a.is_cuda:
        return None
    # The row stride of A may depend on M for a column-major A; key on strides only where they do not.
    if a.stride(1) != 1 or (b.stride(0) != 1 and b.stride(1) != 1):
        return None
    if a.data_ptr() % 16 or b.data_ptr() % 16:
        return None
    return (a.device.index or 0, a.dtype, a.shape[1], b.shape[1], (a.stride(0),), tuple(b.stride()))


def mm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """`a @ b` into `out` by cuBLASLt (with the flags on); routed calls only for admitted problems.

    aten::mm.out is not overridden (only aten::mm is), so this reaches torch's cuBLASLt call.
    """
    return torch.ops.aten.mm.out(a, b, out=out)


Triton = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _compare(a: torch.Tensor, b: torch.Tensor, triton_mm: Triton) -> bool | None:
    """Both paths on random rows shaped like `a` and the real `b`: same bits? None when undecided."""
    g = torch.Generator(device=a.device).manual_seed(a.shape[0] * 7919 + a.shape[1])
    x = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
    x.normal_(generator=g)
    try:
        ours = triton_mm(x, b)
        theirs = mm(x, b, torch.empty_like(ours))
    except torch.cuda.OutOfMemoryError:
        return None
    if not bool(ours.ne(0).any()):  # a zero B says nothing about the order of the sums
        return None
    return bool(torch.equal(ours, theirs))


def use_cublaslt(a: torch.Tensor, b: torch.Tensor, triton_mm: Triton) -> bool:
    """Whether `a @ b` goes to cuBLASLt: an admitted problem, with M >= CUBLASLT_MIN_M and the flags on.

    The first call of a problem compares the two paths (see the module docstring); under CUDA-graph
    capture no comparison can run, so an unseen problem stays on Triton then.
    """
    m = a.shape[0]
    if m < CUBLASLT_MIN_M:
        return False
    layout = _layout(a, b)
    if layout is None or not _flags_are_on() or not available():
        return False
    with _VERDICTS.lock:
        if layout in _VERDICTS.barred:
            return False
        if (layout, m) in _VERDICTS.admitted:
            return True
    if torch.cuda.is_current_stream_capturing():
        return False
    same = _compare(a, b, triton_mm)
    with _VERDICTS.lock:
        if same is True:
            _VERDICTS.admitted.add((layout, m))
        elif same is False:
            _VERDICTS.barred[layout] = f"cuBLASLt's bits differ from the Triton kernel's at M={m}"
    return same is True


def summary() -> dict[str, Any]:
    """For reports: whether the path is on, how many problems it took, and which layouts it refused."""
    with _VERDICTS.lock:
        return {
            "available": available(),
            "min_m": CUBLASLT_MIN_M,
            "admitted_problems": len(_VERDICTS.admitted),
            "barred": [
                {"dtype": str(k[1]).removeprefix("torch."), "k": k[2], "n": k[3], "reason": why}
                for k, why in _VERDICTS.barred.items()
            ],
        }


def forget() -> None:
    """Drop every verdict (tests)."""
    with _VERDICTS.lock:
        _VERDICTS.admitted.clear()
        _VERDICTS.barred.clear()
