"""Fixed Triton configurations of the CUDA backend, per dtype; chosen once, never autotuned.

Batch invariance asks that every output element is computed by the same sequence of floating-point
operations whatever the batch. In a Triton kernel the shapes of the blocks, the reduction loop and
the instruction that multiplies them decide that sequence; the number of rows only decides how
many programs run. So every number here is a constant of the dtype (and, for the row reductions,
of the reduced length, which is the same for every row of a call and for a batch of one), never a
function of the batch size. Nothing here imports triton: the tables are plain data.

Matrix products: one table of tiers per dtype, picked by M (and, for the first tier, by how many
column tiles N makes against the GPU's SMs). Every tier runs one sequential loop over K from 0
(no split-K) and, for bf16/fp16, the same tensor core instruction: Hopper's wgmma, whose tile is
64 rows by BLOCK_N columns by 16 along K. Every tier keeps BLOCK_M a multiple of 64 and the warps
a multiple of 4 so that Triton always picks wgmma and never falls back to mma.sync (m16n8k16),
whose internal accumulation need not round alike. An element's value is then the chain
acc <- wgmma(acc, a[k:k+16], b[k:k+16]) for k = 0, 16, 32, ... in the same order in every tier;
BLOCK_M and BLOCK_N only decide how many rows and columns one program carries along that chain,
and BLOCK_K how many of its steps one loop iteration issues, not what happens to an element
(measured on an H200: BLOCK_N 16..128 and BLOCK_K 64..256 all give the same bits). The GPU tests
run every tier on the same operands and require bitwise equality, and compare every batch size
across the tier boundaries; other GPUs (mma.sync on Ampere, tcgen05 on Blackwell) rely on the
same tests. Changing a number below can change which bits the kernels produce: rerun
`pytest -m gpu tests/gpu/test_kernels_cuda.py` after any change.

The same chain is what cuBLASLt computes without split-K on Hopper, so bf16/fp16 products with
M >= CUBLASLT_MIN_M go to cuBLASLt where it was seen to give these bits (kernels/cublaslt.py); the
tiers below then serve the decode sizes, CUDA-graph capture of unseen problems, and every product
on GPUs or torch versions without that path.

fp32 is multiplied in IEEE fp32 (`input_precision="ieee"`), never TF32: Triton lowers that to a
chain of FMAs in K order on the CUDA cores, the same chain for every tile shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MatmulTiles:
    """One persistent-matmul configuration: each program walks output tiles [block_m, block_n]."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int  # output tiles grouped along M for L2 reuse of B; changes the visit order, not the bits
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class MatmulConfig:
    """The matmul configuration of one dtype: tiers by M, and how tl.dot treats the operands."""

    # (largest M, tiles) in increasing M; the last tier takes every larger M.
    tiers: tuple[tuple[int, MatmulTiles], ...]
    # "ieee" for fp32/fp64. For bf16/fp16 the flag only concerns fp32 operands, so it is left at
    # Triton's default; the products of 16-bit operands are exact in fp32 either way.
    input_precision: str
    # The first tier's tiles where their column tiles would leave SMs idle and the narrower ones
    # still fit in one wave (a decode-sized product with N = 4096 on 132 SMs: 64 tiles, or 128).
    narrow: MatmulTiles | None = None

    def tiles_for(self, m: int, n: int = 0, slots: int = 0) -> MatmulTiles:
        """The tiles for a product with `m` rows (of each matrix, for bmm), `n` columns, `slots` SMs."""
        tiles = next((t for largest_m, t in self.tiers if m <= largest_m), self.tiers[-1][1])
        if (self.narrow is not None and tiles is self.tiers[0][1]
                and -(-n // tiles.block_n) < slots and -(-n // self.narrow.block_n) <= slots):
            return self.narrow
        return tiles


_LARGE = 1 << 62

# bf16/fp16 on Hopper (132 SMs on an H200). No split-K means parallelism comes only from output
# tiles, so smaller M gets narrower tiles to keep the SMs busy: decode sizes (M <= 64, bandwidth
# bound) stream the weight through 64 x 64 tiles (64 x 32 where those fill one wave and 64 x 64 do
# not, as for N = 4096) with 128-deep K blocks and a deep pipeline (H200, M = 1 and 8 on the
# Qwen3-8B shapes: 0.95-1.08x of cuBLAS, but 0.86x for N = K = 4096 at M = 8, where cuBLAS splits
# K); 128 x 256 is the classic compute-bound tile for large M. Every tier issues wgmma's k = 16 steps in K order (see the module docstring). Measured
# choices: `python -m oracle_kernels.bench --sweep` times candidate tiles per M and checks their
# bits. A GPU with less shared memory than an H200 runs them with fewer stages (matmul.py).
_HALF_MATMUL = MatmulConfig(
    tiers=(
        (64, MatmulTiles(block_m=64, block_n=64, block_k=128, group_m=1, num_warps=4, num_stages=6)),
        (256, MatmulTiles(block_m=64, block_n=128, block_k=64, group_m=8, num_warps=4, num_stages=4)),
        (1024, MatmulTiles(block_m=128, block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=4)),
        (_LARGE, MatmulTiles(block_m=128, block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=3)),
    ),
    input_precision="tf32",
    narrow=MatmulTiles(block_m=64, block_n=32, block_k=128, group_m=1, num_warps=4, num_stages=8),
)

# bf16/fp16 products with at least this many rows go to cuBLASLt without split-K where it gives
# the Triton kernel's bits (kernels/cublaslt.py). Below, cuBLASLt without split-K can be far
# slower than cuBLAS (H200: 0.10x at M = 1 and 8 for K = 12288, N = 4096; 0.42x at M = 1 for
# K = N = 4096), and from 32 up it runs at 0.86-1.36x of cuBLAS on the Qwen3-8B shapes.
CUBLASLT_MIN_M = 32

# The fallback if a GPU ever gives different bits for different tiers (tests/gpu/test_kernels_cuda.py
# says so by name): one tier for every M, as the first batch-invariant matmuls did. Slower for
# decode sizes; put it in `_MATMUL` for bf16 and fp16 instead of `_HALF_MATMUL`.
_HALF_MATMUL_ONE_TIER = MatmulConfig(tiers=(_HALF_MATMUL.tiers[-1],), input_precision="tf32")

# fp32 in IEEE fp32 on the CUDA cores (FMA chain in K order); one tier.
_FP32_MATMUL = MatmulConfig(
    tiers=((_LARGE, MatmulTiles(block_m=64, block_n=64, block_k=16, group_m=8, num_warps=4, num_stages=3)),),
    input_precision="ieee",
)

_FP64_MATMUL = MatmulConfig(
    tiers=((_LARGE, MatmulTiles(block_m=32, block_n=32, block_k=16, group_m=8, num_warps=4, num_stages=2)),),
    input_precision="ieee",
)

_MATMUL: dict[torch.dtype, MatmulConfig] = {
    torch.bfloat16: _HALF_MATMUL,
    torch.float16: _HALF_MATMUL,
    torch.float32: _FP32_MATMUL,
    torch.float64: _FP64_MATMUL,
}

FLOAT_DTYPES: frozenset[torch.dtype] = frozenset(_MATMUL)


def matmul_config(dtype: torch.dtype) -> MatmulConfig:
    """The fixed matmul configuration of `dtype`; raises for dtypes the table does not hold."""
    try:
        return _MATMUL[dtype]
    except KeyError:
        raise NotImplementedError(f"oracle_kernels has no CUDA matmul configuration for {dtype}") from None


@dataclass(frozen=True)
class RowTiles:
    """A row reduction (softmax, sum, mean, RMS norm): one program per row, `block` lanes.

    Each lane accumulates its columns c, c + block, c + 2 * block, ... in order, then one tree
    reduction over the lanes, whose shape is fixed by `block` and `num_warps`.
    """

    block: int
    num_warps: int


# The block is min(max_block, next power of two >= C): a function of the reduced length C only.
_ROW_MAX_BLOCK = 1024
_ROW_NUM_WARPS = 4


def row_tiles(length: int) -> RowTiles:
    """The tiles of a row reduction over `length` elements (the same for every row of every call)."""
    block = 16
    while block < length and block < _ROW_MAX_BLOCK:
        block *= 2
    return RowTiles(block=block, num_warps=_ROW_NUM_WARPS)


# Elementwise ops: contiguous blocks of this many elements per program; no reduction at all.
POINTWISE_BLOCK = 1024
POINTWISE_NUM_WARPS = 4


@dataclass(frozen=True)
class AttentionTiles:
    """The invariant paged attention's fixed shapes.

    A program owns up to `rows` query rows (consecutive tokens of one sequence times the query
    heads of one kv head, padded to a power of two) and one partition of `partition` absolute
    positions [p * partition, (p + 1) * partition), which it walks in chunks of `chunk` keys in
    order. A second kernel merges each row's partitions in position order. Both the chunk and the
    partition boundaries are absolute positions, so a token meets the same chunks and partitions
    in a prefill, a chunked prefill and a decode, whatever else is in the batch.
    """

    rows: int
    chunk: int
    partition: int
    num_warps: int
    num_stages: int

    def __post_init__(self) -> None:
        if self.partition % self.chunk:
            raise ValueError(f"partition ({self.partition}) must be a multiple of chunk ({self.chunk})")


# 16 rows: the smallest tl.dot tile, so a decode query (one token, G heads) wastes little. For
# bf16/fp16 both products run on tensor cores with fp32 accumulation (probabilities are rounded
# to the value dtype for the second one, as FlashAttention does); fp32 runs in IEEE fp32.
_HALF_ATTENTION = AttentionTiles(rows=16, chunk=64, partition=512, num_warps=4, num_stages=2)
_FP32_ATTENTION = AttentionTiles(rows=16, chunk=32, partition=512, num_warps=4, num_stages=2)

_ATTENTION: dict[torch.dtype, AttentionTiles] = {
    torch.bfloat16: _HALF_ATTENTION,
    torch.float16: _HALF_ATTENTION,
    torch.float32: _FP32_ATTENTION,
}

# Upper bound of the fp32 scratch that holds every row's partition results, in bytes. A longer
# step runs as several launches over consecutive token ranges; a row's arithmetic is the same.
ATTENTION_WORKSPACE_BYTES = 256 << 20


def attention_tiles(dtype: torch.dtype) -> AttentionTiles:
    """The fixed attention shapes of `dtype`; raises for dtypes the table does not hold."""
    try:
        return _ATTENTION[dtype]
    except KeyError:
        raise NotImplementedError(f"oracle_kernels has no CUDA attention configuration for {dtype}") from None
