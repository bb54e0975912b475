"""Per-op capture of the native engine (oracle.capture): its passes as the capture sees them (the engine's
`capture` runs them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from oracle.capture.rows import Grid, PassLayout

if TYPE_CHECKING:
    from oracle.engines.native.model import StepInputs
    from oracle.engines.native.scheduler import ScheduledSeq


def native_layout(forward_pass: int, step: int, batch: list[ScheduledSeq], inputs: StepInputs,
                  target_index: int, block_size: int) -> PassLayout | None:
    """The target's rows in a native pass: token rows from query_start_loc, its logits row, its KV, the evidence."""
    slot = next((j for j, item in enumerate(batch) if item.seq.index == target_index), None)
    if slot is None:
        return None
    item = batch[slot]
    qsl = inputs.query_start_loc.tolist()
    start = item.seq.num_computed_tokens
    n = item.num_new_tokens
    num_tokens = int(inputs.input_ids.shape[0])
    tokens = Grid((num_tokens,), tuple((qsl[slot] + k,) for k in range(n)), tuple(range(start, start + n)))
    grids = [tokens]
    if item.completes:
        row = sum(1 for it in batch[:slot] if it.completes)
        num_rows = int(inputs.logits_indices.shape[0])
        if num_rows != num_tokens:
            grids.append(Grid((num_rows,), ((row,),), (start + n - 1,)))
    prefill = [it for it in batch if it.is_prefill]
    evidence = {
        "num_seqs": len(batch), "num_tokens": num_tokens,
        "num_prefill_tokens": sum(it.num_new_tokens for it in prefill),
        "num_decode_tokens": sum(it.num_new_tokens for it in batch if not it.is_prefill),
        "target_slot": slot, "target_num_tokens": n, "target_is_prefill": item.is_prefill,
        "target_chunked": item.is_prefill and (item.seq.num_prefill_passes > 0 or not item.completes),
        "target_kv_len": start + n, "max_kv_len": int(inputs.seq_lens.max().item()),
        "num_kv_splits": inputs.num_kv_splits,
    }
    return PassLayout(forward_pass, step, tuple(grids), evidence, seq_index=slot, kv_len=start + n,
                      block_size=block_size)
