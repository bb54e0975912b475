"""The decoder's elementwise chains as single Triton kernels, bitwise equal to the torch compositions.

Each kernel here replaces a chain of kernels that invariant mode runs on CUDA (kernels/fused.py holds
the compositions, which are the ops' CPU and default implementations):

    add_rms_norm_kernel   h = r + x; weight * rms_norm(h.float()).to(dtype)     (5-6 kernels -> 1)
    qk_norm_rope_kernel   per-head q_norm / k_norm, then rotate-half rope       (9 kernels -> 1)
    silu_mul_kernel       silu(gate) * up                                       (2 kernels -> 1)

Bitwise, for bf16 and fp16 only. Every rounding of the composition is kept: each torch kernel of the
chain computes in fp32 and rounds once to the dtype, so each step here ends in `.to(dtype)`. A round
trip through the half type does not stop the compiler from contracting a product and a sum into one
FMA: it reads `(a * b).to(bf16)` of two halves as a half multiply and fuses it with the half add that
follows (`fma.rn.bf16`, one rounding where rope rounds three times; seen on an H100). So these kernels
launch with Triton's `enable_fp_fusion` off (`NO_FMA`), and the one contraction the composition does
make, the RMS reduction's `squares += x * x`, is written out as `tl.fma` in `reduction.row_rstd`.
tests/unit/test_kernels_triton_layout.py reads the PTX for half-precision FMAs. fp32 stays on the
composition (the launchers fall back to it).

The RMS reduction is `reduction.row_rstd`, the code rms_norm_kernel runs, with the same BLOCK and
num_warps (`row_tiles`). Its tl.sum adds the lanes in a tree that follows the register layout the
compiler gives the sum, and that layout follows the widest aligned access among the kernel's loads and
stores: the composition's kernel reads and writes fp32 rows (four to a 16-byte vector when the row
length is a multiple of 16, which Triton specializes on, else one), a fused kernel reads halves (eight
to a vector) and an always aligned weight. So the fused kernels cap the contiguity their accesses see
at what the composition's get (`load_contiguity`); with the same pointer alignment (fresh, 16-byte
aligned rows, stride = row length) they get the same layout, hence the same tree. Triton's CPU
interpreter has no layouts and no FMA: tests/unit/triton_interpreter_fused_cases.py checks the formulas
and roundings, tests/unit/test_kernels_triton_layout.py the layouts the compiler picks (no GPU needed),
tests/gpu/test_fused_cuda.py the bits on a GPU.
"""

from __future__ import annotations

import torch

from .config import POINTWISE_BLOCK, POINTWISE_NUM_WARPS, row_tiles
from .language import tl, triton
from .pointwise import SILU, unary_math
from .reduction import rms_tile, row_rstd

HALF_DTYPES = (torch.bfloat16, torch.float16)
# fp32 elements in a 16-byte vector: the widest load of the composition's rms_norm_kernel.
FP32_VECTOR = 4
# The rope kernel holds a head in one tile.
MAX_HEAD_DIM = 1024
# Launch options of every kernel here: no contraction of a product and a sum the composition rounds apart.
NO_FMA = {"enable_fp_fusion": False}
# A kernel reads module globals only as constexpr instances.
_SILU = tl.constexpr(SILU)

# --- kernels ----------------------------------------------------------------------------------------


@triton.jit
def _normed(x_row, r_row, w_ptr, cols, C, rstd, HAS_RESIDUAL: tl.constexpr):
    """round(w * round(x * rstd)) in fp32: the composition's `.to(dtype)` after F.rms_norm, then `weight * y`."""
    x = rms_tile(x_row, r_row, cols, C, tl.float32, HAS_RESIDUAL)
    y = (x * rstd).to(x_row.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < C, other=0.0).to(tl.float32)
    return (w * y).to(x_row.dtype.element_ty).to(tl.float32)


@triton.jit
def add_rms_norm_kernel(
    x_ptr, r_ptr, w_ptr, out_ptr, h_ptr, C, eps,
    BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr, MAX_CONTIGUOUS: tl.constexpr,
):
    """Row r: h = round(res[r] + x[r]) (HAS_RESIDUAL; else h = x[r]) written to h_ptr, out[r] = round(w * round(h * rstd)).

    Rows are contiguous: row r starts at r * C in every tensor.
    """
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * C
    r_row = r_ptr + row * C
    lanes = tl.max_contiguous(tl.arange(0, BLOCK), MAX_CONTIGUOUS)
    rstd = row_rstd(x_row, r_row, C, eps, lanes, BLOCK, tl.float32, False, HAS_RESIDUAL)
    for c0 in range(0, C, BLOCK):
        cols = c0 + lanes
        if HAS_RESIDUAL:  # h again from its inputs, the sum row_rstd squared (no store-then-load)
            h = rms_tile(x_row, r_row, cols, C, tl.float32, True)
            tl.store(h_ptr + row * C + cols, h.to(h_ptr.dtype.element_ty), mask=cols < C)
        y = _normed(x_row, r_row, w_ptr, cols, C, rstd, HAS_RESIDUAL)
        tl.store(out_ptr + row * C + cols, y.to(out_ptr.dtype.element_ty), mask=cols < C)


