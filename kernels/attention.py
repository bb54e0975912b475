"""Paged attention for the native engine: the op, its production path and a reference.

`oracle_kernels::paged_attention` is a torch.library op in our own namespace (defining
it overrides nothing). Its default implementation is the production path, what serving engines
do: decode queries split their KV range into `num_kv_splits` chunks (the engine picks the number
from the batch size, as split-KV / flash-decoding kernels do) merged by log-sum-exp, prefill
queries run a plain masked attention, all with torch's default ops. That makes it batch-variant
on purpose. On CUDA the production path is the Triton kernel of kernels/triton/attention.py run
with a partition sized from `num_kv_splits` (so it varies with the batch as well). `enable()`
registers the invariant implementations (kernels/cpu/attention.py, kernels/triton/attention.py)
over it; `disable()` removes them again. No path loops over sequences in Python.

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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

T = TypeVar("T")


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


def token_layout(
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, num_tokens: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per token: its sequence, its index among the sequence's queries, and whether it belongs to one.

    All [T] int64 / bool, computed on the tensors' device without a host round trip.
    """
    qsl = query_start_loc.long()
    num_seqs = seq_lens.shape[0]
    token = torch.arange(num_tokens, device=qsl.device)
    seq = torch.searchsorted(qsl[1:], token, right=True).clamp_(max=max(num_seqs - 1, 0))  # [T]
    return seq, token - qsl[seq], token < qsl[-1]


class LayoutCache(Generic[T]):
    """The last thing made from a pass's layout (block_tables, seq_lens, query_start_loc and some sizes),
    found again when a call's layout holds the same values: the decoder gives every layer of a pass the
    same layout, so what depends on it alone is made once per pass. Compared by value, so a tensor changed
    in place since, or another with the same values, is never mistaken. The values are read as Python
    lists: torch.equal would run the kernels' own sum while they are enabled."""

    def __init__(self) -> None:
        self._entry: tuple[tuple[object, ...], T] | None = None

    def get(self, layout: tuple[torch.Tensor, ...], sizes: tuple[object, ...], make: Callable[[], T]) -> T:
        key = (*sizes, *((x.dtype, x.shape, x.tolist()) for x in layout))
        entry = self._entry  # one read: another thread may replace it meanwhile
        if entry is not None and entry[0] == key:
            return entry[1]
        made = make()
        self._entry = (key, made)
        return made


@dataclass(frozen=True)
class ProductionLayout:
    """What production_attention does that depends on the layout alone. B sequences, L the most queries of
    one, C the longest context, S the most KV splits."""

    num_seqs: int
    longest_query: int  # 0: no queries, nothing to compute
    slot: torch.Tensor  # [B, C] int64 flat cache slots, 0 outside the context
    in_context: torch.Tensor  # [B, C] bool
    seq: torch.Tensor  # [V] int64: each valid token's sequence ...
    index: torch.Tensor  # [V] int64: ... and its index among the sequence's queries
    valid: torch.Tensor  # [V] int64: the valid tokens
    masked_out: torch.Tensor  # [S, B, 1, 1, L, C] bool: key c is not in split s of query l's keys


