"""mm, addmm and bmm for the CPU: torch's own gemm, called only on canonical row tiles.

Each op in four steps: a kernel (one fixed-shape gemm), a launcher (checks, fixed tiles per
dtype), an adapter with the exact aten signature, and a registration line in `registry.py`.
The kernels call the `.out` overloads (`aten::mm.out`, ...), which are separate operator
entries that this package does not override, so they reach torch's original CPU kernels.

A row times a weight gets the same bits through every op: torch decomposes F.linear into
addmm for a contiguous input but into bmm (weight broadcast over the batch) plus add for a
strided one, and a batch of one is always contiguous. So addmm is mm plus an exact elementwise
epilogue (as that bmm + add computes it), and a bmm whose B is broadcast is one mm over all rows.

Only A's rows are tiled; B is passed as it comes. Its layout (a weight's `.t()` view, say) is
the same for every batch, so it does not break invariance, and copying it would cost more
than the gemm for small batches.
"""

from __future__ import annotations

import torch

from ..config import TILED_DTYPES, cpu_tiles
from .tiling import map_row_tiles, pad_rows

# --- kernels: one call of torch's gemm on a fixed shape ---------------------------------------


def mm_kernel(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """out [T, N] = a [T, K] @ b [K, N]; T is the dtype's fixed `mm_rows`."""
    torch.mm(a, b, out=out)  # dispatches aten::mm.out; faster to call than the OpOverload


def bmm_kernel(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """out [NB, T, N] = a [NB, T, K] @ b [NB, K, N]; NB, T are the dtype's fixed bmm tiles."""
    torch.bmm(a, b, out=out)  # dispatches aten::bmm.out


# --- launchers ----------------------------------------------------------------------------------


def _check_operands(name: str, a: torch.Tensor, b: torch.Tensor, ndim: int) -> None:
    if a.dim() != ndim or b.dim() != ndim:
        raise RuntimeError(f"{name}: expected {ndim}-D operands, got {a.dim()}-D and {b.dim()}-D")
    if a.shape[-1] != b.shape[-2]:
        raise RuntimeError(f"{name}: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be multiplied")
    if a.dtype != b.dtype:
        raise RuntimeError(f"{name}: operands must have the same dtype, got {a.dtype} and {b.dtype}")


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [M, K] @ b [K, N] -> [M, N]; row i depends only on a[i] and b, bitwise."""
    _check_operands("mm", a, b, 2)
    if a.dtype not in TILED_DTYPES:
        # Integer gemm is exact: there is no summation order to fix.
        return torch.ops.aten.mm.out(a, b, out=a.new_empty((a.shape[0], b.shape[1])))
    tile = cpu_tiles(a.dtype).mm_rows
    return map_row_tiles(lambda t, o: mm_kernel(t[0], b, o), [a.contiguous()], (b.shape[1],), a.dtype, tile)


def addmm(
    bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, beta: complex = 1, alpha: complex = 1
) -> torch.Tensor:
    """beta * bias + alpha * (a [M, K] @ b [K, N]) -> [M, N], with bias broadcastable to [M, N]."""
    _check_operands("addmm", a, b, 2)
    if bias.dtype != a.dtype:
        raise RuntimeError(f"addmm: bias dtype {bias.dtype} differs from the operands' {a.dtype}")
    if a.dtype not in TILED_DTYPES:
        return torch.ops.aten.addmm.out(bias, a, b, beta=beta, alpha=alpha, out=a.new_empty(0))
    out = mm(a, b)
    # Exact per element: one rounding per multiply or add, in vector and scalar loops alike.
    if alpha != 1:
        out.mul_(alpha)
    if beta == 0:  # torch ignores the bias then, NaN included
        return out
    return out.add_(bias if beta == 1 else bias * beta)


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [B, M, K] @ b [B, K, N] -> [B, M, N]; entry (i, r) depends only on a[i, r] and b[i]."""
    _check_operands("bmm", a, b, 3)
    if a.shape[0] != b.shape[0]:
        raise RuntimeError(f"bmm: batch sizes differ: {a.shape[0]} and {b.shape[0]}")
    batch, rows, k = a.shape
    n = b.shape[2]
    if a.dtype not in TILED_DTYPES:
        return torch.ops.aten.bmm.out(a, b, out=a.new_empty((batch, rows, n)))
    if b.stride(0) == 0 and batch > 0:
        # One matrix broadcast over the batch (matmul's x @ w.t() on a strided x): every row
        # meets the same [K, N], so this is one mm over all rows, bitwise as mm and addmm give.
        return mm(a.reshape(batch * rows, k), b[0]).view(batch, rows, n)
    tiles = cpu_tiles(a.dtype)
    nb, nt = tiles.bmm_batch, tiles.bmm_rows
    batch_tiles, row_tiles = -(-batch // nb), -(-rows // nt)
    # A zero-padded to [batch_tiles * nb, row_tiles * nt, K] and regrouped so that tile (i, j) is
    # one contiguous [nb, nt, K] block: [batch_tiles, row_tiles, nb, nt, K].
    a_pad = a.new_zeros((batch_tiles * nb, row_tiles * nt, k))
    a_pad[:batch, :rows] = a
    a_tiles = a_pad.view(batch_tiles, nb, row_tiles, nt, k).transpose(1, 2).contiguous()
    out_tiles = a.new_empty((batch_tiles, row_tiles, nb, nt, n))
    for i in range(batch_tiles):
        b_tile = pad_rows(b[i * nb : (i + 1) * nb], nb)  # [nb, K, N], always a contiguous copy
        for j in range(row_tiles):
            bmm_kernel(a_tiles[i, j], b_tile, out_tiles[i, j])
    out = out_tiles.transpose(1, 2).reshape(batch_tiles * nb, row_tiles * nt, n)
    return out[:batch, :rows].contiguous()


# --- adapters: the exact aten signatures --------------------------------------------------------


def mm_adapter(self: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    """aten::mm(Tensor self, Tensor mat2) -> Tensor"""
    return mm(self, mat2)


def addmm_adapter(
    self: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *, beta: complex = 1, alpha: complex = 1
) -> torch.Tensor:
    """aten::addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor"""
    return addmm(self, mat1, mat2, beta, alpha)


def bmm_adapter(self: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    """aten::bmm(Tensor self, Tensor mat2) -> Tensor"""
    return bmm(self, mat2)
