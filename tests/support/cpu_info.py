"""What the CPU is, for the vLLM CPU tests' xfail reasons: oneDNN's bf16 kernels (and so whether batching
changes the bits at all) depend on the widest vector extension the CPU has."""

from __future__ import annotations

import platform
from pathlib import Path


def simd() -> str:
    """The widest x86 vector extension the CPU reports (Linux), which decides oneDNN's kernels."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return "unknown SIMD"
    return next((f for f in ("amx_bf16", "avx512_bf16", "avx512f", "avx2") if f in flags), "no AVX2")


def cpu_label() -> str:
    """The processor and its widest vector extension, e.g. `x86_64, avx2`."""
    return f"{platform.processor() or platform.machine()}, {simd()}"
