"""The native reference engine: our decoder, a paged KV cache and the continuous-batching scheduler.

`production` mode runs torch's default ops and picks the decode attention's KV split count
from the batch size, as split-KV kernels do to fill a device; `invariant` mode runs the whole
step inside `oracle_kernels.batch_invariant()`, so every reduction has a fixed order.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import oracle_kernels
import torch

from oracle.engines.base import Completion, Mode, Request, StepEvidence
from oracle.engines.native.loader import DTYPES, load_decoder
from oracle.engines.native.model import Decoder, StepInputs
from oracle.engines.native.scheduler import BlockAllocator, ScheduledSeq, Scheduler
from oracle.engines.native.scheduler import Sequence as Seq
from oracle.errors import ConfigError


def num_kv_splits_for(num_seqs: int, max_splits: int = 8, target_parallelism: int = 16) -> int:
    """Split-KV heuristic of the production path: fewer sequences -> more KV chunks per sequence."""
    return max(1, min(max_splits, target_parallelism // max(1, num_seqs)))


class NativeEngine:
    """Implements `oracle.engines.base.Engine` in this process."""

    def __init__(
        self,
        model: Path | Decoder,
        mode: Mode,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 2048,
        enable_chunked_prefill: bool = True,
        block_size: int = 16,
        enable_prefix_caching: bool = False,
        num_threads: int | None = None,
        stop_at_eos: bool = False,
    ) -> None:
        if dtype not in DTYPES:
            raise ConfigError(f"engine.dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
        self.mode = mode
        self.device = torch.device(device)
        self.decoder = model if isinstance(model, Decoder) else load_decoder(model, DTYPES[dtype], self.device)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.block_size = block_size
        self.stop_at_eos = stop_at_eos
        self.enable_prefix_caching = enable_prefix_caching
        self.num_threads = num_threads
        self._kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._num_blocks = 0
        self._allocator = BlockAllocator(0, block_size)
        # Per-op capture (oracle.localize): called with each pass's step, batch and inputs; wraps its forward.
        self.capture: Callable[[int, list[ScheduledSeq], StepInputs], contextlib.AbstractContextManager[None]] | None = None

    def describe(self) -> dict[str, Any]:
        c = self.decoder.config
        return {
            "engine": "native",
            "engine_version": "oracle",
            "device": str(self.device),
            "dtype": str(self.decoder.dtype).removeprefix("torch."),
            "architecture": c.architecture,
            "invariance_mechanism": "oracle_kernels (torch.library overrides + fixed-split attention)"
            if self.mode == "invariant" else "none (torch default kernels, batch-sized split-KV decode)",
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "enable_chunked_prefill": self.enable_chunked_prefill,
            "enable_prefix_caching": self.enable_prefix_caching,
            "num_threads": self.num_threads or torch.get_num_threads(),
            # On CUDA: which bf16/fp16 products cuBLASLt without split-K took (bitwise the Triton kernel's).
            **({"matmul_paths": oracle_kernels.matmul_paths()}
               if self.mode == "invariant" and self.device.type == "cuda" else {}),
        }

    def close(self) -> None:
        self._kv = []

    def _kernels(self) -> contextlib.AbstractContextManager[None]:
        return oracle_kernels.batch_invariant() if self.mode == "invariant" else contextlib.nullcontext()

    @contextlib.contextmanager
    def _threads(self) -> Iterator[None]:
        """torch's intra-op thread count for the call, restored after. One thread is fastest for tiny models."""
        before = torch.get_num_threads()
        if self.num_threads:
            torch.set_num_threads(self.num_threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    def reset_prefix_cache(self) -> None:
        """Forget every cached block (the next requests run cold)."""
        self._allocator = BlockAllocator(self._num_blocks, self.block_size, self.enable_prefix_caching)

    def _ensure_kv(self, num_blocks: int) -> None:
        if num_blocks <= self._num_blocks:
            return
        # A bigger pool starts empty; with prefix caching keep twice what is asked so cached blocks survive.
        num_blocks *= 2 if self.enable_prefix_caching else 1
        c = self.decoder.config
        shape = (num_blocks, self.block_size, c.num_kv_heads, c.head_dim)
        self._kv = [
            (torch.zeros(shape, dtype=self.decoder.dtype, device=self.device),
             torch.zeros(shape, dtype=self.decoder.dtype, device=self.device))
            for _ in range(c.num_layers)
        ]
        self._num_blocks = num_blocks
        self.reset_prefix_cache()

    def generate(self, requests: Sequence[Request], max_num_batched_tokens: int | None = None) -> list[Completion]:
        eos = self.decoder.config.eos_token_id if self.stop_at_eos else None
        seqs = [
            Seq(index=i, prompt_len=len(r.prompt_token_ids), tokens=list(r.prompt_token_ids),
                max_tokens=r.sampling.max_tokens, arrival_step=r.arrival_step, stop_token_id=eos)
            for i, r in enumerate(requests)
        ]
        for r in requests:
            if not r.prompt_token_ids:
                raise ConfigError(f"request {r.request_id}: empty prompt")
        per_seq = [-(-(s.prompt_len + s.max_tokens) // self.block_size) for s in seqs]
        self._ensure_kv(sum(per_seq))
        if not self.enable_prefix_caching:
            self.reset_prefix_cache()
        scheduler = Scheduler(seqs, self._allocator, self.max_num_seqs,
                              max_num_batched_tokens or self.max_num_batched_tokens, self.enable_chunked_prefill)
        outs = [Completion(r.request_id, [], [], logits=[] if r.sampling.logits == "full" else None,
                           logits_digests=[] if r.sampling.logits == "digest" else None, top2=[])
                for r in requests]
        generators = [self._generator(r) for r in requests]
        with torch.no_grad(), self._threads(), self._kernels():
            step = 0
            while not scheduler.is_done():
                batch = scheduler.schedule(step)
                if batch:
                    sampled = self._run_step(step, batch, requests, outs, generators)
                    scheduler.update(batch, sampled)
                step += 1
        return outs

    def _generator(self, r: Request) -> torch.Generator | None:
        if r.sampling.temperature <= 0:
            return None
        g = torch.Generator(device="cpu")
        g.manual_seed(r.sampling.seed)
        return g

    def _run_step(
        self, step: int, batch: list[ScheduledSeq], requests: Sequence[Request], outs: list[Completion],
        generators: list[torch.Generator | None],
    ) -> dict[int, int]:
        inputs = self._prepare(batch)
        with self.capture(step, batch, inputs) if self.capture else contextlib.nullcontext():
            logits = self.decoder.forward(inputs, self._kv)  # [R, vocab] float32
        logprobs = torch.log_softmax(logits, dim=-1)  # [R, vocab]
        num_tokens = int(inputs.input_ids.shape[0])
        sampled: dict[int, int] = {}
        row = 0
        for item, ev in zip(batch, self._evidence(step, batch, num_tokens), strict=True):
            seq = item.seq
            outs[seq.index].evidence.append(ev)
            if not item.completes:
                continue
            token = self._sample(logits[row], requests[seq.index], generators[seq.index])
            self._record(outs[seq.index], requests[seq.index], logits[row], logprobs[row], token)
            sampled[seq.index] = token
            row += 1
        return sampled

    @staticmethod
    def _evidence(step: int, batch: list[ScheduledSeq], num_tokens: int) -> list[StepEvidence]:
        """What each sequence of the pass saw of it: its own place and the pass's shape."""
        chunked = [item.is_prefill and (item.seq.num_prefill_passes > 0 or not item.completes) for item in batch]
        kv_lens = [item.seq.num_computed_tokens + item.num_new_tokens for item in batch]
        prefill_tokens = sum(item.num_new_tokens for item in batch if item.is_prefill)
        shape: dict[str, Any] = {
            "num_prefill_tokens": prefill_tokens, "num_decode_tokens": num_tokens - prefill_tokens,
            "max_query_len": max(item.num_new_tokens for item in batch), "max_kv_len": max(kv_lens),
            "has_chunked": any(chunked),
            "has_cache_hit": any(item.is_prefill and item.seq.num_cached_tokens > 0 for item in batch),
        }
        return [
            StepEvidence(
                engine_step=step, num_seqs=len(batch), num_tokens=num_tokens, is_prefill=item.is_prefill,
                chunked=chunked[i], num_cached_tokens=item.seq.num_cached_tokens,
                token_index=item.seq.num_generated if item.completes else None,
                seq_position=i, kv_len=kv_lens[i], **shape,
            )
            for i, item in enumerate(batch)
        ]

    def _prepare(self, batch: list[ScheduledSeq]) -> StepInputs:
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        qsl = [0]
        seq_lens: list[int] = []
        logits_idx: list[int] = []
        bs = self.block_size
        for item in batch:
            seq = item.seq
            start = seq.num_computed_tokens
            end = start + item.num_new_tokens
            ids += seq.tokens[start:end]
            positions += range(start, end)
            slots += [seq.block_table[p // bs] * bs + p % bs for p in range(start, end)]
            qsl.append(qsl[-1] + item.num_new_tokens)
            seq_lens.append(end)
            if item.completes:
                logits_idx.append(qsl[-1] - 1)
        width = max(len(item.seq.block_table) for item in batch)
        tables = [item.seq.block_table + [0] * (width - len(item.seq.block_table)) for item in batch]
        dev = self.device

        def t(x: list[int] | list[list[int]], dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.tensor(x, dtype=dtype, device=dev)

        return StepInputs(
            input_ids=t(ids), positions=t(positions), slot_mapping=t(slots),
            block_tables=t(tables, torch.int32), seq_lens=t(seq_lens, torch.int32),
            query_start_loc=t(qsl, torch.int32), logits_indices=t(logits_idx),
            num_kv_splits=num_kv_splits_for(len(batch)),
        )

    def _sample(self, logits: torch.Tensor, r: Request, g: torch.Generator | None) -> int:
        if g is None:
            return int(torch.argmax(logits).item())
        # Gumbel-max with the request's own generator: the draw does not depend on the batch.
        u = torch.rand(logits.shape[-1], generator=g, dtype=torch.float32).clamp_(1e-10, 1.0)
        gumbel = -torch.log(-torch.log(u)).to(logits.device)
        return int(torch.argmax(logits / r.sampling.temperature + gumbel).item())

    def _record(self, out: Completion, r: Request, logits: torch.Tensor, logprobs: torch.Tensor, token: int) -> None:
        out.token_ids.append(token)
        out.logprobs.append(float(logprobs[token].item()))
        top = torch.topk(logits, 2).values.tolist() if logits.shape[-1] > 1 else [logits[0].item()] * 2
        assert out.top2 is not None
        out.top2.append((float(top[0]), float(top[1])))
        row = logits.detach().cpu().numpy()
        if out.logits is not None:
            out.logits.append(row)
        elif out.logits_digests is not None:
            out.logits_digests.append(hashlib.sha256(row.tobytes()).hexdigest())


