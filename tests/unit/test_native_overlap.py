"""Overlapping steps (engine option `overlap_steps`): step N+1 is scheduled and launched before step N's tokens
reach the host, and every output is what one step at a time gives.

On the CPU the device work runs as it is queued, so nothing overlaps in time here; what these tests check is the
bookkeeping the GPU relies on: the stand-in tokens, the inputs taken from the step before's rows on the device,
the order of records, and where overlap must not happen (a stop token, per-op capture).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from bitwise import assert_same_bits

from oracle.config import EngineConfig
from oracle.engines.contract import Mode, Request, RunSpec, SamplingParams
from oracle.engines.native import NativeEngine
from oracle.engines.native import engine as native_engine


def _engine(model: Any, mode: Mode, overlap: bool, **values: Any) -> NativeEngine:
    return NativeEngine(model, mode, EngineConfig.of("native", num_threads=1, overlap_steps=overlap, **values))


def _requests(seed: int, count: int = 7) -> list[Request]:
    """Mixed sampling (greedy and seeded, full rows, digests, none), staggered arrivals, shared prefixes."""
    rng = random.Random(seed)
    shared = tuple(rng.randrange(512) for _ in range(20))
    kinds = ["full", "digest", "none"]
    reqs = []
    for i in range(count):
        prompt = (shared if i % 2 else ()) + tuple(rng.randrange(512) for _ in range(rng.randint(3, 40)))
        sampling = SamplingParams(max_tokens=rng.randint(1, 9), temperature=0.0 if i % 3 else 0.8, seed=i,
                                  logits=kinds[i % 3], top_k=0 if i % 4 else 20)  # type: ignore[arg-type]
        reqs.append(Request(f"r{i}", prompt, sampling, arrival_step=rng.randint(0, 4)))
    return reqs


def _same(a: list[Any], b: list[Any]) -> None:
    assert_same_bits(a, b)
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids and x.evidence == y.evidence and x.top2 == y.top2


@pytest.mark.parametrize("mode", ["invariant", "production"])
@pytest.mark.parametrize(("budget", "caching", "seed"), [(None, False, 1), (24, False, 2), (16, True, 3), (64, True, 4)])
def test_overlapping_steps_give_what_one_step_at_a_time_gives(
    tiny_qwen3: Path, mode: Mode, budget: int | None, caching: bool, seed: int,
) -> None:
    """Chunked prefill (a token budget below the prompts), arrivals while others decode, prefix cache hits."""
    serial = _engine(tiny_qwen3, mode, False, enable_prefix_caching=caching)
    overlapped = _engine(serial.decoder, mode, True, enable_prefix_caching=caching)
    reqs = _requests(seed)
    if caching:  # a warm cache: the second call's prompts hit the first call's blocks
        assert_same_bits(serial.generate(reqs[:3], budget), overlapped.generate(reqs[:3], budget))
    _same(serial.generate(reqs, budget), overlapped.generate(reqs, budget))


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Record launches and landings in order, and how many tokens each pass took from the step in flight."""
    events: list[tuple[str, int]] = []
    launch, land, fill = (native_engine.NativeEngine._launch, native_engine.NativeEngine._land,
                          native_engine._Landing.fill)

    def spy_launch(self: Any, step: int, *args: Any) -> Any:
        events.append(("launch", step))
        return launch(self, step, *args)

    def spy_land(self: Any, landing: Any, outs: Any) -> Any:
        events.append(("land", len(landing.done)))
        return land(self, landing, outs)

    def spy_fill(self: Any, ids: Any, dst: list[int], rows: list[int]) -> None:
        if dst:
            events.append(("fill", len(dst)))
        fill(self, ids, dst, rows)

    monkeypatch.setattr(native_engine.NativeEngine, "_launch", spy_launch)
    monkeypatch.setattr(native_engine.NativeEngine, "_land", spy_land)
    monkeypatch.setattr(native_engine._Landing, "fill", spy_fill)
    return events


