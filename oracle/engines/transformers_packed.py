"""Packed batches for Hugging Face models: every sequence's new tokens laid end to end, no padding.

A forward pass takes `[1, T]` token ids: the new tokens of every sequence in the step, one after
the other, with each token's own position. Every op outside attention works row by row (linear
layers, norms, rotary embeddings), so under `oracle_kernels` a token's result does not depend on
the rows around it. Attention is the one op that needs sequence boundaries: the function
registered here as `oracle_packed` splits the packed queries, keys and values by sequence, appends
each sequence's keys and values to a cache of its own, and lets each query attend over exactly
the keys of its own prefix. A padded batch instead stretches every attention row to the longest prompt, which changes
the reduction; here a sequence's attention has the same shape whatever shares the pass.

The layout of the pass in flight is handed to the attention function in a context variable; the
model is called with `use_cache=False` and keeps no state of its own.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

ATTENTION_NAME = "oracle_packed"


@dataclass
class SequenceCache:
    """One sequence's keys and values per layer: `[Hkv, L, D]` each."""

    keys: dict[int, torch.Tensor] = field(default_factory=dict)
    values: dict[int, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class Packing:
    """The pass in flight: for each sequence in order, its cache and how many new tokens it brings."""

    caches: tuple[SequenceCache, ...]
    num_new: tuple[int, ...]


_PACKING: contextvars.ContextVar[Packing | None] = contextvars.ContextVar("oracle_packing", default=None)


@contextmanager
def packed(packing: Packing) -> Iterator[None]:
    token = _PACKING.set(packing)
    try:
        yield
    finally:
        _PACKING.reset(token)


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    # [Hkv, L, D] -> [Hkv * groups, L, D], each kv head repeated for its query heads (as HF's repeat_kv).
    return x if groups == 1 else x.repeat_interleave(groups, dim=0)


def packed_attention(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0, **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention per sequence of the packed pass; query [1, H, T, D], key/value [1, Hkv, T, D].

    Returns `[1, T, H, D]`. The math is HF's eager attention (matmul, scale, float32 softmax,
    matmul), run one query row at a time over exactly the keys it may see, so that no row carries
    masked entries: its reduction length is its position + 1, whatever shares the pass.
    """
    packing = _PACKING.get()
    if packing is None:
        raise RuntimeError(f"{ATTENTION_NAME} attention called outside a packed pass")
    layer = int(module.layer_idx)  # type: ignore[arg-type]
    window = kwargs.get("sliding_window")
    if kwargs.get("softcap") is not None or getattr(module, "sinks", None) is not None:
        raise NotImplementedError(f"{ATTENTION_NAME}: attention with logit softcapping or sinks is not supported")
    groups = query.shape[1] // key.shape[1]
    outputs = []
    start = 0
    for cache, n in zip(packing.caches, packing.num_new, strict=True):
        end = start + n
        k_new, v_new = key[0, :, start:end], value[0, :, start:end]  # [Hkv, n, D]
        if layer in cache.keys:
            k_new = torch.cat((cache.keys[layer], k_new), dim=1)
            v_new = torch.cat((cache.values[layer], v_new), dim=1)
        cache.keys[layer], cache.values[layer] = k_new, v_new
        length = k_new.shape[1]
        if window is not None and length > int(window):
            raise NotImplementedError(f"{ATTENTION_NAME}: sequence of {length} tokens exceeds the model's "
                                      f"sliding window ({window}); sliding-window attention is not supported")
        keys, values = _repeat_kv(k_new, groups), _repeat_kv(v_new, groups)  # [H, L, D]
        for j in range(n):
            # Query j sits at position length - n + j and attends over exactly its prefix: the same
            # shapes as the decode step that would compute that position, so prefill == decode.
            seen = length - n + j + 1
            q = query[0, :, start + j : start + j + 1]  # [H, 1, D]
            scores = torch.matmul(q, keys[:, :seen].transpose(1, 2)) * scaling  # [H, 1, seen]
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            outputs.append(torch.matmul(probs, values[:, :seen]).transpose(0, 1))  # [1, H, D]
        start = end
    return torch.cat(outputs, dim=0)[None], None


def register() -> str:
    """Register `oracle_packed` with transformers' attention functions (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, packed_attention)
    return ATTENTION_NAME
