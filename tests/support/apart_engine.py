"""A fake engine that declares `starts_apart` (as vLLM's worker does): the runner starts production's engine
while invariant mode runs (oracle.overlap). Its start can sleep, fail or hang in one mode, and it records
when each mode's start and close happened, so a test can tell the starts overlapped."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from fake_engine import FakeEngine
from hang_engine import block

from oracle.engines.contract import Mode

EVENTS: list[tuple[str, str, float]] = []  # (mode, what, time.perf_counter())
_lock = threading.Lock()


def _event(mode: str, what: str) -> None:
    with _lock:
        EVENTS.append((mode, what, time.perf_counter()))


class ApartEngine(FakeEngine):
    starts_apart = True

    def __init__(self, model: Path, mode: Mode, *, start_s: float = 0.0, fail_start: str = "",
                 hang_start: str = "", **options: Any) -> None:
        _event(mode, "start")
        if start_s:
            time.sleep(start_s)
        if fail_start == mode:
            raise RuntimeError(f"planted {mode} start failure")
        if hang_start == mode:
            block()
        super().__init__(model, mode, **options)
        _event(mode, "started")

    def close(self) -> None:
        _event(self.mode, "close")
        super().close()


class TogetherEngine(ApartEngine):
    """Both modes' starts at once (as vLLM's on a CPU)."""

    starts_together = True
