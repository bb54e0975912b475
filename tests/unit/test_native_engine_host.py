"""The native engine's host bookkeeping per step: the fast paths give what the plain constructors give."""

from __future__ import annotations

import dataclasses

import pytest

from oracle.engines.contract import StepEvidence
from oracle.engines.native.engine import pass_evidence
from oracle.engines.native.scheduler import BlockAllocator, Scheduler, Sequence, scheduled


def _batch() -> list:
    seqs = [Sequence(i, n, list(range(n)), 4, 0) for i, n in enumerate((5, 9, 3))]
    alloc = BlockAllocator(64, 4)
    sched = Scheduler(seqs, alloc, max_num_seqs=8, max_num_batched_tokens=12, enable_chunked_prefill=True)
    first = sched.schedule(0)  # 5 + 7 tokens: the second prompt is chunked
    sched.update(first, {item.seq.index: 1 for item in first if item.completes})
    return sched.schedule(1)  # a decode, the chunk's rest, a new prompt


def test_pass_evidence_equals_the_constructor() -> None:
    batch = _batch()
    assert [(b.is_prefill, b.completes) for b in batch] == [(False, True), (True, True), (True, True)]
    num_tokens = sum(b.num_new_tokens for b in batch)
    got = pass_evidence(7, batch, num_tokens)
    chunked = [False, True, False]
    kv = [b.seq.num_computed_tokens + b.num_new_tokens for b in batch]
    want = [StepEvidence(engine_step=7, num_seqs=3, num_tokens=num_tokens, is_prefill=b.is_prefill, chunked=chunked[i],
                         num_cached_tokens=0, token_index=b.seq.num_generated, seq_position=i,
                         num_prefill_tokens=num_tokens - 1, num_decode_tokens=1, max_query_len=3,
                         kv_len=kv[i], max_kv_len=max(kv), has_chunked=True, has_cache_hit=False)
            for i, b in enumerate(batch)]
    assert got == want
    assert [dataclasses.asdict(e) for e in got] == [dataclasses.asdict(e) for e in want]
    assert all(set(vars(e)) == {f.name for f in dataclasses.fields(StepEvidence)} for e in got)
    with pytest.raises(dataclasses.FrozenInstanceError):
        got[0].num_seqs = 1  # type: ignore[misc]


def test_scheduled_says_whether_the_pass_completes_the_sequence() -> None:
    seq = Sequence(0, 6, list(range(6)), 4, 0)
    assert scheduled(seq, 6, True).completes and not scheduled(seq, 5, True).completes


def test_sequences_compare_by_identity() -> None:
    a, b = (Sequence(0, 2, [1, 2], 4, 0) for _ in range(2))
    assert a != b and a == a
