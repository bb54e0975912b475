"""The scheduler alone (no torch): budget, max_num_seqs, chunked prefill and arrival steps."""

from __future__ import annotations

import sys

import pytest

from oracle.engines.native.scheduler import BlockAllocator, Scheduler, Sequence
from oracle.errors import EngineError


def _seqs(lengths: list[int], max_tokens: int = 3, arrivals: list[int] | None = None) -> list[Sequence]:
    arrivals = arrivals or [0] * len(lengths)
    return [Sequence(i, n, list(range(n)), max_tokens, a) for i, (n, a) in enumerate(zip(lengths, arrivals, strict=True))]


def _drive(s: Scheduler, steps: int = 100) -> list[list[tuple[int, int, bool]]]:
    log = []
    for step in range(steps):
        if s.is_done():
            break
        batch = s.schedule(step)
        log.append([(b.seq.index, b.num_new_tokens, b.is_prefill) for b in batch])
        s.update(batch, {b.seq.index: 7 for b in batch if b.completes})
    return log


def test_scheduler_imports_no_torch() -> None:
    assert "oracle.engines.native.scheduler" in sys.modules
    import importlib.util

    spec = importlib.util.find_spec("oracle.engines.native.scheduler")
    assert spec is not None and spec.origin is not None
    with open(spec.origin) as f:
        assert "import torch" not in f.read()


def test_chunked_prefill_respects_budget() -> None:
    seqs = _seqs([10, 3])
    log = _drive(Scheduler(seqs, BlockAllocator(64, 4), 8, 4, True))
    assert log[0] == [(0, 4, True)]
    assert log[1] == [(0, 4, True)]
    assert log[2] == [(0, 2, True), (1, 2, True)]
    assert all(sum(n for _, n, _ in step) <= 4 for step in log)
    assert all(s.num_generated == 3 for s in seqs)


def test_no_chunking_waits_for_whole_prompt() -> None:
    with pytest.raises(EngineError, match="exceeds max_num_batched_tokens"):
        Scheduler(_seqs([10]), BlockAllocator(64, 4), 8, 4, False)
    log = _drive(Scheduler(_seqs([3, 3]), BlockAllocator(64, 4), 8, 4, False))
    assert log[0] == [(0, 3, True)]


def test_max_num_seqs_and_arrivals() -> None:
    seqs = _seqs([2, 2, 2], max_tokens=2, arrivals=[0, 0, 3])
    log = _drive(Scheduler(seqs, BlockAllocator(64, 4), 2, 100, True))
    assert [i for i, _, _ in log[0]] == [0, 1]
    assert all(2 not in [i for i, _, _ in step] for step in log[:3])
    assert any(2 in [i for i, _, _ in step] for step in log[3:])


def test_blocks_are_released() -> None:
    alloc = BlockAllocator(8, 4)
    _drive(Scheduler(_seqs([5, 5]), alloc, 8, 100, True))
    assert len(alloc.free) == 8


def test_schedule_is_reproducible_and_holds_boundary_sizes() -> None:
    from oracle.config import ScheduleConfig
    from oracle.schedule import draw_schedule

    cfg = ScheduleConfig(trials=40, batch_size=(1, 300), filler_len=(1, 4))
    a = draw_schedule(cfg, [5, 9, 30], seed=11)
    assert a == draw_schedule(cfg, [5, 9, 30], seed=11)
    assert a != draw_schedule(cfg, [5, 9, 30], seed=12)
    sizes = {t.batch_size for t in a}
    assert {1, 2, 15, 16, 17, 255, 256, 257} <= sizes
    assert all(1 <= t.batch_size <= 300 and 0 <= t.position < t.batch_size for t in a)
