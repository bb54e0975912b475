"""An engine that blocks forever at one chosen point, for tests of the watchdog's deadlines.

`hang_on` names the point: `init` (the constructor), `describe`, `close`, `capture` (per-op
capture, i.e. localize), or a request id prefix (`solo-`, `trial`, `shrink`, `prefill-`) for the
generate call whose first request starts with it. Blocking waits on `RELEASE`, which a test sets
when it is done, so abandoned threads end with the test instead of lingering in the process.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fake_engine import FakeEngine

from oracle.engines.contract import Completion, Mode, Request

RELEASE = threading.Event()
CLOSED_AFTER_RELEASE: list[str] = []  # modes of engines closed once a hang was released


def block() -> None:
    RELEASE.wait()


class HangEngine(FakeEngine):
    def __init__(self, model: Path, mode: Mode, *, hang_on: str = "", hang_mode: str = "", **options: Any) -> None:
        self.hang_on = hang_on
        self.hang_mode = hang_mode or mode  # hang in this mode only (default: both)
        self.released = False
        if hang_on == "init" and self.hang_mode == mode:
            block()
            self.released = True
        super().__init__(model, mode, **options)

    def _hangs(self, point: str) -> bool:
        return self.hang_mode == self.mode and self.hang_on == point

    def describe(self) -> dict[str, Any]:
        if self._hangs("describe"):
            block()
        return super().describe()

    def close(self) -> None:
        if self.released:
            CLOSED_AFTER_RELEASE.append(self.mode)
        if self._hangs("close"):
            block()
        super().close()

    def generate(self, requests: Sequence[Request], max_num_batched_tokens: int | None = None) -> list[Completion]:
        if self.hang_mode == self.mode and self.hang_on and requests[0].request_id.startswith(self.hang_on):
            block()
        return super().generate(requests, max_num_batched_tokens)

    def capture(self, run: Any, rows: Any) -> Completion:
        """Per-op capture (oracle.capture): here it only hangs, or refuses."""
        if self._hangs("capture"):
            block()
        raise RuntimeError("the hang engine captures nothing")
