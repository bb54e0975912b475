"""Batch-invariant paged attention on CUDA: fixed chunks and partitions at absolute positions.

A query at position p attends to keys 0..p. Two kernels, the same for prefill and decode tokens:

1. `partition_kernel`, one program per (query tile, kv head, partition). A query tile is up to
   `rows // G` consecutive tokens of one sequence with the G query heads of one kv head; a
   partition is the absolute positions [j * P, (j + 1) * P). The program walks its partition in
   chunks of S keys, in position order, with the usual running softmax in fp32:

       scores [rows, S] = q [rows, D] @ k^T [D, S] * scale    (tl.dot, fp32 accumulation)
       m' = max(m, rowmax(scores)); p = exp(scores - m')       (masked keys: p = 0 exactly)
       l' = l * exp(m - m') + rowsum(p); acc' = acc * exp(m - m') + p @ v

   and writes each row's (m, l, acc) for the partition to a scratch buffer. A chunk that holds
   no key of a row (a prefill tile runs the chunks of its last token) leaves that row's state
   untouched: it is selected away, not rescaled by 1 and added to zero.
2. `merge_kernel`, one program per token: merges the token's partitions 0..p // P in position
   order, every query head elementwise, and divides.

Every operation a row goes through depends only on its own query, its position and the keys and
values at positions 0..p: the chunk and partition boundaries are absolute, the tile shapes are the
fixed `AttentionTiles` of the dtype (config.py), and tl.dot computes each row of a tile alone. So
a token's output has the same bits in a full prefill, in a chunked prefill and in decode, alone or
beside any other sequences. `num_kv_splits` (the production path's batch-sized split) is ignored.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..attention import check_attention_inputs
from .config import ATTENTION_WORKSPACE_BYTES, AttentionTiles, attention_tiles
from .language import tl, triton

# --- kernels ------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["token_base", "num_parts", "stride_table"])
def partition_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, tiles_ptr, part_acc_ptr, part_stats_ptr,
    token_base, num_parts, scale, partition, block_size,
    stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_table,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    ROWS: tl.constexpr, CHUNK: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    """Running-softmax state of one (query tile, kv head, partition); see the module docstring.

    tiles [n, 4] int32: (sequence, first token, tokens, position of the first token).
    part_acc [tokens, Hq, num_parts, D] fp32; part_stats [tokens, Hq, num_parts, 2] fp32 (max, total);
    tokens counted from token_base.
    """
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    seq = tl.load(tiles_ptr + tile * 4)
    first_token = tl.load(tiles_ptr + tile * 4 + 1)
    num_tokens = tl.load(tiles_ptr + tile * 4 + 2)
    first_pos = tl.load(tiles_ptr + tile * 4 + 3)
    last_pos = first_pos + num_tokens - 1
    start = part * partition
    if start <= last_pos:
        # Row r is token r // GROUP_PAD of the tile, query head kv_head * GROUP + r % GROUP_PAD.
        r = tl.arange(0, ROWS)
        tok = r // GROUP_PAD
        head = kv_head * GROUP + r % GROUP_PAD
        pos = first_pos + tok  # [ROWS] absolute position of each row's query
        valid = (tok < num_tokens) & (r % GROUP_PAD < GROUP)
        d = tl.arange(0, BLOCK_D)
        d_ok = d < HEAD_DIM
        token = (first_token + tok).to(tl.int64)
        q = tl.load(q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                    mask=valid[:, None] & d_ok[None, :], other=0.0)  # [ROWS, BLOCK_D]
        m = tl.full((ROWS,), float("-inf"), tl.float32)
        total = tl.zeros((ROWS,), tl.float32)
        acc = tl.zeros((ROWS, BLOCK_D), tl.float32)
        end = tl.minimum(start + partition, last_pos + 1)  # every position < end is in the context
        table_row = table_ptr + seq.to(tl.int64) * stride_table
        for c0 in range(start, end, CHUNK):
            kv_pos = c0 + tl.arange(0, CHUNK)  # [CHUNK] absolute positions
            kv_ok = kv_pos < end
            block = tl.load(table_row + kv_pos // block_size, mask=kv_ok, other=0).to(tl.int64)
            in_block = kv_pos % block_size
            k = tl.load(k_ptr + (block * stride_kb + in_block * stride_ks + kv_head * stride_kh)[:, None] + d[None, :],
                        mask=kv_ok[:, None] & d_ok[None, :], other=0.0)  # [CHUNK, BLOCK_D]
            v = tl.load(v_ptr + (block * stride_vb + in_block * stride_vs + kv_head * stride_vh)[:, None] + d[None, :],
                        mask=kv_ok[:, None] & d_ok[None, :], other=0.0)  # [CHUNK, BLOCK_D]
            scores = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * scale  # [ROWS, CHUNK] fp32
            allowed = (kv_pos[None, :] <= pos[:, None]) & valid[:, None]
            scores = tl.where(allowed, scores, float("-inf"))
            chunk_max = tl.max(scores, axis=1)  # [ROWS]; -inf where the row has no key here
            m_new = tl.maximum(m, chunk_max)
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(scores - shift[:, None])  # [ROWS, CHUNK], 0 where not allowed
            alpha = tl.exp(m - shift)
            pv = tl.dot(p.to(v.dtype), v, input_precision=INPUT_PRECISION)  # [ROWS, BLOCK_D] fp32
            has_keys = chunk_max != float("-inf")
            total = tl.where(has_keys, total * alpha + tl.sum(p, axis=1), total)
            acc = tl.where(has_keys[:, None], acc * alpha[:, None] + pv, acc)
            m = tl.where(has_keys, m_new, m)
        slot = ((token - token_base) * (GROUP * tl.num_programs(1)) + head) * num_parts + part  # [ROWS]
        keep = valid & (pos >= start)
        tl.store(part_acc_ptr + slot[:, None] * HEAD_DIM + d[None, :], acc, mask=keep[:, None] & d_ok[None, :])
        tl.store(part_stats_ptr + slot * 2, m, mask=keep)
        tl.store(part_stats_ptr + slot * 2 + 1, total, mask=keep)


@triton.jit(do_not_specialize=["token_base", "num_parts"])
def merge_kernel(
    part_acc_ptr, part_stats_ptr, positions_ptr, out_ptr,
    token_base, num_parts, partition, stride_ot, stride_oh,
    NUM_HEADS: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """out[token] [Hq, D] = the token's partitions merged in position order; program t owns token t.

    Every head of the token is merged at once, elementwise: heads never mix.
    """
    t = tl.program_id(0)
    pos = tl.load(positions_ptr + token_base + t)
    if pos >= 0:
        h = tl.arange(0, BLOCK_H)
        d = tl.arange(0, BLOCK_D)
        h_ok = h < NUM_HEADS
        ok = h_ok[:, None] & (d < HEAD_DIM)[None, :]
        m = tl.full((BLOCK_H,), float("-inf"), tl.float32)
        total = tl.zeros((BLOCK_H,), tl.float32)
        acc = tl.zeros((BLOCK_H, BLOCK_D), tl.float32)
        slot = (t.to(tl.int64) * NUM_HEADS + h) * num_parts  # [BLOCK_H], partition 0 of each head
        for part in range(0, pos // partition + 1):
            part_m = tl.load(part_stats_ptr + (slot + part) * 2, mask=h_ok, other=0.0)
            part_total = tl.load(part_stats_ptr + (slot + part) * 2 + 1, mask=h_ok, other=0.0)
            part_acc = tl.load(part_acc_ptr + (slot + part)[:, None] * HEAD_DIM + d[None, :], mask=ok, other=0.0)
            m_new = tl.maximum(m, part_m)
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            old_scale = tl.exp(m - shift)
            new_scale = tl.exp(part_m - shift)
            total = total * old_scale + part_total * new_scale
            acc = acc * old_scale[:, None] + part_acc * new_scale[:, None]
            m = m_new
        out = acc / total[:, None]
        # A key past a row's position has p = +0, but +0 * v is -0 for a negative v, and the
        # prefill reads real values there where a decode reads zeros. That can only change the
        # sign of an output that is exactly zero; write every zero as +0 so it never shows.
        out = tl.where(out == 0.0, 0.0, out)
        row = out_ptr + (token_base + t).to(tl.int64) * stride_ot
        tl.store(row + h[:, None] * stride_oh + d[None, :], out.to(out_ptr.dtype.element_ty), mask=ok)


# --- launcher -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueryTiles:
    """The step's query tiles and token positions, on the host and on the device.

    tiles [n, 4] int32: (sequence, first token, tokens, position of the first token); consecutive
    tokens of one sequence, at most `tokens_per_tile`, in token order. positions [T] int32: each
    token's absolute position, -1 for tokens outside every sequence (their output stays zero).
    """

    tiles: torch.Tensor  # host
    parts: torch.Tensor  # [n] int64 host: partitions the tile's last token needs
    positions: torch.Tensor  # [T] int32 device
    tiles_device: torch.Tensor  # `tiles` on the device


def query_tiles(
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, num_tokens: int, tokens_per_tile: int, partition: int,
) -> QueryTiles:
    """Cut each sequence's queries into tiles, on the host (one small device-to-host copy)."""
    device = query_start_loc.device
    num_seqs = seq_lens.shape[0]
    host = torch.cat([query_start_loc.to(torch.int64), seq_lens.to(torch.int64)]).cpu()
    qsl, context = host[: num_seqs + 1], host[num_seqs + 1 :]
    q_lens = qsl[1:] - qsl[:-1]  # [B]
    if bool((q_lens < 0).any()) or bool((q_lens > context).any()) or int(qsl[-1]) > num_tokens:
        raise ValueError("paged_attention: query_start_loc and seq_lens do not describe the tokens of q")
    first_pos = context - q_lens  # [B]
    per_seq = (q_lens + tokens_per_tile - 1) // tokens_per_tile  # [B] tiles
    seq = torch.repeat_interleave(torch.arange(num_seqs), per_seq)  # [n]
    first_tile = torch.cumsum(per_seq, 0) - per_seq
    in_seq = torch.arange(seq.shape[0]) - first_tile[seq]  # tile index within its sequence
    offset = in_seq * tokens_per_tile
    count = torch.minimum(q_lens[seq] - offset, torch.tensor(tokens_per_tile))
    tiles = torch.stack([seq, qsl[seq] + offset, count, first_pos[seq] + offset], dim=1).to(torch.int32)
    parts = (first_pos[seq] + offset + count - 1) // partition + 1
    positions = torch.full((num_tokens,), -1, dtype=torch.int32)
    token_seq = torch.repeat_interleave(torch.arange(num_seqs), q_lens)
    token_ids = torch.arange(int(qsl[-1]))
    positions[: int(qsl[-1])] = (first_pos[token_seq] + token_ids - qsl[token_seq]).to(torch.int32)
    return QueryTiles(tiles, parts, positions.to(device, non_blocking=True), tiles.to(device, non_blocking=True))


