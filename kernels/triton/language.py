"""The one place the CUDA backend imports triton, with an error that says what to install.

Kernel modules do `from .language import tl, triton`. Nothing outside kernels/triton/ imports
this module at import time, so `import oracle_kernels` works without triton.
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
    from triton.runtime.errors import OutOfResources
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "oracle_kernels: the CUDA kernels are written in Triton; install it (`pip install triton`, "
        "bundled with torch's CUDA wheels) or run on the CPU"
    ) from error

__all__ = ["OutOfResources", "tl", "triton"]
