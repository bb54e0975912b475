"""Continuous batching with a token budget, chunked prefill and arrival steps. Imports no torch.

Each engine step the scheduler picks which sequences run and how many of their tokens, the
model runner runs them, and the scheduler records the sampled tokens. The policy follows
vLLM's v1 scheduler: running sequences first (one decode token, or the next prefill chunk),
then waiting ones while `max_num_seqs` and `max_num_batched_tokens` allow.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

from oracle.errors import EngineError


class Status(Enum):
    PENDING = "pending"  # not yet arrived
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One request's state inside the engine (compared by identity: two requests never share one)."""

    index: int  # position in the caller's request list
    prompt_len: int
    tokens: list[int]  # prompt + generated
    max_tokens: int
    arrival_step: int
    stop_token_id: int | None = None
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    num_prefill_passes: int = 0
    num_cached_tokens: int = 0
    status: Status = Status.PENDING

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def is_prefill(self) -> bool:
        return self.num_computed_tokens < self.prompt_len

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED


class ScheduledSeq(NamedTuple):
    """One sequence's part of a pass (a tuple: a thousand are made per decode step)."""

    seq: Sequence
    num_new_tokens: int
    is_prefill: bool
    completes: bool  # this pass computes the sequence's last known token, so it samples a new one


def scheduled(seq: Sequence, num_new_tokens: int, is_prefill: bool) -> ScheduledSeq:
    """`seq`'s part of the pass being scheduled: `num_new_tokens` from its first token not yet computed."""
    return ScheduledSeq(seq, num_new_tokens, is_prefill, seq.num_computed_tokens + num_new_tokens == len(seq.tokens))


class BlockAllocator:
    """Free list over the KV cache's blocks, with optional prefix caching.

    With caching on, every full block is registered under the hash of the token ids from the
    start of the sequence to the block's end; a later prompt starting with the same tokens reuses
    those blocks instead of computing them. A released block keeps its contents (and stays
    matchable) until the free list hands it out again, oldest released first.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = False) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.free: deque[int] = deque(range(num_blocks))
        self.refs = [0] * num_blocks
        self.by_hash: dict[bytes, int] = {}
        self.hash_of: dict[int, bytes] = {}

    def _take(self) -> int:
        block = self.free.popleft()
        old = self.hash_of.pop(block, None)
        if old is not None and self.by_hash.get(old) == block:
            del self.by_hash[old]
        self.refs[block] = 1
        return block

    def ensure(self, seq: Sequence, num_tokens: int) -> None:
        """Give `seq` enough blocks to hold `num_tokens` positions."""
        needed = -(-num_tokens // self.block_size) - len(seq.block_table)
        if needed > len(self.free):
            raise EngineError(f"KV cache out of blocks ({len(self.free)} free, {needed} needed)")
        for _ in range(needed):
            seq.block_table.append(self._take())

    def release(self, seq: Sequence) -> None:
        for block in seq.block_table:
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free.append(block)
        seq.block_table = []

    def _hashes(self, tokens: list[int], num_blocks: int) -> list[bytes]:
        """Chained sha256 per full block: block i's hash covers tokens[0:(i+1)*block_size]."""
        bs = self.block_size
        out: list[bytes] = []
        prev = b""
        for i in range(num_blocks):
            prev = hashlib.sha256(prev + array("q", tokens[i * bs:(i + 1) * bs]).tobytes()).digest()
            out.append(prev)
        return out

    def match_prefix(self, seq: Sequence) -> int:
        """Attach cached blocks of the prompt's longest cached prefix; returns the tokens it covers.

        At least the prompt's last token is always computed, so it has logits to sample from.
        """
        if not self.enable_caching or seq.block_table:
            return 0
        max_blocks = (seq.prompt_len - 1) // self.block_size
        for h in self._hashes(seq.tokens, max_blocks):
            block = self.by_hash.get(h)
            if block is None:
                break
            if self.refs[block] == 0:
                self.free.remove(block)
            self.refs[block] += 1
            seq.block_table.append(block)
        return len(seq.block_table) * self.block_size

    def register(self, seq: Sequence) -> None:
        """Make the sequence's fully computed blocks matchable."""
        if not self.enable_caching:
            return
        full = seq.num_computed_tokens // self.block_size
        for block, h in zip(seq.block_table[:full], self._hashes(seq.tokens, full), strict=True):
            if h not in self.by_hash:
                self.by_hash[h] = block
                self.hash_of[block] = h


class Scheduler:
    def __init__(
        self,
        seqs: list[Sequence],
        allocator: BlockAllocator,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool,
    ) -> None:
        self.pending = sorted(seqs, key=lambda s: (s.arrival_step, s.index))
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.allocator = allocator
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.num_unfinished = len(seqs)
        too_long = [s for s in seqs if s.prompt_len > max_num_batched_tokens and not enable_chunked_prefill]
        if too_long:
            raise EngineError(
                f"prompt of {too_long[0].prompt_len} tokens exceeds max_num_batched_tokens="
                f"{max_num_batched_tokens} with chunked prefill off"
            )

    def is_done(self) -> bool:
        return self.num_unfinished == 0

    def schedule(self, step: int) -> list[ScheduledSeq]:
        while self.pending and self.pending[0].arrival_step <= step:
            seq = self.pending.pop(0)
            seq.status = Status.WAITING
            self.waiting.append(seq)
        budget = self.max_num_batched_tokens
        batch: list[ScheduledSeq] = []
        block_size = self.allocator.block_size
        for seq in self.running:
            if budget == 0:
                break
            computed = seq.num_computed_tokens
            is_prefill = computed < seq.prompt_len
            n = min(len(seq.tokens) - computed, budget)
            if is_prefill and n < seq.prompt_len - computed and not self.enable_chunked_prefill:
                continue
            if computed + n > len(seq.block_table) * block_size:
                self.allocator.ensure(seq, computed + n)
            batch.append(ScheduledSeq(seq, n, is_prefill, computed + n == len(seq.tokens)))
            budget -= n
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            seq = self.waiting[0]
            cached = self.allocator.match_prefix(seq)
            seq.num_computed_tokens = seq.num_cached_tokens = cached
            n = min(seq.num_tokens - cached, budget)
            if n < seq.num_tokens - cached and not self.enable_chunked_prefill:
                self.allocator.release(seq)
                seq.num_computed_tokens = seq.num_cached_tokens = 0
                break
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            self.allocator.ensure(seq, cached + n)
            batch.append(scheduled(seq, n, True))
            budget -= n
        return batch

    def update(self, batch: list[ScheduledSeq], sampled: dict[int, int]) -> None:
        """Record a pass: advance computed counts and append sampled tokens (by sequence index)."""
        caching = self.allocator.enable_caching
        for seq, num_new_tokens, is_prefill, _ in batch:
            if is_prefill:
                seq.num_prefill_passes += 1
            seq.num_computed_tokens += num_new_tokens
            if caching:
                self.allocator.register(seq)
            token = sampled.get(seq.index)
            if token is None:
                continue
            seq.tokens.append(token)
            if len(seq.tokens) - seq.prompt_len >= seq.max_tokens or token == seq.stop_token_id:
                seq.status = Status.FINISHED
                self.running.remove(seq)
                self.allocator.release(seq)
                self.num_unfinished -= 1