class _LastStep:
    """The query tiles of the last call, reused while the same layout tensors come back unchanged.

    A model calls the attention once per layer with the same `query_start_loc` and `seq_lens`
    objects; reading them on the host once per step instead of once per layer saves a device
    sync per layer. A hit needs the very same live tensor objects at the same version counters
    (an in-place write bumps it), so a stale layout cannot be reused.
    """

    def __init__(self) -> None:
        self._key: tuple[object, ...] | None = None
        self._refs: tuple[weakref.ref[torch.Tensor], ...] = ()
        self._tiles: QueryTiles | None = None

    @staticmethod
    def _versions(tensors: Sequence[torch.Tensor]) -> tuple[int, ...] | None:
        try:
            return tuple(t._version for t in tensors)
        except RuntimeError:  # inference tensors keep no version counter: never reuse them
            return None

    def get(self, tensors: Sequence[torch.Tensor], params: tuple[int, ...]) -> QueryTiles | None:
        versions = self._versions(tensors)
        if versions is None or self._key != (*versions, *params):
            return None
        if len(self._refs) != len(tensors) or any(r() is not t for r, t in zip(self._refs, tensors, strict=True)):
            return None
        return self._tiles

    def put(self, tensors: Sequence[torch.Tensor], params: tuple[int, ...], tiles: QueryTiles) -> None:
        versions = self._versions(tensors)
        self._key = None if versions is None else (*versions, *params)
        self._refs = tuple(weakref.ref(t) for t in tensors)
        self._tiles = tiles


