"""Batch-invariant paged attention for the CPU: fixed KV chunks, fixed problem shapes, ordered merge.

A query at position p attends to keys 0..p. We cut that range at absolute positions 0, S, 2S, ...
(S = kv_split) and reduce each chunk as a problem of one fixed shape: `rows` query rows that
share a sequence and a kv head, against the S keys of one chunk:

    scores [rows, S] = q [rows, D] @ k^T [D, S]           (torch's bmm, `problems` at a time)
    max = max(scores), p = exp(scores - max), total = sum(p)   (masked keys give p = 0 exactly)
    acc [rows, D] = p [rows, S] @ v [S, D]

and merge the chunks of each row in position order, chunk 0 first, by the usual rescaling
(flash-attention's online softmax).
Nothing in a row's arithmetic depends on the other rows, the batch, the number of queries or
whether the step is a prefill or a decode: the chunk boundaries are absolute, every reduction
runs on the same shape, and a chunk beyond a row's position leaves its state untouched (it is
selected away, not added as zero). A token's output is therefore bitwise the same in a full
prefill, in a chunked prefill and in decode. Everything is computed in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..attention import LayoutCache, check_attention_inputs
from ..config import ATTENTION_TILES, AttentionTiles

# --- kernel: one block of `problems` fixed-shape chunk problems --------------------------------


def chunk_kernel(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Softmax statistics of P problems; all sizes are the fixed `AttentionTiles`.

    q [P, R, D], k, v [P, S, D] float32 (zero where there is no key), allowed [P, R, S] bool.
    Returns (max [P, R], the largest allowed score or -inf if none; total [P, R] = sum of
    exp(score - max); acc [P, R, D] = sum of exp(score - max) * v), all float32.
    """
    problems, rows, head_dim = q.shape
    split = k.shape[1]
    # torch.bmm(out=) and torch.sum(out=) are aten::bmm.out and aten::sum.IntList_out, which enable() leaves alone.
    scores = torch.bmm(q, k.transpose(1, 2), out=q.new_empty(problems, rows, split))
    scores = torch.where(allowed, scores * scale, float("-inf"))
    row_max = scores.amax(dim=-1)  # a max is exact in any order
    shift = torch.where(row_max == float("-inf"), 0.0, row_max)  # no key: exp(-inf) = 0, not NaN
    p = torch.exp(scores - shift[..., None])
    total = torch.sum(p, [-1], False, out=q.new_empty(problems, rows))
    acc = torch.bmm(p, v, out=q.new_empty(problems, rows, head_dim))
    return row_max, total, acc


# --- launcher ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowTiles:
    """The query rows, grouped into tiles of `rows` rows of one (sequence, kv head).

    Row r of a group is token r // G of the sequence, query head kv_head * G + r % G. Padding rows
    (beyond the group's L * G rows) have valid = False.
    """

    token: torch.Tensor  # [n, rows] int64, index into q's T (0 where invalid)
    head: torch.Tensor  # [n, rows] int64, query head
    position: torch.Tensor  # [n, rows] int64, the query's absolute position
    valid: torch.Tensor  # [n, rows] bool
    seq: torch.Tensor  # [n] int64, the tile's sequence
    kv_head: torch.Tensor  # [n] int64, the tile's kv head
    num_chunks: torch.Tensor  # [n] int64, KV chunks its last row needs


