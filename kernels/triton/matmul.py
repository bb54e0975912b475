"""mm, addmm and bmm on CUDA: one persistent Triton matmul with fixed tiles and no split-K.

Each op in the package's four steps: the kernel below, the launchers (checks, the dtype's fixed
tiles from config.py), the adapters with the exact aten signatures (adapters.py, so that importing
the registry does not import triton) and one registration line each in `registry.py`.

Why a row's result does not depend on the batch: an output element c[i, j] is accumulated in
one program, over K from 0 upwards in steps of BLOCK_K, by tl.dot on the same instruction in every
tier (config.py). No program ever shares an element's K range with another (no split-K, no
stream-K), and the operand rows that are not part of the product (past M, past N, past K) are
loaded as zeros, which add nothing. So the chain of roundings that produces c[i, j] involves only
a[i, :] and b[:, j] and is the same for M = 1 and M = 4096.

bf16/fp16 products of 32 rows or more go to cuBLASLt with split-K off instead, where that was seen
to give exactly this kernel's bits for the problem (kernels/cublaslt.py): same bits, cuBLAS speed.

addmm is mm followed by an exact elementwise epilogue (alpha, then bias), as the CPU backend
does, so a row gets the same bits through F.linear's addmm and through matmul + add. bmm is the
same kernel with a batch index in the tile order; a bmm whose B is broadcast over the batch
(matmul's x @ w.t() on a strided x) is one mm over all rows.
"""

from __future__ import annotations

import functools

import torch

from .. import cublaslt
from .config import FLOAT_DTYPES, MatmulTiles, matmul_config
from .language import OutOfResources, tl, triton

# --- kernel ---------------------------------------------------------------------------------------


