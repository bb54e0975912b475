"""A complete custom engine: what a model-serving repo writes to put its own stack under the oracle.

Use it from a config with `engine.kind: custom_engine:BigramEngine` (see custom_engine.yaml beside
this file). oracle imports `custom_engine` with the working directory and the config file's folder
first on sys.path, so a module in the repository root (or beside the config) needs no PYTHONPATH.

The "model" here is a seeded bigram table over the checkpoint's vocabulary: step t of a sequence
computes `logits = embed[last_token] @ out` for every running sequence in ONE batched matmul, so
batch composition reaches the kernels exactly as it does in a real server. Replace `_forward` with
a call into your own stack; keep the rest of the protocol:

- `__init__(model, mode, **options)`: `model` is the checkpoint folder oracle resolved (config.json
  at least), `mode` is "invariant" or "production", `options` are `engine.options` from the config.
- `generate(requests, max_num_batched_tokens=None) -> list[Completion]`: run every request, each
  joining at its `arrival_step`, and return one Completion per request in order, with the evidence
  of what shared each forward pass (without it a pass is vacuous).
- `describe() -> dict`: name, version, how invariant mode is made invariant (into the report).
- `close()`: release everything (called also when a run fails).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from oracle.engines.contract import Completion, Mode, Request, StepEvidence


@dataclass
class _Seq:
    index: int
    request: Request
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    rows: list[torch.Tensor] = field(default_factory=list)
    evidence: list[StepEvidence] = field(default_factory=list)


class BigramEngine:
    """Continuous batching over a seeded bigram model; invariant mode runs under oracle_kernels."""

    def __init__(self, model: Path, mode: Mode, *, hidden: int = 64, seed: int = 0) -> None:
        self.mode = mode
        vocab = int(json.loads((Path(model) / "config.json").read_text())["vocab_size"])
        gen = torch.Generator().manual_seed(seed)
        self.embed = torch.randn(vocab, hidden, generator=gen)  # [V, H]
        self.out = torch.randn(hidden, vocab, generator=gen) / hidden**0.5  # [H, V]

    def describe(self) -> dict[str, Any]:
        return {"engine": "bigram-example", "engine_version": "1",
                "invariance_mechanism": "oracle_kernels" if self.mode == "invariant" else "none (torch defaults)"}

    def close(self) -> None:
        pass

    @contextlib.contextmanager
    def _kernels(self) -> Iterator[None]:
        if self.mode == "invariant":
            import oracle_kernels

            with oracle_kernels.batch_invariant():
                yield
        else:
            yield

    def _forward(self, last_tokens: list[int]) -> torch.Tensor:
        """One forward pass over every running sequence: float32 logits [B, V]."""
        return self.embed[torch.tensor(last_tokens)] @ self.out

    def generate(self, requests: Sequence[Request], max_num_batched_tokens: int | None = None) -> list[Completion]:
        waiting = sorted(range(len(requests)), key=lambda i: (requests[i].arrival_step, i))
        running: list[_Seq] = []
        done: dict[int, _Seq] = {}
        step = 0
        with torch.no_grad(), self._kernels():
            while waiting or running:
                while waiting and requests[waiting[0]].arrival_step <= step:
                    i = waiting.pop(0)
                    running.append(_Seq(i, requests[i]))
                if running:
                    last = [(s.tokens or list(s.request.prompt_token_ids))[-1] for s in running]
                    logits = self._forward(last)  # [B, V]
                    logprobs = torch.log_softmax(logits, dim=-1)
                    for b, s in enumerate(running):
                        token = int(torch.argmax(logits[b]))  # greedy
                        s.evidence.append(StepEvidence(step, len(running), len(running), not s.tokens,
                                                       token_index=len(s.tokens)))
                        s.tokens.append(token)
                        s.logprobs.append(float(logprobs[b, token]))
                        s.rows.append(logits[b].clone())
                    for s in [s for s in running if len(s.tokens) >= s.request.sampling.max_tokens]:
                        running.remove(s)
                        done[s.index] = s
                step += 1
        return [self._completion(done[i]) for i in range(len(requests))]

    @staticmethod
    def _completion(s: _Seq) -> Completion:
        rows = [r.numpy() for r in s.rows]
        c = Completion(s.request.request_id, s.tokens, s.logprobs, evidence=s.evidence)
        if s.request.sampling.logits == "full":
            c.logits = rows
        elif s.request.sampling.logits == "digest":
            c.logits_digests = [hashlib.sha256(r.tobytes()).hexdigest() for r in rows]
        c.top2 = [tuple(float(x) for x in torch.topk(r, 2).values) for r in s.rows]  # type: ignore[misc]
        return c
