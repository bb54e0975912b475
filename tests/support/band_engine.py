"""A fake engine with a planted threshold fault: invariant mode diverges only in a narrow band of pass sizes.

Like a kernel that picks another configuration for packed query lengths in [band_lo, band_hi]
(neither a batch-size boundary nor a power of two), the target's outputs move by a few ULP when
the first pass it shares, the prefill of every prompt packed together, holds that many tokens.
Outputs are otherwise a pure function of the prompt. Evidence is per pass: a prefill pass with every
prompt packed, then one decode pass per step with every sequence still running.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from oracle.engines.contract import Completion, Mode, Request, StepEvidence


def _value(prompt: tuple[int, ...], step: int) -> tuple[int, float]:
    h = hashlib.sha256(repr((prompt, step)).encode()).digest()
    return h[0] % 97, -float(h[1] + 1) / 64.0


class BandEngine:
    def __init__(self, model: Path, mode: Mode, *, band_lo: int = 0, band_hi: int = -1, ulps: int = 3,
                 log: str = "") -> None:
        self.mode = mode
        self.log = Path(log) if log else None  # each call's first request id is appended here
        self.band = (band_lo, band_hi)
        self.ulps = ulps
        self.calls = 0
        self.hits = 0

    def describe(self) -> dict[str, Any]:
        return {"engine": "band-fake", "invariance_mechanism": "none (fake)", "band": list(self.band),
                "hits": self.hits}

    def close(self) -> None:
        pass

    def generate(self, requests: Sequence[Request], max_num_batched_tokens: int | None = None) -> list[Completion]:
        self.calls += 1
        if self.log is not None and requests:
            with self.log.open("a") as f:
                f.write(f"{self.mode} {requests[0].request_id}\n")
        n = len(requests)
        packed = sum(len(r.prompt_token_ids) for r in requests)
        planted = self.mode == "invariant" and n >= 2 and self.band[0] <= packed <= self.band[1]
        self.hits += planted
        out = []
        for pos, r in enumerate(requests):
            c = Completion(r.request_id, [], [], top2=[])
            prompt_len = len(r.prompt_token_ids)
            for step in range(r.sampling.max_tokens):
                token, lp = _value(r.prompt_token_ids, step)
                if planted:
                    lp += self.ulps * 2.0**-20  # a few ULPs at these magnitudes
                c.token_ids.append(token)
                c.logprobs.append(lp)
                c.top2.append((1.0, 0.5))  # type: ignore[union-attr]
                live = sum(1 for q in requests if q.sampling.max_tokens > step) if step else n
                c.evidence.append(StepEvidence(
                    step, live, packed if step == 0 else live, step == 0, token_index=step, seq_position=pos,
                    num_prefill_tokens=packed if step == 0 else 0, num_decode_tokens=0 if step == 0 else live,
                    kv_len=prompt_len + step + 1))
            out.append(c)
        return out
