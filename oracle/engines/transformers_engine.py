"""Hugging Face transformers as an engine: the model's own forward pass, in two batchings.

Production mode is what a transformers user runs: `generate` over one left-padded batch of every
request of the call (arrival steps and token budgets do not apply), with the configured attention
implementation. Invariant mode cannot pad: left padding stretches every attention row to the
longest prompt, which changes the softmax and the attention matmul of every shorter prompt. It
runs the same model over packed passes instead (`oracle.engines.transformers_packed`): each step
lays the new tokens of every running sequence end to end, attends per sequence over exactly that
sequence's keys, and runs under `oracle_kernels.batch_invariant()`, so a row's bits do not depend
on what shares the pass. Requests join at their arrival step, so a pass mixes prefills and
decodes, and the evidence records every pass's sequences and tokens.

Seeded sampling (temperature > 0, top-p / top-k) in invariant mode only: each request draws from its own
generator seeded with its seed (oracle/engines/native/sampler.py), so its noise does not depend on the
batch. Production mode is greedy only: transformers' generate() samples from one global generator, so
a seeded sample would depend on the batch by construction. `self.model` is the Hugging Face module itself.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import oracle_kernels
import torch

from oracle.config import EngineConfig
from oracle.engine_options import TransformersOptions
from oracle.engines.contract import Completion, Mode, Request, RunSpec, StepEvidence
from oracle.engines.native.loader import DTYPES
from oracle.engines.native.sampler import choose, request_generator
from oracle.engines.transformers_packed import Packing, SequenceCache, packed
from oracle.errors import ConfigError, EngineError, ModelError

if TYPE_CHECKING:
    from oracle.capture.rows import PassLayout, RowCapture


@dataclass
class _Running:
    """A request in the packed loop: its tokens so far and its own key/value cache."""

    index: int
    request: Request
    cache: SequenceCache = field(default_factory=SequenceCache)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    rows: list[torch.Tensor] = field(default_factory=list)  # float32 logits rows [vocab]
    evidence: list[StepEvidence] = field(default_factory=list)
    generator: torch.Generator | None = None  # the request's own, when it samples

    @property
    def length(self) -> int:
        return len(self.request.prompt_token_ids) + len(self.tokens)

    @property
    def is_finished(self) -> bool:
        return len(self.tokens) >= self.request.sampling.max_tokens


def _arrived(requests: Sequence[Request], waiting: list[int], step: int) -> list[_Running]:
    """The waiting requests (indices in arrival order) whose arrival step has come, taken off `waiting`."""
    arrived = []
    while waiting and requests[waiting[0]].arrival_step <= step:
        i = waiting.pop(0)
        arrived.append(_Running(i, requests[i], generator=request_generator(requests[i].sampling)))
    return arrived


def _new_tokens(running: list[_Running]) -> tuple[list[int], list[int], list[int]]:
    """A packed pass's token ids and positions ([T], sequence after sequence) and each sequence's count of new
    tokens ([B]): a sequence's whole prompt on its first pass, its last token after."""
    ids: list[int] = []
    positions: list[int] = []
    num_new: list[int] = []
    for r in running:
        new = list(r.request.prompt_token_ids) if not r.tokens else r.tokens[-1:]
        ids += new
        positions += range(r.length - len(new), r.length)
        num_new.append(len(new))
    return ids, positions, num_new


def _record_pass(running: list[_Running], step: int, num_new: list[int], logits: torch.Tensor) -> None:
    """Each sequence's next token chosen from its float32 logits row (`logits` [B, vocab]), kept with its
    logprob, its row and the pass's evidence."""
    logprobs = torch.log_softmax(logits, dim=-1)
    chosen = choose(logits, [r.request.sampling for r in running], [r.generator for r in running]).tolist()
    num_tokens = sum(num_new)
    prefill_tokens = sum(n for r, n in zip(running, num_new, strict=True) if not r.tokens)
    kv_lens = [r.length for r in running]
    for b, r in enumerate(running):
        r.evidence.append(StepEvidence(
            step, len(running), num_tokens, is_prefill=not r.tokens, token_index=len(r.tokens), seq_position=b,
            num_prefill_tokens=prefill_tokens, num_decode_tokens=num_tokens - prefill_tokens,
            max_query_len=max(num_new), kv_len=kv_lens[b], max_kv_len=max(kv_lens), has_chunked=False,
            has_cache_hit=False))
        r.tokens.append(int(chosen[b]))
        r.logprobs.append(float(logprobs[b, chosen[b]]))
        r.rows.append(logits[b].cpu())


