"""Hugging Face transformers as an engine: `generate` over left-padded batches.

Every request of a call runs in one padded batch (transformers has no continuous batching, so
arrival steps and token budgets do not apply); the logits of each step are captured and
compared like any engine's. Invariant mode runs `generate` inside
`oracle_kernels.batch_invariant()` with eager attention (matmul + softmax, ops the kernels
cover); whether left padding keeps a prompt's bits is exactly what the oracle then measures.
Greedy decoding only: transformers samples from one global generator, so a seeded sample
would depend on the batch by construction.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import oracle_kernels
import torch

from oracle.engines.base import Completion, Mode, Request, StepEvidence
from oracle.engines.native.loader import DTYPES
from oracle.errors import ConfigError, EngineError


class TransformersEngine:
    def __init__(self, model: Path, mode: Mode, *, device: str = "cpu", dtype: str = "float32",
                 attn_implementation: str = "eager", num_threads: int | None = None) -> None:
        try:
            import transformers
        except ImportError as e:
            raise ConfigError("engine.kind: transformers needs the extra: pip install 'oracle-determinism[transformers]'") from e
        if dtype not in DTYPES:
            raise ConfigError(f"engine.dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
        self.mode = mode
        self.device = torch.device(device)
        self.num_threads = num_threads
        self.version = transformers.__version__
        try:
            loaded = transformers.AutoModelForCausalLM.from_pretrained(
                str(model), dtype=DTYPES[dtype], attn_implementation=attn_implementation)
            self.model = loaded.to(self.device)  # type: ignore[arg-type]
        except (OSError, ValueError) as e:
            raise EngineError(f"transformers could not load {model}: {e}") from e
        self.model.eval()
        self.attn_implementation = attn_implementation
        self.pad_id = 0

    def describe(self) -> dict[str, Any]:
        return {
            "engine": "transformers", "engine_version": self.version, "device": str(self.device),
            "dtype": str(self.model.dtype).removeprefix("torch."), "attn_implementation": self.attn_implementation,
            "invariance_mechanism": "oracle_kernels around generate (eager attention)"
            if self.mode == "invariant" else "none (transformers defaults)",
        }

    def close(self) -> None:
        del self.model

    @contextlib.contextmanager
    def _context(self) -> Any:
        before = torch.get_num_threads()
        if self.num_threads:
            torch.set_num_threads(self.num_threads)
        kernels = oracle_kernels.batch_invariant() if self.mode == "invariant" else contextlib.nullcontext()
        try:
            with torch.no_grad(), kernels:
                yield
        finally:
            torch.set_num_threads(before)

    def generate(self, requests: Sequence[Request], max_num_batched_tokens: int | None = None) -> list[Completion]:
        if any(r.sampling.temperature > 0 for r in requests):
            raise ConfigError("sampling.temperature: the transformers engine is greedy only (temperature 0)")
        width = max(len(r.prompt_token_ids) for r in requests)
        # [B, width] left-padded prompts and their mask.
        ids = torch.full((len(requests), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(requests), width), dtype=torch.long)
        for i, r in enumerate(requests):
            n = len(r.prompt_token_ids)
            ids[i, width - n:] = torch.tensor(r.prompt_token_ids)
            mask[i, width - n:] = 1
        steps = max(r.sampling.max_tokens for r in requests)
        with self._context():
            out = self.model.generate(
                input_ids=ids.to(self.device), attention_mask=mask.to(self.device), max_new_tokens=steps,
                min_new_tokens=steps, do_sample=False, output_logits=True, return_dict_in_generate=True,
                eos_token_id=None, pad_token_id=self.pad_id,
            )
            logits = torch.stack(out.logits, 1).to(torch.float32)  # [B, steps, vocab]
            logprobs = torch.log_softmax(logits, dim=-1)
        num_tokens = int(mask.sum())
        completions = []
        for i, r in enumerate(requests):
            n = r.sampling.max_tokens
            tokens = out.sequences[i, width:width + n].tolist()
            c = Completion(r.request_id, tokens, [float(logprobs[i, s, t]) for s, t in enumerate(tokens)], top2=[])
            rows = logits[i, :n].cpu().numpy()
            if r.sampling.logits == "full":
                c.logits = list(rows)
            elif r.sampling.logits == "digest":
                c.logits_digests = [hashlib.sha256(row.tobytes()).hexdigest() for row in rows]
            top = torch.topk(logits[i, :n], 2, dim=-1).values.tolist()
            c.top2 = [(float(a), float(b)) for a, b in top]
            c.evidence = [StepEvidence(s, len(requests), num_tokens if s == 0 else len(requests), s == 0,
                                       token_index=s) for s in range(n)]
            completions.append(c)
        return completions
