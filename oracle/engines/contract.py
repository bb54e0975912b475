"""The engine contract: what every adapter (native, vLLM, servers, transformers, a user's own) implements.

An engine is built for one mode. It takes a list of requests, each with the engine step (or, for
servers, the delay in seconds) at which it arrives, and returns one `Completion` per request with
the evidence of what shared its forward passes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = ["MODES", "Completion", "Engine", "Mode", "Request", "RunSpec", "SamplingParams", "StepEvidence",
           "output_problem"]

Mode = Literal["production", "invariant"]
MODES: tuple[Mode, ...] = ("production", "invariant")


@dataclass(frozen=True)
class SamplingParams:
    """Greedy when temperature == 0; otherwise seeded sampling (the seed is per request: its noise must not
    depend on the batch, nor be shared with another request). `top_k` 0 and `top_p` 1.0 keep every token."""

    max_tokens: int = 16
    temperature: float = 0.0
    seed: int = 0
    logits: Literal["full", "digest", "none"] = "digest"
    top_p: float = 1.0
    top_k: int = 0


@dataclass(frozen=True)
class Request:
    """One request of a trial: a prompt as token ids, when it arrives, and how to sample."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    arrival_step: int = 0
    arrival_delay_s: float = 0.0


@dataclass(frozen=True)
class StepEvidence:
    """What one forward pass that computed a token of this request looked like.

    `num_seqs` and `num_tokens` count every sequence and token in that forward pass (the request
    itself included; `num_tokens` is the pass's packed query length); `is_prefill` is true for
    passes that processed prompt tokens of this request, and `chunked` when its prompt needed more
    than one pass. `token_index` is the index of the generated token this pass sampled (None for a
    prefill chunk that sampled nothing). The fields after it describe the whole pass, as far as the
    engine can tell (None where it cannot): what split-KV and varlen kernels pick their
    configuration from.
    """

    engine_step: int
    num_seqs: int
    num_tokens: int
    is_prefill: bool
    chunked: bool = False
    num_cached_tokens: int = 0
    token_index: int | None = None  # which generated token this pass sampled, if any
    seq_position: int | None = None  # this request's index among the pass's sequences
    num_prefill_tokens: int | None = None  # prompt tokens in the pass, all sequences
    num_decode_tokens: int | None = None  # decode tokens in the pass, all sequences
    max_query_len: int | None = None  # the longest query of any sequence in the pass
    kv_len: int | None = None  # this request's KV length after the pass
    max_kv_len: int | None = None  # the longest KV length of any sequence in the pass
    has_chunked: bool | None = None  # some sequence in the pass was a chunk of a longer prompt
    has_cache_hit: bool | None = None  # some sequence in the pass started from cached prefix blocks


@dataclass
class Completion:
    """The outputs of one request, compared bitwise across runs.

    `logprobs[i]` is the float32 log-probability of `token_ids[i]`; `logits[i]` is the float32
    logits row of step i (vocab-sized) when full rows were asked for; `logits_digests[i]` a
    sha256 of that row's bytes otherwise (the native engine hashes a fingerprint of the row's bits
    made on the device, oracle/engines/native/sampler.py: compare digests of one engine only). `top2[i]` is (top-1 logit, top-2 logit) of step i.
    In a stored result (oracle.execute.keep_rows) a trial keeps only the rows a divergence reads: the
    others are None, and `logits_digests[i]` is then the sha256 of row i's float32 bytes.
    """

    request_id: str
    token_ids: list[int]
    logprobs: list[float]
    logits: list[Any] | None = None
    logits_digests: list[str] | None = None
    top2: list[tuple[float, float]] | None = None
    evidence: list[StepEvidence] = field(default_factory=list)

    @property
    def max_batch(self) -> int:
        """The most sequences this request ever shared a forward pass with (itself included)."""
        return max((e.num_seqs for e in self.evidence), default=0)


