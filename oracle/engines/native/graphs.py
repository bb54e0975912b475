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

Every capture of one engine shares one memory pool and one capture stream of its own, and is
warmed up on that stream first. A capture that fails is closed in the allocator before the error
propagates (`capturing`), so the pool never stays "recording"; the next capture takes a fresh pool.
"""

from __future__ import annotations

import contextlib
import gc
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

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


class _Capturable(Protocol):
    def capture_begin(self, pool: Any = None) -> None: ...
    def capture_end(self) -> None: ...


@contextlib.contextmanager
def capturing(graph: _Capturable, pool: Any, stream: contextlib.AbstractContextManager[Any],
              end_allocate: Callable[[], None]) -> Iterator[None]:
    """Capture the body into `graph` on `stream` (a stream context), allocating from `pool`.

    Every way out closes the capture. `torch.cuda.graph` does not: where capture_begin fails after
    registering the pool with the allocator, or capture_end fails (an invalidated capture: its
    cudaStreamEndCapture raises before the allocator is told), the pool stays registered as recording
    and the capture stream stays current, and the next capture into that pool raises
    `beginAllocateToPool: already recording to mempool_id`. Here any failure calls `end_allocate`
    (which ignores a pool that is not recording) and exits the stream context before it propagates.

    Python's cyclic garbage collector is off meanwhile: a collection inside the capture may destroy
    another engine's CUDA graph, a call that a stream capture in global mode does not allow, which
    invalidates this capture.
    """
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        with stream:
            try:
                graph.capture_begin(pool=pool)
                try:
                    yield
                finally:
                    graph.capture_end()
            except BaseException:
                end_allocate()
                raise
    finally:
        if gc_was_enabled:
            gc.enable()


def _end_allocate_to_pool(device: torch.device, pool: Any) -> None:
    """End a capture's allocation to `pool` in torch's caching allocator, if it is still open."""
    end = getattr(torch._C, "_cuda_endAllocateToPool", None)
    if end is None:
        return
    # RuntimeError "not currently recording": capture_end had closed it, or begin never opened it.
    with contextlib.suppress(RuntimeError):
        end(device.index if device.index is not None else torch.cuda.current_device(), pool)


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
        self.pool = torch.cuda.graph_pool_handle()  # shared by this engine's captures, never by another's
        self.stream = torch.cuda.Stream(decoder.device)  # warm-ups and captures run here
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.failed_captures = 0

    def bucket_for(self, num_seqs: int) -> int | None:
        return next((b for b in self.buckets if b >= num_seqs), None)

    def _pack(self, bucket: int, width: int, ids: list[int], positions: list[int], slots: list[int],
              seq_lens: list[int], tables: list[list[int]]) -> torch.Tensor:
        pad = bucket - len(ids)
        junk = self.junk_block
        flat: list[int] = [*ids, *[0] * pad, *positions, *[0] * pad, *slots, *[junk * self.block_size] * pad,
                           *seq_lens, *[1] * pad]
        for row in tables:
            flat += row
            flat += [junk] * (width - len(row))
        flat += [junk] * (width * pad)
        return torch.frombuffer(array("q", flat), dtype=torch.int64)  # 3x faster than torch.tensor of a list

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
            tables: list[list[int]], fill: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
        """Logits [len(ids), vocab] float32 of one decode step (a view of the graph's output). `fill`, given
        the step's ids on the device, writes the ones the host does not have yet (queued before the pass)."""
        num_seqs = len(ids)
        bucket = self.bucket_for(num_seqs)
        if bucket is None:
            raise ValueError(f"decode step of {num_seqs} sequences is larger than every graph bucket")
        width = width_bucket(max(len(row) for row in tables))
        host = self._pack(bucket, width, ids, positions, slots, seq_lens, tables)
        entry = self.graphs.get((bucket, width))
        if entry is None:
            entry = self._capture(bucket, width, host, fill)
        else:
            # Pinned and without a wait: the step before may still be running (the engine overlaps steps).
            entry.packed.copy_(host.pin_memory(), non_blocking=True)
            if fill is not None:
                fill(entry.packed[:bucket])
        entry.graph.replay()
        return entry.logits[:num_seqs]

    def _capture(self, bucket: int, width: int, host: torch.Tensor,
                 fill: Callable[[torch.Tensor], None] | None = None) -> _Graph:
        device = self.decoder.device
        packed = host.to(device)
        if fill is not None:  # the warm-up below runs these inputs
            fill(packed[:bucket])
        current = torch.cuda.current_stream(device)
        # Warm-up on the capture stream (kernel compilation, cuBLASLt's first-call checks, the stream's
        # cuBLAS workspace), so that nothing is created for the first time inside the capture.
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            self._forward(packed, bucket, width)
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        try:
            with capturing(graph, self.pool, torch.cuda.stream(self.stream),
                           lambda: _end_allocate_to_pool(device, self.pool)):
                logits = self._forward(packed, bucket, width)
        except BaseException:
            # The pool may hold a half-made capture's blocks: later captures take a fresh one.
            self.failed_captures += 1
            self.pool = torch.cuda.graph_pool_handle()
            raise
        current.wait_stream(self.stream)
        entry = _Graph(graph, packed, logits)
        self.graphs[(bucket, width)] = entry
        return entry