def production_layout(
    block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor, num_tokens: int,
    block_size: int, num_kv_splits: int,
) -> ProductionLayout:
    """production_attention's layout: the sizes, the gather's slots and every split's mask."""
    device = seq_lens.device
    qsl = query_start_loc.long()
    context = seq_lens.long()  # [B]
    q_lens = qsl[1:] - qsl[:-1]  # [B]
    splits = torch.where(q_lens == 1, torch.clamp(context, max=max(1, num_kv_splits)), 1)  # [B]
    # One host read per call: the padded sizes (this path is the CPU's; CUDA runs kernels/triton).
    longest_query, longest_context, num_splits = (
        int(x) for x in torch.stack([q_lens.max(), context.max(), splits.max()]).tolist())
    bs = block_size
    kv_pos = torch.arange(longest_context, device=device)  # [C]
    in_context = kv_pos[None, :] < context[:, None]  # [B, C]
    block_col = (kv_pos // bs).clamp(max=block_tables.shape[1] - 1)
    slot = torch.where(in_context, block_tables.long()[:, block_col] * bs + kv_pos % bs, 0)  # [B, C]
    seq, index, valid = token_layout(query_start_loc, seq_lens, num_tokens)
    valid_tokens = torch.nonzero(valid).squeeze(1)
    query_pos = (context - q_lens)[:, None] + torch.arange(longest_query, device=device)  # [B, L]
    allowed = (kv_pos[None, None, :] <= query_pos[:, :, None]) & in_context[:, None, :]  # [B, L, C]
    split_of = ((kv_pos[None, :] + 1) * splits[:, None] - 1) // context.clamp(min=1)[:, None]  # [B, C]
    # Every split at once: [S, B, Hkv, G, L, C], keys outside split s masked out of row s.
    in_split = (split_of[None] == torch.arange(num_splits, device=device)[:, None, None])  # [S, B, C]
    mask = (allowed[None] & in_split[:, :, None, :])[:, :, None, None]  # [S, B, 1, 1, L, C]
    return ProductionLayout(seq_lens.shape[0], longest_query, slot, in_context, seq[valid_tokens],
                            index[valid_tokens], valid_tokens, ~mask)


_PRODUCTION_LAYOUTS: LayoutCache[ProductionLayout] = LayoutCache()


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
    """The production path with torch's default ops in float32, vectorized over the batch.

    Every sequence's context is gathered into one padded [B, C, Hkv, D] tensor and every
    sequence's queries into [B, L, Hq, D] (L the most queries of one sequence). A decode sequence
    (one query) cuts its context of c positions into s = min(num_kv_splits, c) near-equal splits,
    position p in split ((p + 1) * s - 1) // c (the bounds c * i // s), each reduced alone and
    merged by log-sum-exp as flash-decoding does; a prefill sequence is one split.
    """
    shape = check_attention_inputs(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc)
    out = torch.zeros_like(q)
    if shape.num_tokens == 0 or shape.num_seqs == 0:
        return out

    def make() -> ProductionLayout:
        return production_layout(block_tables, seq_lens, query_start_loc, shape.num_tokens, shape.block_size,
                                 num_kv_splits)

    # On the CPU the layout is made once per pass; elsewhere reading it back to compare would cost a sync.
    layout = (_PRODUCTION_LAYOUTS.get((block_tables, seq_lens, query_start_loc),
                                      (shape.num_tokens, shape.block_size, num_kv_splits), make)
              if q.device.type == "cpu" else make())
    if layout.longest_query == 0:
        return out
    hkv, group, dim = shape.num_kv_heads, shape.group, shape.head_dim

    def gather(cache: torch.Tensor) -> torch.Tensor:
        # [B, Hkv, C, D] float32, zero outside the context (unused slots may hold anything, NaN too).
        values = cache.view(-1, hkv, dim)[layout.slot].float()
        return torch.where(layout.in_context[..., None, None], values, 0.0).permute(0, 2, 1, 3)

    k, v = gather(k_cache), gather(v_cache)
    seq, index = layout.seq, layout.index
    qp = q.new_zeros((layout.num_seqs, layout.longest_query, shape.num_heads, dim), dtype=torch.float32)
    qp[seq, index] = q[layout.valid].float()
    qh = qp.view(layout.num_seqs, layout.longest_query, hkv, group, dim).permute(0, 2, 3, 1, 4)  # [B, Hkv, G, L, D]
    scores = torch.einsum("bhgld,bhcd->bhglc", qh, k) * scale  # [B, Hkv, G, L, C]
    masked = scores[None].masked_fill(layout.masked_out, float("-inf"))  # [S, B, Hkv, G, L, C]
    m = masked.amax(dim=-1, keepdim=True)
    shift = torch.where(m == float("-inf"), 0.0, m)
    p = torch.exp(masked - shift)
    denom = p.sum(dim=-1, keepdim=True)  # [S, B, Hkv, G, L, 1]
    acc = torch.einsum("sbhglc,bhcd->sbhgld", p, v)
    partials = torch.where(denom > 0, acc / denom, 0.0)  # [S, B, Hkv, G, L, D]
    lse = torch.where(denom > 0, shift + torch.log(denom), float("-inf"))
    total = torch.logsumexp(lse, dim=0, keepdim=True)
    weights = torch.where(lse == float("-inf"), 0.0, torch.exp(lse - total))
    merged = (weights * partials).sum(dim=0)  # [B, Hkv, G, L, D]
    rows = merged.permute(0, 3, 1, 2, 4).reshape(layout.num_seqs, layout.longest_query, shape.num_heads, dim)
    out[layout.valid] = rows[seq, index].to(q.dtype)
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


# Defined with torch.library.Library rather than torch.library.custom_op: a custom_op's kernel imports
# torch._dynamo on its first call (about 0.8 s on the CPU, paid by production mode's first reference),
# and nothing here is compiled. The dispatch is the same: the production path is the op's
# CompositeExplicitAutograd kernel, which the CPU and CUDA kernels `enable()` registers take over.
# A fragment, defined once per process: this file may be imported under two names (`oracle_kernels`, and
# `kernels` from a checkout's root), and the second import must find the op, not define it again.
_LIBRARY = torch.library.Library("oracle_kernels", "FRAGMENT")
_DEFINED_HERE = not hasattr(torch.ops.oracle_kernels, "paged_attention")
if _DEFINED_HERE:
    _LIBRARY.define(
        "paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor seq_lens, "
        "Tensor query_start_loc, float scale, int num_kv_splits) -> Tensor"
    )


def _production_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    num_kv_splits: int,
) -> torch.Tensor:
    if q.is_cuda:
        from .triton.attention import production_paged_attention

        return production_paged_attention(
            q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, num_kv_splits)
    return production_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, num_kv_splits)


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


if _DEFINED_HERE:
    _LIBRARY.impl("paged_attention", _production_paged_attention, "CompositeExplicitAutograd")
    torch.library.register_fake("oracle_kernels::paged_attention", _paged_attention_fake, lib=_LIBRARY)


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

    Calls the op `oracle_kernels::paged_attention`. Default (production): decode queries split their
    KV range into `num_kv_splits` chunks merged by log-sum-exp, which makes the result depend on the
    batch through `num_kv_splits`. With the kernels enabled, the CPU runs the invariant path instead
    (fixed 32-position chunks, merged in order), which ignores `num_kv_splits`. See the module
    docstring for the layout. On CUDA the production path is the Triton kernel of
    kernels/triton/attention.py with a partition sized from `num_kv_splits` and the block table's
    width, as split-KV decode kernels size theirs.
    """
    out: torch.Tensor = torch.ops.oracle_kernels.paged_attention.default(
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, num_kv_splits)
    return out
