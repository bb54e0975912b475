"""Paged attention for the native engine: the custom op, its production path and a reference.

`oracle_kernels::paged_attention` is a torch.library custom op in our own namespace (defining
it overrides nothing). Its default implementation is the production path, what serving engines
do: decode queries split their KV range into `num_kv_splits` chunks (the engine picks the number
from the batch size, as split-KV / flash-decoding kernels do) merged by log-sum-exp, prefill
queries run a plain masked attention, all with torch's default ops. That makes it batch-variant
on purpose. `enable()` registers the invariant implementation (kernels/cpu/attention.py) on the
CPU key over it; `disable()` removes it again.

Layout (flattened tokens, as vLLM):
    q             [T, Hq, D]   queries of every token scheduled this step, sequence after sequence
    k_cache       [num_blocks, block_size, Hkv, D]   already holds this step's keys
    v_cache       [num_blocks, block_size, Hkv, D]
    block_tables  [B, max_blocks] int32: block j of sequence b holds positions j*block_size ...
    seq_lens      [B] int32: context length of sequence b after this step's tokens
    query_start_loc [B + 1] int32: sequence b's queries are q[qsl[b]:qsl[b + 1]]
Query i of sequence b sits at position seq_lens[b] - q_len + i and attends to keys 0..position.
Query head h reads kv head h // (Hq // Hkv).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionShape:
    """Sizes read off the inputs, after checking that they agree."""

    num_tokens: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    num_seqs: int

    @property
    def group(self) -> int:
        """Query heads per kv head."""
        return self.num_heads // self.num_kv_heads


def check_attention_inputs(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
) -> AttentionShape:
    """Validate the paged-attention inputs against each other; raise ValueError naming the culprit."""
    if q.dim() != 3:
        raise ValueError(f"paged_attention: q must be [T, Hq, D], got shape {tuple(q.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            "paged_attention: k_cache and v_cache must both be [num_blocks, block_size, Hkv, D], "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_dim = k_cache.shape
    if cache_dim != head_dim:
        raise ValueError(f"paged_attention: head dim of q ({head_dim}) and of the cache ({cache_dim}) differ")
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(f"paged_attention: Hq={num_heads} is not a multiple of Hkv={num_kv_heads}")
    num_seqs = seq_lens.shape[0]
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(
            f"paged_attention: block_tables must be [B={num_seqs}, max_blocks], got {tuple(block_tables.shape)}"
        )
    if query_start_loc.shape != (num_seqs + 1,):
        raise ValueError(
            f"paged_attention: query_start_loc must be [B + 1 = {num_seqs + 1}], got {tuple(query_start_loc.shape)}"
        )
    return AttentionShape(num_tokens, num_heads, num_kv_heads, head_dim, block_size, num_seqs)


def gather_kv(
    cache: torch.Tensor, block_table: torch.Tensor, context_len: int, dtype: torch.dtype
) -> torch.Tensor:
    """The first `context_len` positions of one sequence, [context_len, Hkv, D] in `dtype`."""
    block_size = cache.shape[1]
    num_blocks = -(-context_len // block_size)
    blocks = block_table[:num_blocks].long()
    return cache[blocks].reshape(-1, *cache.shape[2:])[:context_len].to(dtype)


def _by_kv_head(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    # [L, Hq, D] -> [Hkv, G * L, D], row g * L + i = query i of head kvh * G + g.
    length, num_heads, head_dim = q.shape
    group = num_heads // num_kv_heads
    return q.view(length, num_kv_heads, group, head_dim).permute(1, 2, 0, 3).reshape(num_kv_heads, -1, head_dim)


def _from_kv_head(o: torch.Tensor, length: int) -> torch.Tensor:
    # [Hkv, G * L, D] -> [L, Hq, D], the inverse of _by_kv_head.
    num_kv_heads, rows, head_dim = o.shape
    group = rows // length
    return o.view(num_kv_heads, group, length, head_dim).permute(2, 0, 1, 3).reshape(length, -1, head_dim)


def _masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of the last L positions over a context of C: q [L, Hq, D], k, v [C, Hkv, D]."""
    length, context = q.shape[0], k.shape[0]
    qh = _by_kv_head(q, k.shape[1])  # [Hkv, G*L, D]
    scores = torch.matmul(qh, k.permute(1, 2, 0)) * scale  # [Hkv, G*L, C]
    query_pos = context - length + torch.arange(length, device=q.device).repeat(qh.shape[1] // length)  # [G*L]
    allowed = torch.arange(context, device=q.device)[None, :] <= query_pos[:, None]  # [G*L, C]
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return _from_kv_head(torch.matmul(probs, v.permute(1, 0, 2)), length)  # [L, Hq, D]


def _split_kv_decode(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, num_kv_splits: int
) -> torch.Tensor:
    """One decode query q [1, Hq, D] over k, v [C, Hkv, D], flash-decoding style.

    The C positions are cut into `num_kv_splits` near-equal chunks; each chunk yields its
    normalised partial output and log-sum-exp, and the partials are merged by their weights.
    """
    context = k.shape[0]
    splits = max(1, min(num_kv_splits, context))
    bounds = [context * i // splits for i in range(splits + 1)]
    qh = _by_kv_head(q, k.shape[1])  # [Hkv, G, D]
    partials, lses = [], []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        scores = torch.matmul(qh, k[lo:hi].permute(1, 2, 0)) * scale  # [Hkv, G, hi-lo]
        m = scores.amax(dim=-1, keepdim=True)
        p = torch.exp(scores - m)
        denom = p.sum(dim=-1, keepdim=True)
        partials.append(torch.matmul(p, v[lo:hi].permute(1, 0, 2)) / denom)  # [Hkv, G, D]
        lses.append(m + torch.log(denom))  # [Hkv, G, 1]
    lse = torch.stack(lses)  # [splits, Hkv, G, 1]
    weights = torch.exp(lse - torch.logsumexp(lse, dim=0, keepdim=True))
    return _from_kv_head((weights * torch.stack(partials)).sum(dim=0), 1)  # [1, Hq, D]


def production_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    num_kv_splits: int,
) -> torch.Tensor:
    """The production path: split-KV decode and masked prefill with torch's default ops, in float32."""
    check_attention_inputs(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc)
    out = torch.zeros_like(q)
    starts = query_start_loc.tolist()
    for b, context in enumerate(seq_lens.tolist()):
        lo, hi = starts[b], starts[b + 1]
        if hi == lo:
            continue
        k = gather_kv(k_cache, block_tables[b], context, torch.float32)  # [C, Hkv, D]
        v = gather_kv(v_cache, block_tables[b], context, torch.float32)
        qb = q[lo:hi].float()  # [L, Hq, D]
        if hi - lo == 1:
            out[lo:hi] = _split_kv_decode(qb, k, v, scale, num_kv_splits).to(q.dtype)
        else:
            out[lo:hi] = _masked_attention(qb, k, v, scale).to(q.dtype)
    return out


def reference_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Plain masked attention in float64, one sequence at a time, returned in q's dtype.

    For accuracy tests only: no splits and no tiles, the most direct reading of the contract.
    """
    check_attention_inputs(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc)
    out = torch.zeros_like(q)
    starts = query_start_loc.tolist()
    for b, context in enumerate(seq_lens.tolist()):
        lo, hi = starts[b], starts[b + 1]
        if hi == lo:
            continue
        k = gather_kv(k_cache, block_tables[b], context, torch.float64)
        v = gather_kv(v_cache, block_tables[b], context, torch.float64)
        out[lo:hi] = _masked_attention(q[lo:hi].double(), k, v, scale).to(q.dtype)
    return out


@torch.library.custom_op("oracle_kernels::paged_attention", mutates_args=())
def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    num_kv_splits: int,
) -> torch.Tensor:
    """Attention of every scheduled token over its sequence's paged KV cache -> [T, Hq, D], q's dtype.

    Default (production): decode queries split their KV range into `num_kv_splits` chunks merged
    by log-sum-exp, which makes the result depend on the batch through `num_kv_splits`. With the
    kernels enabled, the CPU runs the invariant path instead (fixed 32-position chunks, merged in
    order), which ignores `num_kv_splits`. See the module docstring for the layout.
    """
    return production_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, num_kv_splits)


@paged_attention.register_fake
def _paged_attention_fake(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    num_kv_splits: int,
) -> torch.Tensor:
    return torch.empty_like(q)