def _packed_layout(forward_pass: int, seqs: tuple[tuple[int, int, int, int], ...],
                   target_index: int) -> PassLayout | None:
    """The target's rows in a packed pass of `seqs` (request index, first row, new tokens, first position)."""
    from oracle.capture.rows import Grid, PassLayout

    slot = next((b for b, row in enumerate(seqs) if row[0] == target_index), None)
    if slot is None:
        return None  # the target is not in this pass
    _, start, n, first = seqs[slot]
    total = sum(row[2] for row in seqs)
    positions = tuple(range(first, first + n))
    rows = tuple((start + k,) for k in range(n))
    grids = (
        Grid((1, total), tuple((0, *row) for row in rows), positions),  # [1, T, ...] activations
        Grid((total,), rows, positions),  # flattened around matmuls
        Grid((1, len(seqs)), ((0, slot),), positions[-1:]),  # [1, B, vocab]: each sequence's last row
    )
    prefill = sum(row[2] for row in seqs if row[2] > 1 or row[3] == 0)
    evidence = {"num_seqs": len(seqs), "num_tokens": total, "seq_position": slot,
                "num_prefill_tokens": prefill, "num_decode_tokens": total - prefill,
                "target_is_prefill": first == 0, "target_num_tokens": n}
    return PassLayout(forward_pass, forward_pass, grids, evidence)


