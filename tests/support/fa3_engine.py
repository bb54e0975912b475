"""A fake engine with FA3's planted break: invariant mode diverges only when a decode of the target
shares a pass with more than 64 query tokens of others (x the model's GQA ratio, read from
config.json) while the target's KV length is over 128 (vLLM #51902).

It steps like a continuous-batching engine: a request joins at its arrival step, its whole prompt is
prefilled in one pass (no chunking), then it decodes one token a pass. Outputs are otherwise a pure
function of the prompt; evidence is per pass.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from oracle.engines.contract import Completion, Mode, Request, StepEvidence


def _value(prompt: tuple[int, ...], step: int) -> tuple[int, float]:
    h = hashlib.sha256(repr((prompt, step)).encode()).digest()
    return h[0] % 97, -float(h[1] + 1) / 64.0


class Fa3Engine:
    def __init__(self, model: Path, mode: Mode, *, query_limit: int = 64, kv_limit: int = 128,
                 **settings: Any) -> None:  # budget, block size, caching: the probes read them; the fake ignores them
        self.mode = mode
        raw = json.loads((Path(model) / "config.json").read_text())
        heads = raw.get("num_attention_heads", 1)
        self.gqa = heads // raw.get("num_key_value_heads", heads)  # 1 where the config names no heads
        self.query_limit = query_limit
        self.kv_limit = kv_limit
        self.hits = 0

    def describe(self) -> dict[str, Any]:
        return {"engine": "fa3-fake", "invariance_mechanism": "none (fake)", "hits": self.hits}

    def close(self) -> None:
        pass

    def generate(self, requests: Sequence[Request], max_num_batched_tokens: int | None = None) -> list[Completion]:
        out = {r.request_id: Completion(r.request_id, [], [], top2=[]) for r in requests}
        done = {r.request_id: 0 for r in requests}  # tokens generated so far
        step = 0
        while any(done[r.request_id] < r.sampling.max_tokens for r in requests):
            live = [r for r in requests if r.arrival_step <= step and done[r.request_id] < r.sampling.max_tokens]
            query = {r.request_id: len(r.prompt_token_ids) if done[r.request_id] == 0 else 1 for r in live}
            total = sum(query.values())
            prefill = sum(q for rid, q in query.items() if done[rid] == 0)
            for pos, r in enumerate(live):
                k = done[r.request_id]
                kv = len(r.prompt_token_ids) + k  # after the pass: the prompt and the tokens fed so far
                others = total - query[r.request_id]
                planted = (self.mode == "invariant" and k > 0 and others * self.gqa > self.query_limit
                           and kv > self.kv_limit)
                self.hits += planted
                token, lp = _value(r.prompt_token_ids, k)
                if planted:
                    lp += 3 * 2.0**-20
                c = out[r.request_id]
                c.token_ids.append(token)
                c.logprobs.append(lp)
                c.top2.append((1.0, 0.5))  # type: ignore[union-attr]
                c.evidence.append(StepEvidence(
                    step, len(live), total, k == 0, token_index=k, seq_position=pos, num_prefill_tokens=prefill,
                    num_decode_tokens=total - prefill, max_query_len=max(query.values()), kv_len=kv))
                done[r.request_id] = k + 1
            step += 1
        return [out[r.request_id] for r in requests]
