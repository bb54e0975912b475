"""The engine contract: what every adapter (native, vLLM, servers, transformers, a user's own) implements.

An engine is built for one mode. It takes a list of requests, each with the engine step (or, for
servers, the delay in seconds) at which it arrives, and returns one `Completion` per request with
the evidence of what shared its forward passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = ["MODES", "Completion", "Engine", "Mode", "Request", "RunSpec", "SamplingParams", "StepEvidence"]

Mode = Literal["production", "invariant"]
MODES: tuple[Mode, ...] = ("production", "invariant")


@dataclass(frozen=True)
class SamplingParams:
    """Greedy when temperature == 0; otherwise seeded sampling (the seed is per request)."""

    max_tokens: int = 16
    temperature: float = 0.0
    seed: int = 0
    logits: Literal["full", "digest", "none"] = "digest"


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