@runtime_checkable
class Engine(Protocol):
    """What the runner needs from an engine. `mode` is fixed at construction."""

    mode: Mode

    def generate(self, requests: Sequence[Request], max_num_batched_tokens: int | None = None) -> list[Completion]:
        """Run all requests (arriving as given) to completion; one Completion per request, in order.

        Each completion holds exactly `sampling.max_tokens` tokens (EOS does not stop a request),
        unless the engine has an attribute `stop_at_eos` that is true; every logprob is finite.
        `oracle.execute.generate` checks this (`output_problem`): anything else is an engine error.

        `max_num_batched_tokens`, when given, is this call's token budget per forward pass (a
        trial's chunked-prefill budget); an engine that cannot change it per call raises
        `oracle.errors.ConfigError`.
        """
        ...

    def describe(self) -> dict[str, Any]:
        """Engine name, version and the invariance mechanism, for the report's environment."""
        ...

    def close(self) -> None:
        """Release the model and any worker process or server."""
        ...


@dataclass(frozen=True)
class RunSpec:
    """One run to capture per op (localization): requests, the target's index among them, the per-pass
    token budget. `warm_with` runs first (uncaptured) after the prefix cache is reset: a warm-cache run.
    """

    requests: tuple[Request, ...]
    target_index: int
    budget: int | None = None
    warm_with: tuple[Request, ...] = ()


def _nonfinite(values: Any) -> tuple[int, float] | None:
    """(index, value) of the first NaN or +Inf in a float32 row, or None. -Inf is allowed: a masked logit."""
    import numpy as np

    row = np.asarray(values, dtype=np.float32).reshape(-1)
    bad = np.flatnonzero(np.isnan(row) | np.isposinf(row))
    return (int(bad[0]), float(row[bad[0]])) if bad.size else None


def output_problem(request: Request, c: Any, stop_at_eos: bool = False) -> str | None:
    """What makes `c` an impossible output for `request`, or None when it is a well-formed Completion.

    A broken model (NaN or Inf weights) or a lying server must never compare equal by accident, so
    these are engine faults, not data: a non-Completion; token ids that are not ints; more tokens
    than `max_tokens`, or fewer unless the engine stops at EOS; per-step lists of other lengths; a
    sampled-token logprob that is NaN or +-Inf (a sampled token has a finite probability); a top-1
    that is not finite or a top-2 that is NaN or +Inf; a logits row with a NaN or +Inf.
    """
    if not isinstance(c, Completion):
        return f"returned {type(c).__name__}, not a Completion"
    if not isinstance(c.token_ids, list) or not isinstance(c.logprobs, list):
        return "token_ids and logprobs must be lists"
    n, want = len(c.token_ids), request.sampling.max_tokens
    if n > want or (n < want and not (stop_at_eos and n > 0)):
        return (f"{n} tokens for max_tokens {want} (a request generates exactly max_tokens: "
                "EOS is ignored, so a short output is a truncated one)")
    bad_id = next((t for t in c.token_ids if type(t) is not int or t < 0), None)
    if bad_id is not None:
        return f"token id {bad_id!r} is not a non-negative int"
    for name in ("logprobs", "logits", "logits_digests", "top2"):
        values = getattr(c, name)
        if values is not None and len(values) != n:
            return f"{len(values)} {name} for {n} tokens"
    for i, lp in enumerate(c.logprobs):
        if not isinstance(lp, (int, float)) or isinstance(lp, bool) or not math.isfinite(lp):
            return f"step {i}: the sampled token's logprob is {lp!r}, not a finite number"
    for i, pair in enumerate(c.top2 or ()):
        top1, top2 = (float(v) for v in pair)
        if not math.isfinite(top1) or math.isnan(top2) or top2 == math.inf:
            return f"step {i}: top-2 logits ({top1!r}, {top2!r}) are not finite"
    for i, row in enumerate(c.logits or ()):
        if row is None:
            return f"step {i}: no logits row"
        found = _nonfinite(row)
        if found is not None:
            return f"step {i}: logits row holds {found[1]!r} at token {found[0]}"
    return None