@triton.jit
def matmul_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K, num_batches,
    stride_ab, stride_am, stride_ak,
    stride_bb, stride_bk, stride_bn,
    stride_cb, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, ACC_DTYPE: tl.constexpr,
):
    """c[b] [M, N] = a[b] [M, K] @ b[b] [K, N] for b < num_batches; a persistent grid walks the tiles.

    Triton may compile a variant per M (M == 1, M divisible by 16): a variant changes masks and
    load widths, never the tile shape or the K loop, so every output element is still the same
    chain of tl.dot steps over K = 0, BLOCK_K, ... (the GPU tests check every batch size).
    """
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles_per_matrix = tiles_m * tiles_n
    num_tiles = tiles_per_matrix * num_batches
    tiles_per_group = GROUP_M * tiles_n
    lanes_m = tl.arange(0, BLOCK_M)
    lanes_n = tl.arange(0, BLOCK_N)
    lanes_k = tl.arange(0, BLOCK_K)
    for tile in range(tl.program_id(0), num_tiles, tl.num_programs(0)):
        batch = tile // tiles_per_matrix
        t = tile % tiles_per_matrix
        # Grouped order: GROUP_M row tiles visit the same column tiles one after the other, so a
        # slice of B is read from L2 rather than HBM. Only the visiting order changes.
        first_m = (t // tiles_per_group) * GROUP_M
        group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
        pid_m = first_m + (t % tiles_per_group) % group_rows
        pid_n = (t % tiles_per_group) // group_rows
        rows = pid_m * BLOCK_M + lanes_m  # [BLOCK_M]
        cols = pid_n * BLOCK_N + lanes_n  # [BLOCK_N]
        row_ok = rows < M
        col_ok = cols < N
        # 64-bit offsets: M * N of an lm head (4096 x 151936) is past 2^31.
        a_rows = a_ptr + batch.to(tl.int64) * stride_ab + rows.to(tl.int64)[:, None] * stride_am  # [BLOCK_M, 1]
        b_cols = b_ptr + batch.to(tl.int64) * stride_bb + cols.to(tl.int64)[None, :] * stride_bn  # [1, BLOCK_N]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC_DTYPE)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + lanes_k
            k_ok = ks < K
            a = tl.load(a_rows + ks[None, :] * stride_ak, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_cols + ks[:, None] * stride_bk, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION, out_dtype=ACC_DTYPE)
        c = (c_ptr + batch.to(tl.int64) * stride_cb + rows.to(tl.int64)[:, None] * stride_cm
             + cols.to(tl.int64)[None, :] * stride_cn)
        tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


# --- launchers ------------------------------------------------------------------------------------

# Programs of the persistent grid when the tensors are not on a GPU (Triton's CPU interpreter).
_INTERPRETER_PROGRAMS = 4


@functools.cache
def _multiprocessors(device_index: int) -> int:
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


def _slots(device: torch.device) -> int:
    """Programs that run at once: the SMs of a GPU, or a few under the interpreter."""
    if device.type == "cuda":
        return _multiprocessors(device.index if device.index is not None else torch.cuda.current_device())
    return _INTERPRETER_PROGRAMS


def num_programs(device: torch.device, num_tiles: int) -> int:
    """Programs of a persistent grid: one per SM at most (the order of tiles never changes a bit)."""
    return max(1, min(num_tiles, _slots(device)))


# Pipeline depth that compiled, per (device, tiles), where the configured one ran out of shared memory.
_STAGES_THAT_FIT: dict[tuple[torch.device, MatmulTiles], int] = {}


def _acc_dtype(dtype: torch.dtype) -> tl.dtype:
    return tl.float64 if dtype == torch.float64 else tl.float32


def _check_operands(name: str, a: torch.Tensor, b: torch.Tensor, ndim: int) -> None:
    if a.dim() != ndim or b.dim() != ndim:
        raise RuntimeError(f"{name}: expected {ndim}-D operands, got {a.dim()}-D and {b.dim()}-D")
    if a.shape[-1] != b.shape[-2]:
        raise RuntimeError(f"{name}: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be multiplied")
    if a.dtype != b.dtype:
        raise RuntimeError(f"{name}: operands must have the same dtype, got {a.dtype} and {b.dtype}")
    if a.device != b.device:
        raise RuntimeError(f"{name}: operands are on {a.device} and {b.device}")


def _launch(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, tiles: MatmulTiles | None) -> torch.Tensor:
    """out [B, M, N] = a [B, M, K] @ b [B, K, N], any strides; `tiles` overrides the dtype's tier (tests)."""
    batches, m, k = a.shape
    n = b.shape[2]
    if out.numel() == 0:
        return out
    config = matmul_config(a.dtype)
    t = tiles if tiles is not None else config.tiles_for(m, n, _slots(a.device))
    num_tiles = batches * triton.cdiv(m, t.block_m) * triton.cdiv(n, t.block_n)
    grid = (num_programs(a.device, num_tiles),)
    fit = (a.device, t)
    while True:
        stages = _STAGES_THAT_FIT.get(fit, t.num_stages)
        try:
            matmul_kernel[grid](
                a, b, out, m, n, k, batches,
                a.stride(0), a.stride(1), a.stride(2),
                b.stride(0), b.stride(1), b.stride(2),
                out.stride(0), out.stride(1), out.stride(2),
                BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, GROUP_M=t.group_m,
                INPUT_PRECISION=config.input_precision, ACC_DTYPE=_acc_dtype(a.dtype),
                num_warps=t.num_warps, num_stages=stages,
            )
            return out
        except OutOfResources:
            # The pipeline depth only decides how many K blocks are in flight, never the order of the
            # sums, so a GPU with less shared memory than an H200 runs the same tiles shallower.
            if stages <= 1:
                raise
            _STAGES_THAT_FIT[fit] = stages - 1


def triton_mm(a: torch.Tensor, b: torch.Tensor, tiles: MatmulTiles | None = None) -> torch.Tensor:
    """a [M, K] @ b [K, N] by the Triton kernel alone (the portable path)."""
    out = a.new_empty((a.shape[0], b.shape[1]))
    return _launch(a[None], b[None], out[None], tiles)[0]


def mm(a: torch.Tensor, b: torch.Tensor, tiles: MatmulTiles | None = None) -> torch.Tensor:
    """a [M, K] @ b [K, N] -> [M, N] in a's dtype; row i depends only on a[i] and b, bitwise.

    bf16/fp16 products that cuBLASLt without split-K was seen to compute with this kernel's bits go
    there when it is faster (kernels/cublaslt.py); `tiles` (tests, the tile sweep) forces Triton.
    """
    _check_operands("mm", a, b, 2)
    if a.dtype not in FLOAT_DTYPES:
        # Integer products are exact: there is no summation order to fix.
        return torch.ops.aten.mm.out(a, b, out=a.new_empty((a.shape[0], b.shape[1])))
    if tiles is None and cublaslt.use_cublaslt(a, b, triton_mm):
        return cublaslt.mm(a, b, a.new_empty((a.shape[0], b.shape[1])))
    return triton_mm(a, b, tiles)


def addmm(
    bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, beta: complex = 1, alpha: complex = 1,
    tiles: MatmulTiles | None = None,
) -> torch.Tensor:
    """beta * bias + alpha * (a [M, K] @ b [K, N]) -> [M, N], with bias broadcastable to [M, N]."""
    _check_operands("addmm", a, b, 2)
    if bias.dtype != a.dtype:
        raise RuntimeError(f"addmm: bias dtype {bias.dtype} differs from the operands' {a.dtype}")
    if a.dtype not in FLOAT_DTYPES:
        out = a.new_empty((a.shape[0], b.shape[1]))
        return torch.ops.aten.addmm.out(bias, a, b, beta=beta, alpha=alpha, out=out)
    out = mm(a, b, tiles)
    # Elementwise and exact per element on CUDA (one rounding per multiply or add, whatever the
    # tensor's size), so the epilogue adds nothing that depends on the batch.
    if alpha != 1:
        out.mul_(alpha)
    if beta == 0:  # torch ignores the bias then, NaN included
        return out
    return out.add_(bias if beta == 1 else bias * beta)


def bmm(a: torch.Tensor, b: torch.Tensor, tiles: MatmulTiles | None = None) -> torch.Tensor:
    """a [B, M, K] @ b [B, K, N] -> [B, M, N]; entry (i, r) depends only on a[i, r] and b[i]."""
    _check_operands("bmm", a, b, 3)
    if a.shape[0] != b.shape[0]:
        raise RuntimeError(f"bmm: batch sizes differ: {a.shape[0]} and {b.shape[0]}")
    batches, rows, k = a.shape
    n = b.shape[2]
    out = a.new_empty((batches, rows, n))
    if a.dtype not in FLOAT_DTYPES:
        return torch.ops.aten.bmm.out(a, b, out=out)
    if b.stride(0) == 0 and batches > 0:
        # One matrix broadcast over the batch: every row meets the same [K, N], so this is one mm
        # over all rows and gives a row the bits that mm and addmm give it.
        return mm(a.reshape(batches * rows, k), b[0], tiles).view(batches, rows, n)
    return _launch(a, b, out, tiles)