_LAST_STEP = _LastStep()


def _cached_query_tiles(
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, num_tokens: int, tokens_per_tile: int, partition: int,
) -> QueryTiles:
    layout = (query_start_loc, seq_lens)
    params = (num_tokens, tokens_per_tile, partition)
    tiles = _LAST_STEP.get(layout, params)
    if tiles is None:
        tiles = query_tiles(query_start_loc, seq_lens, num_tokens, tokens_per_tile, partition)
        _LAST_STEP.put(layout, params, tiles)
    return tiles


def decode_query_tiles(seq_lens: torch.Tensor, num_tokens: int) -> QueryTiles:
    """The tiles of a decode step (token b is sequence b's one query), built on the device.

    No host read, so it can be captured in a CUDA graph; the tiles are exactly those
    `query_tiles` cuts for the same step (one tile per sequence), so the kernels see the same work.
    """
    num_seqs = seq_lens.shape[0]
    if num_tokens != num_seqs:
        raise ValueError(f"paged_attention: a captured step must be a decode step (T={num_tokens}, B={num_seqs})")
    device = seq_lens.device
    positions = seq_lens.to(torch.int32) - 1  # [B]
    index = torch.arange(num_seqs, dtype=torch.int32, device=device)
    tiles = torch.stack([index, index, torch.ones_like(index), positions], dim=1)  # [B, 4]
    return QueryTiles(tiles, torch.empty(0, dtype=torch.int64), positions, tiles)


