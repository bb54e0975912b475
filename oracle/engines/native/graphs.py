"""CUDA graphs of decode steps: one graph per (batch-size bucket, block-table width), as vLLM does.

A decode step (every scheduled sequence computes one token and samples) is padded to the next
bucket size (1, 2, 4, 8, 16, ... by 8) and its block table to the next power-of-two width;
the graph for that shape is captured the first time it is needed (after one eager warm-up run
of the same inputs) and replayed afterwards. Padding rows compute a one-token sequence in a
reserved junk block of the KV cache, so they never write a real slot, and their logits are
dropped. With the invariant kernels, row r of every op is bitwise independent of the other rows
and the captured attention runs the same kernel programs as the eager one
(`oracle_kernels.triton.attention.decode_query_tiles`), so a replay gives the eager bits.

The per-step inputs are one int64 buffer per graph: ids, positions, slots, context lengths
[bucket] each, then the block table [bucket, width]; one host-to-device copy fills it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from oracle.engines.native.model import Decoder, StepInputs


def decode_buckets(max_num_seqs: int) -> tuple[int, ...]:
    """The batch sizes graphs are captured for: 1, 2, 4, then every multiple of 8 up to max_num_seqs."""
    top = max(1, max_num_seqs)
    small = [b for b in (1, 2, 4) if b < top]
    return (*small, *range(8, -(-top // 8) * 8 + 1, 8))


def width_bucket(num_blocks: int) -> int:
    """The block-table width of the graph that holds a table of `num_blocks` columns."""
    return 1 << max(0, (max(1, num_blocks) - 1).bit_length())


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    packed: torch.Tensor  # [bucket * 4 + bucket * width] int64: the inputs
    logits: torch.Tensor  # [bucket, vocab] float32: the output


class DecodeGraphs:
    """The captured decode graphs of one engine (one mode, one KV cache)."""

    def __init__(
        self, decoder: Decoder, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], junk_block: int,
        block_size: int, max_num_seqs: int, num_kv_splits: Callable[[int], int],
    ) -> None:
        self.decoder = decoder
        self.kv_caches = kv_caches
        self.junk_block = junk_block
        self.block_size = block_size
        self.buckets = decode_buckets(max_num_seqs)
        self.num_kv_splits = num_kv_splits
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[tuple[int, int], _Graph] = {}

    def bucket_for(self, num_seqs: int) -> int | None:
        return next((b for b in self.buckets if b >= num_seqs), None)

    def _pack(self, bucket: int, width: int, ids: list[int], positions: list[int], slots: list[int],
              seq_lens: list[int], tables: list[list[int]]) -> torch.Tensor:
        pad = bucket - len(ids)
        junk = self.junk_block
        flat: list[int] = [*ids, *[0] * pad, *positions, *[0] * pad, *slots, *[junk * self.block_size] * pad,
                           *seq_lens, *[1] * pad]
        for row in tables:
            flat += row + [junk] * (width - len(row))
        flat += [junk] * (width * pad)
        return torch.tensor(flat, dtype=torch.int64)

    def _forward(self, packed: torch.Tensor, bucket: int, width: int) -> torch.Tensor:
        b = bucket
        device = packed.device
        inputs = StepInputs(
            input_ids=packed[0:b], positions=packed[b : 2 * b], slot_mapping=packed[2 * b : 3 * b],
            block_tables=packed[4 * b :].view(b, width).to(torch.int32), seq_lens=packed[3 * b : 4 * b].to(torch.int32),
            query_start_loc=torch.arange(b + 1, dtype=torch.int32, device=device),
            logits_indices=torch.arange(b, device=device), num_kv_splits=self.num_kv_splits(b),
        )
        return self.decoder.forward(inputs, self.kv_caches)

    def run(self, ids: list[int], positions: list[int], slots: list[int], seq_lens: list[int],
            tables: list[list[int]]) -> torch.Tensor:
        """Logits [len(ids), vocab] float32 of one decode step (a view of the graph's output)."""
        num_seqs = len(ids)
        bucket = self.bucket_for(num_seqs)
        if bucket is None:
            raise ValueError(f"decode step of {num_seqs} sequences is larger than every graph bucket")
        width = width_bucket(max(len(row) for row in tables))
        host = self._pack(bucket, width, ids, positions, slots, seq_lens, tables)
        entry = self.graphs.get((bucket, width))
        if entry is None:
            entry = self._capture(bucket, width, host)
        else:
            entry.packed.copy_(host)
        entry.graph.replay()
        return entry.logits[:num_seqs]

    def _capture(self, bucket: int, width: int, host: torch.Tensor) -> _Graph:
        device = self.decoder.device
        packed = host.to(device)
        # Warm-up on a side stream (kernel compilation, cuBLASLt's first-call checks), then capture.
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            self._forward(packed, bucket, width)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self._forward(packed, bucket, width)
        entry = _Graph(graph, packed, logits)
        self.graphs[(bucket, width)] = entry
        return entry
