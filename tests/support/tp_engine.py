"""A fake engine with a tensor-parallel size: at more than one rank its logprobs move a few ULP from
step `tp_from_step` on (as a row-parallel reduction split across ranks would), and `tp_flip` flips the
token there; `tp_exact` keeps every size bitwise the same."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from fake_engine import FakeEngine

from oracle.engines.contract import Completion, Mode, Request


class TpEngine(FakeEngine):
    # Engines of this class open at once in this process, and the most there ever were (tests reset both).
    live = 0
    most_live = 0

    def __init__(self, model: Path, mode: Mode, *, tensor_parallel_size: int = 1, tp_exact: bool = False,
                 tp_from_step: int = 1, tp_flip: bool = False, **kwargs: Any) -> None:
        super().__init__(model, mode, **kwargs)
        TpEngine.live += 1
        TpEngine.most_live = max(TpEngine.most_live, TpEngine.live)
        self.tensor_parallel_size = tensor_parallel_size
        self.tp_moves = tensor_parallel_size > 1 and not tp_exact
        self.tp_from_step = tp_from_step
        self.tp_flip = tp_flip

    def close(self) -> None:
        TpEngine.live -= 1
        super().close()

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "tensor_parallel_size": self.tensor_parallel_size}

    def generate(self, requests: Sequence[Request], max_num_batched_tokens: int | None = None) -> list[Completion]:
        out = super().generate(requests, max_num_batched_tokens)
        return [self._ranked(c) for c in out] if self.tp_moves else out

    def _ranked(self, c: Completion) -> Completion:
        logprobs, tokens = list(c.logprobs), list(c.token_ids)
        for i in range(self.tp_from_step, len(logprobs)):
            value = np.float32(logprobs[i])
            for _ in range(3 * self.tensor_parallel_size):
                value = np.nextafter(value, np.float32(0), dtype=np.float32)
            logprobs[i] = float(value)
        if self.tp_flip and self.tp_from_step < len(tokens):
            tokens[self.tp_from_step] = (tokens[self.tp_from_step] + 1) % 97
        return replace(c, token_ids=tokens, logprobs=logprobs)