@triton.jit
def qk_norm_rope_kernel(
    x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, D, num_heads, eps,
    BLOCK: tl.constexpr, HAS_NORM: tl.constexpr, MAX_CONTIGUOUS: tl.constexpr,
):
    """Row r = token t * num_heads + head: y = round(w * round(x * rstd)) (HAS_NORM; else y = x), then
    out = round(round(y * cos[t]) + round(rot(y) * sin[t])), rot(y) = cat(-y[D/2:], y[:D/2]). D <= BLOCK."""
    row = tl.program_id(0).to(tl.int64)
    token = row // num_heads
    x_row = x_ptr + row * D
    lanes = tl.max_contiguous(tl.arange(0, BLOCK), MAX_CONTIGUOUS)
    half = D // 2
    partner = tl.where(lanes < half, lanes + half, lanes - half)  # the column rot(y) takes at each lane
    if HAS_NORM:
        rstd = row_rstd(x_row, x_row, D, eps, lanes, BLOCK, tl.float32, False, False)
        y = _normed(x_row, x_row, w_ptr, lanes, D, rstd, False)
        y_partner = _normed(x_row, x_row, w_ptr, partner, D, rstd, False)
    else:
        y = tl.load(x_row + lanes, mask=lanes < D, other=0.0).to(tl.float32)
        y_partner = tl.load(x_row + partner, mask=lanes < D, other=0.0).to(tl.float32)
    rotated = tl.where(lanes < half, -y_partner, y_partner)
    cos = tl.load(cos_ptr + token * D + lanes, mask=lanes < D, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + token * D + lanes, mask=lanes < D, other=0.0).to(tl.float32)
    a = (y * cos).to(out_ptr.dtype.element_ty).to(tl.float32)
    b = (rotated * sin).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * D + lanes, (a + b).to(out_ptr.dtype.element_ty), mask=lanes < D)


@triton.jit
def silu_mul_kernel(gate_ptr, up_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out[i] = round(round(silu(gate[i])) * up[i]): unary_kernel's silu, rounded, then torch's half mul."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    gate = tl.load(gate_ptr + offsets, mask=mask, other=1.0).to(tl.float32)
    act = unary_math(gate, _SILU, BLOCK, False).to(out_ptr.dtype.element_ty).to(tl.float32)
    up = tl.load(up_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offsets, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


# --- launchers --------------------------------------------------------------------------------------


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as contiguous rows on a 16-byte boundary: the alignment the composition's fresh fp32 copy has,
    which Triton specializes on (and which sets the loads' vector width, hence the reduction's layout)."""
    x = x.contiguous()
    return x.clone() if x.data_ptr() % 16 else x


def load_contiguity(length: int) -> int:
    """The contiguity the fused kernels let their accesses see for rows of `length`: the vector width
    rms_norm_kernel's fp32 accesses get on the composition's fresh copy (16 bytes if the row stride is a
    multiple of 16 elements, else 4 bytes). Never wider, so the reduction's register layout is the same."""
    return FP32_VECTOR if length % 16 == 0 else 1


def fusable(*tensors: torch.Tensor) -> bool:
    """Whether the fused kernels give the composition's bits for these operands: one half dtype throughout."""
    dtype = tensors[0].dtype
    return dtype in HALF_DTYPES and all(t.dtype == dtype for t in tensors)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, h) over the last dim: h = residual + x (x when residual is None), out = weight * norm(h).

    bf16/fp16 only (`fusable`); `block`: tests only. With no residual, h is x itself.
    """
    length = x.shape[-1]
    rows = _rows(x)
    res = _rows(residual) if residual is not None else rows
    out = torch.empty_like(rows)
    h = torch.empty_like(rows) if residual is not None else rows
    num_rows = rows.numel() // length if length else 0
    if num_rows:
        tiles = row_tiles(length)
        add_rms_norm_kernel[(num_rows,)](
            rows, res, _rows(weight), out, h, length, eps,
            BLOCK=block or tiles.block, HAS_RESIDUAL=residual is not None, MAX_CONTIGUOUS=load_contiguity(length),
            num_warps=tiles.num_warps, **NO_FMA,
        )
    return out.view(x.shape), (h.view(x.shape) if residual is not None else x)


def qk_norm_rope(
    x: torch.Tensor, weight: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, eps: float,
) -> torch.Tensor:
    """x [T, H, D]; weight [D] or None (rope only); cos, sin [T, 1, D] -> [T, H, D]. bf16/fp16, even D <= 1024."""
    num_tokens, num_heads, head_dim = x.shape
    rows = _rows(x)
    out = torch.empty_like(rows)
    if rows.numel():
        tiles = row_tiles(head_dim)
        qk_norm_rope_kernel[(num_tokens * num_heads,)](
            rows, _rows(weight) if weight is not None else rows, _rows(cos), _rows(sin), out,
            head_dim, num_heads, eps,
            BLOCK=tiles.block, HAS_NORM=weight is not None, MAX_CONTIGUOUS=load_contiguity(head_dim),
            num_warps=tiles.num_warps, **NO_FMA,
        )
    return out


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, elementwise, each rounded to the dtype as the two torch kernels do. bf16/fp16."""
    g, u = gate.contiguous(), up.contiguous()
    out = torch.empty_like(g)
    n = g.numel()
    if n:
        grid = (triton.cdiv(n, POINTWISE_BLOCK),)
        silu_mul_kernel[grid](g, u, out, n, BLOCK=POINTWISE_BLOCK, num_warps=POINTWISE_NUM_WARPS, **NO_FMA)
    return out
