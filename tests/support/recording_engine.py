"""A native engine that records every request it is given (id and max_tokens), in this process: for tests of
which runs a check makes. Usable from a config as `engine.kind: recording_engine:RecordingEngine` (tests/support
is on sys.path); its options are the native engine's (`EngineConfig.of`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from oracle.config import EngineConfig
from oracle.engines.contract import Completion, Mode
from oracle.engines.native import NativeEngine


class RecordingEngine(NativeEngine):
    requests: ClassVar[list[tuple[str, str, int]]] = []  # (mode, request id, max_tokens), every call's, in order

    def __init__(self, model: Path, mode: Mode, **kwargs: Any) -> None:
        super().__init__(model, mode, EngineConfig.of("native", **kwargs))

    def generate(self, requests: Any, max_num_batched_tokens: int | None = None) -> list[Completion]:
        RecordingEngine.requests.extend((self.mode, r.request_id, r.sampling.max_tokens) for r in requests)
        return super().generate(requests, max_num_batched_tokens)