class TransformersEngine:
    """Implements `oracle.engines.contract.Engine` over a transformers `AutoModelForCausalLM`, with the
    optional capabilities Capturable and LaysOutPasses.

    Configured by `config` (engine.device, dtype, num_threads and `TransformersOptions`; the config's
    defaults when None)."""

    def __init__(self, model: Path, mode: Mode, config: EngineConfig | None = None) -> None:
        try:
            import transformers
        except ImportError as e:
            from oracle.engines.kinds import BUILTIN

            raise ConfigError(f"engine.kind: transformers needs the extra: {BUILTIN['transformers'].install}") from e
        config = config or EngineConfig.of("transformers")
        self.mode = mode
        self.device = torch.device(config.device)
        self.num_threads = config.num_threads
        self.version = transformers.__version__
        self.attn_implementation = attn_implementation = config.options_as(TransformersOptions).attn_implementation
        if mode == "invariant":
            from oracle.engines.transformers_packed import register

            attn_implementation = register()
        try:
            loaded = transformers.AutoModelForCausalLM.from_pretrained(
                str(model), dtype=DTYPES[config.dtype], attn_implementation=attn_implementation)
            self.model = loaded.to(self.device)  # type: ignore[arg-type]
        except (OSError, ValueError, KeyError) as e:
            raise EngineError(f"transformers could not load {model}: {e}") from e
        from oracle.engines.native.loader import nonfinite_weights

        problem = nonfinite_weights(self.model.named_parameters())
        if problem is not None:
            raise ModelError(f"{model}: {problem}")
        self.model.eval()
        self.pad_id = 0
        # The packed pass in flight: (request index, first row, new tokens, first position) per sequence.
        self._pass_rows: tuple[tuple[int, int, int, int], ...] = ()

    def describe(self) -> dict[str, Any]:
        invariant = self.mode == "invariant"
        return {
            "engine": "transformers", "engine_version": self.version, "device": str(self.device),
            "dtype": str(self.model.dtype).removeprefix("torch."),
            "attn_implementation": "oracle_packed (per-sequence eager attention)" if invariant
            else self.attn_implementation,
            "batching": "packed: each pass lays the running sequences' new tokens end to end, no padding"
            if invariant else "generate over one left-padded batch per call",
            "invariance_mechanism": "oracle_kernels, packed passes with per-sequence attention"
            if invariant else "none (transformers defaults)",
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
        """Completions, one per request in order; `max_num_batched_tokens` is not used. Sampled requests
        (temperature > 0) in invariant mode only."""
        if self.mode == "production" and any(r.sampling.temperature > 0 for r in requests):
            raise ConfigError("sampling.temperature: the transformers engine is greedy only in production mode "
                              "(its generate() draws from one global generator); seeded sampling runs in invariant mode")
        if not requests:
            return []
        if self.mode == "invariant":
            return self._generate_packed(requests)
        return self._generate_padded(requests)

    def _generate_packed(self, requests: Sequence[Request]) -> list[Completion]:
        waiting = sorted(range(len(requests)), key=lambda i: (requests[i].arrival_step, i))
        running: list[_Running] = []
        done: dict[int, _Running] = {}
        step = 0
        with self._context():
            while waiting or running:
                if not running and requests[waiting[0]].arrival_step > step:
                    step = requests[waiting[0]].arrival_step  # nothing to run until the next arrival
                running += _arrived(requests, waiting, step)
                self._packed_step(running, step)
                for r in [r for r in running if r.is_finished]:
                    running.remove(r)
                    done[r.index] = r
                step += 1
        return [self._completion(done[i]) for i in range(len(requests))]

    def _packed_step(self, running: list[_Running], step: int) -> None:
        """One forward pass over every running sequence's new tokens: the whole prompt or the last token."""
        ids, positions, num_new = _new_tokens(running)
        last = torch.tensor(num_new).cumsum(0) - 1  # [B] row of each sequence's last new token
        starts = [int(x) - n + 1 for x, n in zip(last.tolist(), num_new, strict=True)]
        self._pass_rows = tuple((r.index, s, n, r.length - n) for r, s, n in zip(running, starts, num_new, strict=True))
        try:
            with packed(Packing(tuple(r.cache for r in running), tuple(num_new))):
                out = self.model(
                    input_ids=torch.tensor([ids], device=self.device),  # [1, T]
                    position_ids=torch.tensor([positions], device=self.device),  # [1, T]
                    use_cache=False, logits_to_keep=last.to(self.device),
                )
        finally:
            self._pass_rows = ()
        _record_pass(running, step, num_new, out.logits[0].to(torch.float32))  # [B, vocab]

    def capture(self, run: RunSpec, rows: RowCapture) -> Completion:
        """Run `run` with `rows` capturing each forward that holds the target (oracle.capture)."""
        from oracle.engines.hf_capture import capture_hf

        return capture_hf(self, run, rows)

    def localize_layout(self, forward_pass: int, kwargs: dict[str, Any], target_index: int) -> PassLayout | None:
        """Where the target's tokens sit in this forward (oracle.capture): packed rows, else padded ones."""
        from oracle.engines.hf_capture import hf_layout

        if not self._pass_rows:
            return hf_layout(forward_pass, kwargs, target_index)
        return _packed_layout(forward_pass, self._pass_rows, target_index)

    def _completion(self, r: _Running) -> Completion:
        rows = torch.stack(r.rows) if r.rows else torch.zeros((0, 0))  # [steps, vocab]
        return self._with_logits(Completion(r.request.request_id, r.tokens, r.logprobs, evidence=r.evidence),
                                 rows, r.request)

    def _generate_padded(self, requests: Sequence[Request]) -> list[Completion]:
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
            c = Completion(r.request_id, tokens, [float(logprobs[i, s, t]) for s, t in enumerate(tokens)])
            c.evidence = [StepEvidence(s, len(requests), num_tokens if s == 0 else len(requests), s == 0,
                                       token_index=s) for s in range(n)]
            completions.append(self._with_logits(c, logits[i, :n].cpu(), r))
        return completions

    @staticmethod
    def _with_logits(c: Completion, rows: torch.Tensor, r: Request) -> Completion:
        """Attach the float32 logits rows [steps, vocab] (full or digests) and each step's top-2."""
        array = rows.numpy()
        if r.sampling.logits == "full":
            c.logits = list(array)
        elif r.sampling.logits == "digest":
            c.logits_digests = [hashlib.sha256(row.tobytes()).hexdigest() for row in array]
        c.top2 = [(float(a), float(b)) for a, b in torch.topk(rows, 2, dim=-1).values.tolist()] if len(rows) else []
        return c
