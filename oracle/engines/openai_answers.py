"""What an OpenAI-style server answers, read as oracle's types: a `/v1/completions` choice as a Completion (token ids,
float32 logprobs, a digest of each step's top-k, the top-2 margin), checked as it is read: a null, NaN or infinite
logprob, fewer than two top-k entries or a wrong token count is a malformed answer, never compared."""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping
from typing import Any

from oracle.engines.contract import Completion, Request, StepEvidence


def _f32(x: float) -> float:
    """The float32 value of a JSON number (servers print float32 logprobs as decimal)."""
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def _finite(x: Any, where: str) -> float:
    """A logprob from the answer as float32; null, NaN, Infinity or a non-number is a malformed answer
    (a sampled or listed token has a finite logprob; a broken model must not compare equal to itself)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ValueError(f"{where} is {x!r}, not a number")
    try:
        value = _f32(float(x))
    except OverflowError:  # beyond float32
        value = math.inf
    if not math.isfinite(value):
        raise ValueError(f"{where} is {x!r}, not a finite logprob")
    return value


def _token_id(token: str) -> int:
    prefix, _, num = token.partition(":")
    if prefix != "token_id" or not num.lstrip("-").isdigit():
        raise ValueError(f"token {token!r} is not 'token_id:N' (does the server honour return_tokens_as_token_ids?)")
    return int(num)


def topk_digest(top: Mapping[int, float] | Mapping[str, float] | Mapping[int | str, float]) -> str:
    """sha256 of the top-k as (int32 token id, float32 bits) pairs, sorted by token id.

    A server that names top-k entries by token text (no ids) gets (utf-8 text, float32 bits) pairs
    sorted by text: still a bitwise comparison of the same top-k.
    """
    h = hashlib.sha256()
    for key in sorted(top):  # type: ignore[type-var]
        bits = struct.unpack("<I", struct.pack("<f", top[key]))[0]  # type: ignore[index]
        if isinstance(key, int):
            h.update(struct.pack("<iI", key, bits))
        else:
            data = str(key).encode()
            h.update(struct.pack("<I", len(data)) + data + struct.pack("<I", bits))
    return h.hexdigest()


def _top_key(token: str) -> int | str:
    prefix, _, num = token.partition(":")
    return int(num) if prefix == "token_id" and num.lstrip("-").isdigit() else token


def cached_tokens(answer: Any) -> int:
    """The prompt tokens the server took from its prefix cache, as it reports them in
    `usage.prompt_tokens_details.cached_tokens` (vLLM with --enable-prompt-tokens-details, SGLang with
    --enable-cache-report); 0 when it does not say."""
    usage = answer.get("usage") if isinstance(answer, dict) else None
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    n = details.get("cached_tokens") if isinstance(details, dict) else None
    return n if type(n) is int and n > 0 else 0


def _choice_token_ids(choice: dict[str, Any], lp: dict[str, Any]) -> list[int]:
    """The sampled token ids: the ids a server returns beside the text (SGLang's return_token_ids), else read
    from the logprobs' token strings."""
    ids = choice.get("token_ids")
    if isinstance(ids, list) and ids and all(type(t) is int for t in ids):  # not bool: True is no token id
        return list(ids)
    return [_token_id(t) for t in lp["tokens"]]


def _top2_steps(top_logprobs: list[Any]) -> tuple[list[str], list[tuple[float, float]]]:
    """Per step of `top_logprobs`: the digest of its top-k and its two best logprobs."""
    digests: list[str] = []
    top2: list[tuple[float, float]] = []
    for i, step in enumerate(top_logprobs):
        if not isinstance(step, dict):
            raise ValueError(f"top_logprobs[{i}] is {step!r}, not an object")
        top = {_top_key(t): _finite(v, f"top_logprobs[{i}][{t!r}]") for t, v in step.items()}
        if len(top) < 2:
            raise ValueError(f"top_logprobs[{i}] holds {len(top)} entries; asked for at least 2")
        values = sorted(top.values(), reverse=True)
        digests.append(topk_digest(top))
        top2.append((values[0], values[1]))
    return digests, top2


def parse_choice(request: Request, choice: dict[str, Any], num_seqs: int, num_cached_tokens: int = 0) -> Completion:
    """One `/v1/completions` choice as a Completion; raises ValueError/KeyError/TypeError if malformed.
    `num_cached_tokens` (the prompt tokens served from the prefix cache) goes on the prefill step's evidence."""
    lp = choice["logprobs"]
    if not isinstance(lp, dict):
        raise ValueError("no logprobs in the answer")
    token_ids = _choice_token_ids(choice, lp)
    want = request.sampling.max_tokens
    if len(token_ids) != want:
        raise ValueError(f"{len(token_ids)} tokens for max_tokens {want} (finish_reason "
                         f"{choice.get('finish_reason')!r}); the server must honour ignore_eos and max_tokens")
    logprobs = [_finite(x, f"token_logprobs[{i}]") for i, x in enumerate(lp["token_logprobs"])]
    if len(logprobs) != len(token_ids):
        raise ValueError(f"{len(token_ids)} tokens but {len(logprobs)} token_logprobs")
    digests, top2 = _top2_steps(lp.get("top_logprobs") or [])
    logits = request.sampling.logits != "none"
    return Completion(request_id=request.request_id, token_ids=token_ids, logprobs=logprobs,
                      logits_digests=digests if logits and digests else None,
                      top2=top2 if top2 else None, evidence=_evidence(len(token_ids), num_seqs, num_cached_tokens))


def _evidence(num_steps: int, num_seqs: int, num_cached_tokens: int) -> list[StepEvidence]:
    """What a server tells of its steps: the prefill first, with the prompt tokens it took from its cache."""
    return [StepEvidence(engine_step=i, num_seqs=num_seqs, num_tokens=0, is_prefill=i == 0, token_index=i,
                         num_cached_tokens=num_cached_tokens if i == 0 else 0)
            for i in range(num_steps)]
