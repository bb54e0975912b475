"""The CUDA-graph capture bookkeeping of the native engine (oracle/engines/native/graphs.py), on the CPU.

A fake graph stands in for torch.cuda.CUDAGraph: it records the calls and fails where told, as a real
capture does when it is invalidated (capture_end raises) or when its stream cannot start capturing
(capture_begin raises after registering the pool). Whatever fails, the allocator is told the capture
ended, the stream context is left, the error propagates and the garbage collector is back on.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

import pytest

from oracle.engines.native.graphs import capturing, decode_buckets, width_bucket


class FakeGraph:
    def __init__(self, fail_begin: bool = False, fail_end: bool = False) -> None:
        self.calls: list[str] = []
        self.fail_begin, self.fail_end = fail_begin, fail_end

    def capture_begin(self, pool: object = None) -> None:
        self.calls.append(f"begin {pool}")
        if self.fail_begin:
            raise RuntimeError("cudaStreamBeginCapture failed")

    def capture_end(self) -> None:
        self.calls.append("end")
        if self.fail_end:
            raise RuntimeError("operation failed due to a previous error during capture")


class Harness:
    """The stream context and the allocator hook, recording what happened."""

    def __init__(self) -> None:
        self.events: list[str] = []

    @contextlib.contextmanager
    def stream(self) -> Iterator[None]:
        self.events.append("stream in")
        try:
            yield
        finally:
            self.events.append("stream out")

    def end_allocate(self) -> None:
        self.events.append("end_allocate")


def _capture(graph: FakeGraph, h: Harness, body_error: BaseException | None = None) -> list[bool]:
    gc_during: list[bool] = []
    with capturing(graph, "pool-1", h.stream(), h.end_allocate):
        gc_during.append(gc.isenabled())
        if body_error is not None:
            raise body_error
    return gc_during


def test_a_clean_capture_ends_once_and_leaves_the_allocator_alone() -> None:
    graph, h = FakeGraph(), Harness()
    assert gc.isenabled()
    assert _capture(graph, h) == [False]  # no cyclic collection inside the capture
    assert graph.calls == ["begin pool-1", "end"]
    assert h.events == ["stream in", "stream out"]
    assert gc.isenabled()


@pytest.mark.parametrize(("fail_begin", "fail_end", "body_error", "calls"), [
    (True, False, None, ["begin pool-1"]),  # begin registered the pool, then failed
    (False, True, None, ["begin pool-1", "end"]),  # an invalidated capture: end raises
    (False, True, RuntimeError("operation not permitted when stream is capturing"), ["begin pool-1", "end"]),
    (False, False, ValueError("a Python error in the body"), ["begin pool-1", "end"]),
])
def test_a_failed_capture_is_closed_in_the_allocator_and_propagates(
    fail_begin: bool, fail_end: bool, body_error: BaseException | None, calls: list[str],
) -> None:
    graph, h = FakeGraph(fail_begin, fail_end), Harness()
    with pytest.raises((RuntimeError, ValueError)):
        _capture(graph, h, body_error)
    assert graph.calls == calls
    assert h.events == ["stream in", "end_allocate", "stream out"]
    assert gc.isenabled()


def test_the_collector_stays_off_if_it_was_off() -> None:
    gc.disable()
    try:
        _capture(FakeGraph(), Harness())
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_buckets_cover_every_batch_size_up_to_max_num_seqs() -> None:
    for max_num_seqs in (1, 3, 8, 9, 100, 1024):
        buckets = decode_buckets(max_num_seqs)
        assert list(buckets) == sorted(set(buckets))
        assert all(any(b >= n for b in buckets) for n in range(1, max_num_seqs + 1))
    assert width_bucket(1) == 1 and width_bucket(5) == 8 and width_bucket(8) == 8