def test_a_step_is_launched_before_the_step_before_lands(tiny_qwen3: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = _spy(monkeypatch)
    engine = _engine(tiny_qwen3, "invariant", True)
    out = engine.generate([Request(f"r{i}", (1 + i, 2, 3), SamplingParams(max_tokens=4)) for i in range(3)])
    # Four passes; each of passes 2-4 takes its three tokens from the pass before, on the device.
    assert [e for e in events if e[0] != "fill"] == [
        ("launch", 0), ("launch", 1), ("land", 3), ("launch", 2), ("land", 3), ("launch", 3), ("land", 3), ("land", 3)]
    assert [e for e in events if e[0] == "fill"] == [("fill", 3)] * 3
    assert all(len(c.token_ids) == 4 and native_engine.PENDING_TOKEN not in c.token_ids for c in out)
    assert engine.describe()["overlap_steps"] is True


def test_one_step_at_a_time_where_asked_where_a_token_may_stop_and_under_capture(
    tiny_qwen3: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    reqs = [Request(f"r{i}", (5 + i, 6, 7), SamplingParams(max_tokens=3)) for i in range(2)]
    serial_order = [("launch", 0), ("land", 2), ("launch", 1), ("land", 2), ("launch", 2), ("land", 2)]
    for engine in (_engine(tiny_qwen3, "invariant", False), _engine(tiny_qwen3, "invariant", True, stop_at_eos=True)):
        events = _spy(monkeypatch)
        engine.generate(reqs)
        assert events == serial_order
        monkeypatch.undo()

    class Rows:
        module_path: Any = None

        def forward_pass(self, layout: Any, inputs: Any) -> Any:
            import contextlib

            return contextlib.nullcontext()

    engine = _engine(tiny_qwen3, "invariant", True)
    events = _spy(monkeypatch)
    engine.capture(RunSpec(tuple(reqs), 0), Rows())  # type: ignore[arg-type]
    assert events == serial_order


def test_no_stand_in_is_left_behind(tiny_qwen3: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every sequence's tokens are the real ones once generate returns (prefix-cache hashes read them)."""
    seen: list[list[int]] = []
    update = native_engine.Scheduler.update

    def spy(self: Any, batch: Any, sampled: Any) -> None:
        update(self, batch, sampled)
        for item in batch:  # what a later pass's hash of full blocks covers is never a stand-in
            seen.append(item.seq.tokens[: item.seq.num_computed_tokens])

    monkeypatch.setattr(native_engine.Scheduler, "update", spy)
    engine = _engine(tiny_qwen3, "invariant", True, enable_prefix_caching=True, block_size=4)
    engine.generate(_requests(5))
    assert seen and all(native_engine.PENDING_TOKEN not in tokens for tokens in seen)


def test_describe_says_where_steps_overlap(tiny_qwen3: Path) -> None:
    on = _engine(tiny_qwen3, "invariant", True)
    assert on.describe()["overlap_steps"] is True
    assert _engine(on.decoder, "invariant", False).describe()["overlap_steps"] is False
    stops = _engine(on.decoder, "invariant", True, stop_at_eos=True)
    assert stops.eos_token_ids and stops.describe()["overlap_steps"] is False  # every step lands where EOS may stop


@pytest.mark.parametrize(("max_num_seqs", "chunked", "block_size"), [(2, True, 1), (3, False, 16), (1, True, 4)])
def test_fewer_slots_than_requests_whole_prompts_and_one_token_blocks(
    tiny_qwen3: Path, max_num_seqs: int, chunked: bool, block_size: int,
) -> None:
    fields = {"max_num_seqs": max_num_seqs, "enable_chunked_prefill": chunked, "block_size": block_size,
              "enable_prefix_caching": True}
    serial = _engine(tiny_qwen3, "invariant", False, **fields)
    overlapped = _engine(serial.decoder, "invariant", True, **fields)
    reqs = _requests(11, count=6)
    _same(serial.generate(reqs, 64), overlapped.generate(reqs, 64))


def test_full_rows_are_read_when_queued(tiny_qwen3: Path) -> None:
    """A CUDA graph's logits are overwritten by the next step before the step before lands: `logits: full`
    rows are the ones the step sampled from, whatever happens to the logits after."""
    import torch

    from oracle.engines.native.sampler import queue_rows

    logits = torch.randn(3, 50)
    before = logits.clone()
    pending = queue_rows(logits, [SamplingParams(logits="full"), SamplingParams(logits="none"),
                                  SamplingParams(logits="full")], [None, None, None])
    logits.fill_(0.0)  # the next step's replay
    rows = pending.result()
    assert sorted(rows.full) == [0, 2]
    assert all((torch.from_numpy(rows.full[r]) == before[r]).all() for r in (0, 2))
