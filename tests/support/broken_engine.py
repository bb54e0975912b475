"""The fake engine with broken outputs planted: NaN or infinite values, short answers, logits rows.

`fault` (from call `fault_from_call` on, in `fault_mode`) makes every completion of a call: nan_logprob,
inf_logprob, short (one token fewer than asked), long, nan_logits, none (None instead of a
Completion), bool_token (True as a token id). `vocab` > 0 gives every step a float32 logits row (a
pure function of prompt and step); with `row_fault_from_batch` a batch that large moves one logit
of every row by one ULP from `row_fault_step` on: a divergence only the rows show. From call
`row_noise_from_call` on, step 1's row moves another logit by one ULP (run-to-run noise).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from fake_engine import FakeEngine

from oracle.engines.contract import Completion, Mode, Request


def _row(prompt: tuple[int, ...], step: int, vocab: int) -> Any:
    seed = int.from_bytes(hashlib.sha256(repr((prompt, step)).encode()).digest()[:4], "little")
    return np.random.default_rng(seed).standard_normal(vocab).astype(np.float32)  # [vocab]


class BrokenEngine(FakeEngine):
    def __init__(self, model: Path, mode: Mode, *, fault: str = "", fault_mode: str = "invariant",
                 fault_from_call: int = 1, vocab: int = 0, row_fault_from_batch: int | None = None,
                 row_fault_step: int = 0, row_noise_from_call: int | None = None, **kw: Any) -> None:
        super().__init__(model, mode, **kw)
        self.fault, self.fault_mode, self.fault_from_call = fault, fault_mode, fault_from_call
        self.vocab, self.row_fault_from_batch, self.row_fault_step = vocab, row_fault_from_batch, row_fault_step
        self.row_noise_from_call = row_noise_from_call

    def generate(self, requests: Sequence[Request], max_num_batched_tokens: int | None = None) -> list[Completion]:
        out: list[Any] = super().generate(requests, max_num_batched_tokens)
        if self.vocab:
            for r, c in zip(requests, out, strict=True):
                c.logits = [_row(r.prompt_token_ids, i, self.vocab) for i in range(len(c.token_ids))]
                if self.row_fault_from_batch is not None and len(requests) >= self.row_fault_from_batch:
                    for row in c.logits[self.row_fault_step:]:
                        row[3] = np.nextafter(row[3], np.float32(np.inf))
                if self.row_noise_from_call is not None and self.calls >= self.row_noise_from_call and len(c.logits) > 1:
                    c.logits[1][5] = np.nextafter(c.logits[1][5], np.float32(np.inf))
        if self.mode != self.fault_mode or self.calls < self.fault_from_call or not self.fault:
            return out
        for c in out:
            if self.fault == "nan_logprob":
                c.logprobs[-1] = float("nan")
            elif self.fault == "inf_logprob":
                c.logprobs[0] = float("-inf")
            elif self.fault == "short":
                for name in ("token_ids", "logprobs", "top2", "evidence"):
                    getattr(c, name).pop()
            elif self.fault == "long":
                c.token_ids.append(1)
                c.logprobs.append(-1.0)
                c.top2.append((1.0, 0.5))
            elif self.fault == "nan_logits":
                c.logits = [np.full(8, np.nan, dtype=np.float32) for _ in c.token_ids]
            elif self.fault == "bool_token":
                c.token_ids[0] = True
        if self.fault == "none":
            return [None for _ in out]
        return out