def _tile_groups(tiles: torch.Tensor, parts: torch.Tensor, row_floats: int) -> list[tuple[int, int]]:
    """Consecutive tile ranges [lo, hi) whose scratch (tokens x parts x row_floats fp32) fits the budget."""
    budget = max(1, ATTENTION_WORKSPACE_BYTES // 4)
    groups: list[tuple[int, int]] = []
    lo, tokens, most_parts = 0, 0, 0
    counts, part_list = tiles[:, 2].tolist(), parts.tolist()
    for i, (count, need) in enumerate(zip(counts, part_list, strict=True)):
        grown_tokens, grown_parts = tokens + count, max(most_parts, need)
        if i > lo and grown_tokens * grown_parts * row_floats > budget:
            groups.append((lo, i))
            lo, grown_tokens, grown_parts = i, count, need
        tokens, most_parts = grown_tokens, grown_parts
    if len(counts) > lo:
        groups.append((lo, len(counts)))
    return groups


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    tiles: AttentionTiles | None = None,
    partition: int | None = None,
) -> torch.Tensor:
    """Paged attention -> [T, Hq, D] in q's dtype, bitwise independent of the batch and of prefill/decode.

    `tiles` replaces the dtype's fixed shapes (tests). `partition` replaces the fixed partition
    size: the benchmark uses it to time a batch-sized split like the production path's; any value
    other than the fixed one gives up the prefill/decode equality.
    """
    shape = check_attention_inputs(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc)
    if q.dtype != k_cache.dtype:
        raise RuntimeError(f"paged_attention: q is {q.dtype} but the cache is {k_cache.dtype}")
    t = tiles if tiles is not None else attention_tiles(q.dtype)
    part_len = partition if partition is not None else t.partition
    if part_len % t.chunk:
        raise ValueError(f"paged_attention: partition {part_len} is not a multiple of the chunk {t.chunk}")
    out = torch.zeros_like(q)
    if q.shape[0] == 0 or shape.num_seqs == 0:
        return out
    # Last dims must be unit-stride: rows are read as contiguous head vectors.
    q, k_cache, v_cache = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k_cache, v_cache))
    group = shape.group
    group_pad = triton.next_power_of_2(group)
    rows = max(t.rows, group_pad)
    block_d = max(16, triton.next_power_of_2(shape.head_dim))
    table = block_tables.to(torch.int32)
    row_floats = shape.num_heads * (shape.head_dim + 2)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    if q.is_cuda and torch.cuda.is_current_stream_capturing():
        # A CUDA graph of a decode step: tiles built on the device and as many partitions as the
        # block table can hold; a partition past a token's position does no work, so the bits are
        # those of the eager call.
        qt = decode_query_tiles(seq_lens, shape.num_tokens)
        capacity = block_tables.shape[1] * shape.block_size
        groups = [(0, shape.num_tokens, 0, shape.num_tokens, max(1, -(-capacity // part_len)))]
    else:
        qt = _cached_query_tiles(query_start_loc, seq_lens, shape.num_tokens, rows // group_pad, part_len)
        if qt.tiles.shape[0] == 0:
            return out
        groups = [
            (lo, hi, int(qt.tiles[lo, 1]), int(qt.tiles[hi - 1, 1] + qt.tiles[hi - 1, 2]), int(qt.parts[lo:hi].max()))
            for lo, hi in _tile_groups(qt.tiles, qt.parts, row_floats)
        ]
    for lo, hi, token_lo, token_hi, num_parts in groups:
        tokens = token_hi - token_lo
        part_acc = torch.empty((tokens, shape.num_heads, num_parts, shape.head_dim), dtype=torch.float32,
                               device=q.device)
        part_stats = torch.empty((tokens, shape.num_heads, num_parts, 2), dtype=torch.float32, device=q.device)
        partition_kernel[(hi - lo, shape.num_kv_heads, num_parts)](
            q, k_cache, v_cache, table, qt.tiles_device[lo:hi], part_acc, part_stats,
            token_lo, num_parts, scale, part_len, shape.block_size,
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), table.stride(0),
            HEAD_DIM=shape.head_dim, BLOCK_D=block_d, GROUP=group, GROUP_PAD=group_pad, ROWS=rows,
            CHUNK=t.chunk, INPUT_PRECISION=precision, num_warps=t.num_warps, num_stages=t.num_stages,
        )
        merge_kernel[(tokens,)](
            part_acc, part_stats, qt.positions, out, token_lo, num_parts, part_len, out.stride(0), out.stride(1),
            NUM_HEADS=shape.num_heads, BLOCK_H=triton.next_power_of_2(shape.num_heads), HEAD_DIM=shape.head_dim,
            BLOCK_D=block_d, num_warps=t.num_warps,
        )
    return out


def production_partition(block_tables: torch.Tensor, block_size: int, num_kv_splits: int, chunk: int) -> int:
    """The production path's partition: the block table's capacity cut into `num_kv_splits` parts.

    Like a split-KV decode kernel, the split follows the batch (the engine picks `num_kv_splits`
    from the batch size, and the table's width is the batch's longest sequence), so the order of
    the final merge, and with it the bits, depend on the batch.
    """
    capacity = max(1, block_tables.shape[1] * block_size)
    per_split = -(-capacity // max(1, num_kv_splits))
    return chunk * max(1, -(-per_split // chunk))


def production_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    num_kv_splits: int,
) -> torch.Tensor:
    """oracle_kernels::paged_attention's production path on CUDA: the kernels with a batch-sized partition."""
    tiles = attention_tiles(q.dtype)
    partition = production_partition(block_tables, k_cache.shape[1], num_kv_splits, tiles.chunk)
    return paged_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, partition=partition)
