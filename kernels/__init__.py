"""oracle_kernels: batch-invariant kernels for torch, registered with torch.library.

With the kernels enabled, row i of op(x[:M]) is bitwise equal to op(x[i:i+1]) for every covered
op, whatever M and whatever the other rows hold; `paged_attention` gives a token the same bits
in prefill, chunked prefill and decode, alone or batched. Importing registers nothing (it only
defines our own ops: `oracle_kernels::paged_attention`, and the decoder's fused chains of fused.py,
whose default is their torch composition); `enable()` replaces torch's CPU and CUDA kernels and ours
(on CUDA the fused chains become single Triton kernels, bitwise the composition) and `disable()`
restores them.

    import oracle_kernels
    with oracle_kernels.batch_invariant():
        logits = model(batch)
    print(oracle_kernels.audit(model, batch).uncovered)  # batch-variant ops still on torch's kernels

Backends: kernels/cpu/ (portable torch, the `CPU` key) and kernels/triton/ (Triton kernels, the
`CUDA` key; triton is imported on the first CUDA call). bf16/fp16 products on CUDA go to cuBLASLt
with split-K off wherever it was seen to give the Triton kernel's bits (kernels/cublaslt.py;
`matmul_paths()` says what it took and refused). `python -m oracle_kernels.bench` times
the CUDA kernels against torch's.
"""

from . import fused
from .attention import paged_attention, reference_attention
from .audit import BATCH_VARIANT_OPS, AuditResult, audit, can_vary_with_batch
from .cublaslt import summary as matmul_paths
from .registry import batch_invariant, covered_ops, disable, enable, is_enabled

__all__ = [
    "BATCH_VARIANT_OPS",
    "AuditResult",
    "audit",
    "batch_invariant",
    "can_vary_with_batch",
    "covered_ops",
    "disable",
    "enable",
    "fused",
    "is_enabled",
    "matmul_paths",
    "paged_attention",
    "reference_attention",
]