def row_tiles(
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, num_kv_heads: int, group: int, tiles: AttentionTiles
) -> RowTiles:
    """Cut every (sequence, kv head)'s query rows into tiles, without a Python loop over sequences."""
    qsl = query_start_loc.long()
    context = seq_lens.long()
    q_lens = qsl[1:] - qsl[:-1]  # [B]
    group_rows = (q_lens * group).repeat_interleave(num_kv_heads)  # [B * Hkv], group = b * Hkv + g
    group_tiles = (group_rows + tiles.rows - 1) // tiles.rows
    num_tiles = int(group_tiles.sum())
    tile_group = torch.repeat_interleave(torch.arange(group_rows.shape[0]), group_tiles)  # [n]
    first_tile = torch.cumsum(group_tiles, 0) - group_tiles
    tile_in_group = torch.arange(num_tiles) - first_tile[tile_group]
    seq = tile_group // num_kv_heads
    kv_head = tile_group % num_kv_heads
    row = tile_in_group[:, None] * tiles.rows + torch.arange(tiles.rows)  # [n, rows], row within group
    valid = row < group_rows[tile_group][:, None]
    token_in_seq = row // group
    token = torch.where(valid, qsl[seq][:, None] + token_in_seq, 0)
    head = kv_head[:, None] * group + row % group
    position = (context[seq] - q_lens[seq])[:, None] + token_in_seq
    num_chunks = torch.where(valid, position // tiles.kv_split + 1, 0).amax(dim=-1)
    return RowTiles(token, head, position, valid, seq, kv_head, num_chunks)


@dataclass(frozen=True)
class ChunkProblems:
    """One KV chunk's problems for every tile that needs it, padded to whole blocks of `problems`.

    Problem i of block b is tile `groups[b][i]`; problems past a block's tiles are padding (no
    query row, no key), so every kernel call has the fixed shape.
    """

    groups: tuple[torch.Tensor, ...]  # per block: [A] int64 tile indices, A <= problems
    q_tile: torch.Tensor  # [P] int64, the tile each problem reads its queries from; n (a zero tile) for padding
    slot: torch.Tensor  # [P, S] int64 flat cache slots, 0 outside the context
    kv_head: torch.Tensor  # [P] int64
    in_context: torch.Tensor  # [P, S] bool, False for padding
    allowed: torch.Tensor  # [P, R, S] bool: keys at or before the row's position; none for padding rows


@dataclass(frozen=True)
class AttentionPlan:
    """What a pass's attention does that depends on the batch's layout alone (query_start_loc, seq_lens,
    block_tables), not on q or the cache: made once per forward pass, reused by every layer."""

    tiles: RowTiles
    chunks: tuple[ChunkProblems, ...]  # in position order
    out_token: torch.Tensor  # [V] int64: the valid rows' token ...
    out_head: torch.Tensor  # [V] int64: ... and query head
    valid_rows: torch.Tensor  # [V] int64: the valid rows' index into the flattened [n * R] tile rows


def _plan(
    block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor, block_size: int,
    num_kv_heads: int, group: int, tiles: AttentionTiles,
) -> AttentionPlan:
    t = row_tiles(query_start_loc, seq_lens, num_kv_heads, group, tiles)
    num_tiles = t.token.shape[0]
    context = seq_lens.long()
    offsets = torch.arange(tiles.kv_split)
    chunks = []
    # Chunks in position order; within a chunk, the tiles that need it, `problems` at a time.
    for chunk in range(int(t.num_chunks.max()) if num_tiles else 0):
        kv_pos = chunk * tiles.kv_split + offsets  # [S] absolute positions
        active = torch.nonzero(t.num_chunks > chunk).squeeze(1)  # [A_c]
        groups = tuple(active[start : start + tiles.problems] for start in range(0, active.shape[0], tiles.problems))
        padding = len(groups) * tiles.problems - active.shape[0]
        idx = torch.cat((active, active.new_full((padding,), num_tiles)))  # [P], num_tiles = padding
        real = idx < num_tiles
        seq = torch.where(real, t.seq[idx.clamp(max=num_tiles - 1)], 0)
        kv_head = torch.where(real, t.kv_head[idx.clamp(max=num_tiles - 1)], 0)
        in_context = (kv_pos[None, :] < context[seq][:, None]) & real[:, None]  # [P, S]
        rows = idx.clamp(max=num_tiles - 1)
        allowed = (kv_pos[None, None, :] <= t.position[rows][:, :, None]) & (t.valid[rows] & real[:, None])[:, :, None]
        slot = _chunk_slots(block_tables, block_size, seq, kv_pos, in_context)  # [P, S]
        chunks.append(ChunkProblems(groups, idx, slot, kv_head, in_context, allowed))
    valid_rows = torch.nonzero(t.valid.reshape(-1)).squeeze(1)
    return AttentionPlan(t, tuple(chunks), t.token.reshape(-1)[valid_rows], t.head.reshape(-1)[valid_rows], valid_rows)


_PLANS: LayoutCache[AttentionPlan] = LayoutCache()


def _chunk_slots(
    block_tables: torch.Tensor, block_size: int, seq: torch.Tensor, kv_pos: torch.Tensor, in_context: torch.Tensor
) -> torch.Tensor:
    # seq [A]; kv_pos [S] absolute positions; in_context [A, S]. Returns [A, S] flat cache slots,
    # 0 outside the context: block-table entries past a sequence's blocks may be anything.
    block_col = (kv_pos // block_size).clamp(max=block_tables.shape[1] - 1)  # [S]
    slot = block_tables[seq][:, block_col].long() * block_size + kv_pos % block_size
    return torch.where(in_context, slot, 0)


def _gather(cache: torch.Tensor, slot: torch.Tensor, kv_head: torch.Tensor, in_context: torch.Tensor) -> torch.Tensor:
    # cache [num_blocks, block_size, Hkv, D] -> [A, S, D] float32, zero outside the context so that
    # whatever unused slots hold (even NaN) never reaches the arithmetic.
    flat = cache.view(-1, *cache.shape[2:])  # [num_slots, Hkv, D]
    values = flat[slot, kv_head[:, None]].float()
    return torch.where(in_context[..., None], values, 0.0)


@dataclass
class RunningSoftmax:
    """The softmax state of every row, updated chunk by chunk in place.

    max [n, R]: the largest score so far; total [n, R]: sum of exp(score - max); acc [n, R, D]:
    sum of exp(score - max) * v. All float32.
    """

    max: torch.Tensor
    total: torch.Tensor
    acc: torch.Tensor

    @classmethod
    def empty(cls, num_tiles: int, rows: int, head_dim: int) -> RunningSoftmax:
        return cls(
            torch.full((num_tiles, rows), float("-inf")), torch.zeros(num_tiles, rows),
            torch.zeros(num_tiles, rows, head_dim),
        )

    def merge(self, idx: torch.Tensor | None, c_max: torch.Tensor, c_total: torch.Tensor, c_acc: torch.Tensor) -> None:
        """Fold one chunk's statistics (for tiles `idx`, [A, R] and [A, R, D]; None: every tile, in order)
        into the state.

        Rows the chunk gives no key (c_max = -inf) keep their state exactly: they are selected
        away, not rescaled by 1 and added to zero, so the extra chunks a prefill tile runs for
        its later rows leave its earlier rows bitwise as a decode would.
        """
        if idx is None:
            old_max, old_total, old_acc = self.max, self.total, self.acc
        else:
            old_max, old_total, old_acc = self.max[idx], self.total[idx], self.acc[idx]
        new_max = torch.maximum(old_max, c_max)
        ref = torch.where(new_max == float("-inf"), 0.0, new_max)
        old_scale, c_scale = torch.exp(old_max - ref), torch.exp(c_max - ref)
        new_total = old_total * old_scale + c_total * c_scale
        new_acc = old_acc * old_scale[..., None] + c_acc * c_scale[..., None]
        has_keys = c_max != float("-inf")
        merged = (torch.where(has_keys, new_max, old_max), torch.where(has_keys, new_total, old_total),
                  torch.where(has_keys[..., None], new_acc, old_acc))
        if idx is None:
            self.max, self.total, self.acc = merged
        else:
            self.max[idx], self.total[idx], self.acc[idx] = merged


def invariant_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    tiles: AttentionTiles = ATTENTION_TILES,
) -> torch.Tensor:
    """Paged attention -> [T, Hq, D] in q's dtype, bitwise independent of the batch and of prefill/decode."""
    shape = check_attention_inputs(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc)
    out = torch.zeros_like(q)
    plan = _PLANS.get((block_tables, seq_lens, query_start_loc), (shape.block_size, shape.num_kv_heads, shape.group, tiles),
                      lambda: _plan(block_tables, seq_lens, query_start_loc, shape.block_size, shape.num_kv_heads,
                                    shape.group, tiles))
    t = plan.tiles
    num_tiles = t.token.shape[0]
    if num_tiles == 0:
        return out
    # [n + 1, R, D]: the query rows of every tile, then a zero tile that padding problems read.
    q_rows = torch.where(t.valid[..., None], q[t.token, t.head].float(), 0.0)
    q_rows = torch.cat((q_rows, q_rows.new_zeros((1, *q_rows.shape[1:]))))
    state = RunningSoftmax.empty(num_tiles, tiles.rows, shape.head_dim)
    for c in plan.chunks:
        q_c = q_rows[c.q_tile]  # [P, R, D]
        k_c = _gather(k_cache, c.slot, c.kv_head, c.in_context)  # [P, S, D]
        v_c = _gather(v_cache, c.slot, c.kv_head, c.in_context)
        for b, idx in enumerate(c.groups):
            block = slice(b * tiles.problems, (b + 1) * tiles.problems)
            stats = chunk_kernel(q_c[block], k_c[block], v_c[block], c.allowed[block], scale)
            # A block of every tile (as a decode's first chunk often is) merges without indexing.
            state.merge(None if idx.shape[0] == num_tiles else idx, *(x[: idx.shape[0]] for x in stats))
    acc = state.acc.view(-1, shape.head_dim)[plan.valid_rows]  # [V, D]
    rows = acc / state.total.view(-1)[plan.valid_rows][:, None]
    out[plan.out_token, plan.out_head] = rows.to(q.dtype)
    return out


# --- adapter: the exact custom-op signature -------------------------------------------------------


def paged_attention_adapter(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    num_kv_splits: int,
) -> torch.Tensor:
    """oracle_kernels::paged_attention(...) on CPU; `num_kv_splits` is ignored: the split is fixed."""
    return invariant_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale)
