"""Fixed kernel configurations: tile sizes per dtype, chosen once and never autotuned.

A batch-invariant kernel must compute every output row in the same way whatever the batch.
On the CPU we get there by running torch's own kernels only on canonical shapes: the rows of
an op are cut into tiles of exactly `rows` rows (the last one padded with zeros), so the
kernel that does the arithmetic sees a shape that depends on the op's non-batch sizes (K, N,
the reduced length) and on these constants, never on how many rows the caller had.

The numbers are a speed trade-off measured on a 2-core AVX-512 machine (torch 2.13, MKL,
oneDNN): a larger tile amortises the per-call overhead of big batches but pads small ones.
Changing one changes which bits a kernel produces, so every change must be followed by the
position-independence tests (tests/unit/test_kernels_*.py), which try every row of a tile.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CpuTiles:
    """Tile sizes of the CPU backend for one dtype."""

    mm_rows: int  # rows of A per mm/addmm call: every call is [mm_rows, K] @ [K, N]
    bmm_batch: int  # matrices per bmm call
    bmm_rows: int  # rows of each matrix per bmm call: every call is [bmm_batch, bmm_rows, K] @ [bmm_batch, K, N]
    reduce_rows: int  # rows per softmax / log_softmax / sum / mean call: every call is [reduce_rows, N]


# MKL's fp32 gemm computes row 0 in one way for M=1 (gemv), another for M=2..3 and a third
# for M>=4; oneDNN's bf16 path changes at small sizes too. 16 rows is past every switch we
# measured and keeps the cost of a decode step (M=1) within about 5x of torch's gemv.
_CPU_TILES: dict[torch.dtype, CpuTiles] = {
    torch.float32: CpuTiles(mm_rows=16, bmm_batch=8, bmm_rows=16, reduce_rows=64),
    torch.float64: CpuTiles(mm_rows=16, bmm_batch=8, bmm_rows=16, reduce_rows=64),
    torch.bfloat16: CpuTiles(mm_rows=16, bmm_batch=8, bmm_rows=16, reduce_rows=64),
    torch.float16: CpuTiles(mm_rows=16, bmm_batch=8, bmm_rows=16, reduce_rows=64),
}

TILED_DTYPES: frozenset[torch.dtype] = frozenset(_CPU_TILES)


def cpu_tiles(dtype: torch.dtype) -> CpuTiles:
    """The fixed tile sizes for `dtype` on the CPU; raises for dtypes the table does not hold."""
    try:
        return _CPU_TILES[dtype]
    except KeyError:
        raise NotImplementedError(f"oracle_kernels has no CPU tile configuration for {dtype}") from None


@dataclass(frozen=True)
class AttentionTiles:
    """The fixed shapes of the invariant paged attention.

    The KV range of every query is cut at absolute positions 0, kv_split, 2*kv_split, ...; each
    chunk is one problem `[rows, D] @ [D, kv_split]` then `[rows, kv_split] @ [kv_split, D]`, and
    `problems` of them go to torch's bmm at a time. Chunk results are merged in position order.
    """

    kv_split: int
    rows: int
    problems: int


# Attention always computes in float32 (bf16/fp16 inputs are upcast), so one entry suffices.
ATTENTION_TILES = AttentionTiles(kv_split=32, rows=8, problems=32)
