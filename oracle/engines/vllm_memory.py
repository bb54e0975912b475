"""A vLLM engine's KV cache sized from its config, for two engines that start on one GPU at once.

vLLM sizes its KV cache from the GPU memory it sees free while it starts: a second engine starting beside it
changes what it sees, so each would count the other's allocations as its own (too small a cache, or none). With
`kv_cache_memory_bytes` set, vLLM skips that measurement. `fixed_kv_cache_bytes` gives the size: enough for
`max_num_seqs` sequences of `max_model_len` tokens, at most `SHARE` of the GPU less the engine's weights and a
margin, at least one sequence of `max_model_len` tokens (vLLM refuses a cache that cannot hold one). Counted in
whole blocks of `block_size` tokens per sequence, plus the one block vLLM keeps back (its null block).

Imports nothing heavy: the worker calls it with the GPU's total memory, the tests with numbers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SHARE = 0.4  # of the GPU's memory, for one of two engines: weights, activations and KV cache together
MARGIN = 1 << 30  # activations, CUDA context and what vLLM keeps outside its pool
_WEIGHTS = ("*.safetensors", "*.bin", "*.pt")

# The GPU share each vLLM engine takes where its KV cache is given (start_together, kv_cache_memory_bytes): vLLM
# then reads it only to check the free memory as it starts.
FIXED_KV_GPU_MEMORY_UTILIZATION = 0.1


def _text_config(model_dir: Path) -> dict[str, Any]:
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def kv_bytes_per_token(model_dir: Path, dtype: str, tensor_parallel_size: int = 1) -> int:
    """Bytes one token's keys and values take in one rank's cache: layers x 2 x its KV heads x head size x the
    element size (4 for float32, else 2; `auto`: the checkpoint's dtype)."""
    c = _text_config(model_dir)
    if dtype == "auto":
        dtype = str(c.get("torch_dtype") or c.get("dtype") or "bfloat16")
    dtype = dtype.removeprefix("torch.")
    heads = int(c["num_attention_heads"])
    kv_heads = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
    element = 4 if dtype in ("float32", "float") else 2
    rank_kv_heads = -(-kv_heads // max(1, tensor_parallel_size))  # at least one head per rank
    return int(c["num_hidden_layers"]) * 2 * rank_kv_heads * head_dim * element


def weight_bytes(model_dir: Path, tensor_parallel_size: int = 1) -> int:
    """The checkpoint's weight files, one rank's share."""
    total = sum(f.stat().st_size for pattern in _WEIGHTS for f in model_dir.glob(pattern))
    return total // max(1, tensor_parallel_size)


def fixed_kv_cache_bytes(model_dir: Path, dtype: str, max_num_seqs: int, max_model_len: int | None,
                         gpu_total_bytes: int, tensor_parallel_size: int = 1, block_size: int = 16) -> int:
    """The KV cache of one of two engines on one GPU (the module docstring says how it is chosen)."""
    length = max_model_len or int(_text_config(model_dir).get("max_position_embeddings") or 4096)
    block = block_size * kv_bytes_per_token(model_dir, dtype, tensor_parallel_size)
    per_seq = -(-length // block_size)  # blocks
    wanted = (max_num_seqs * per_seq + 1) * block
    room = (int(gpu_total_bytes * SHARE) - weight_bytes(model_dir, tensor_parallel_size) - MARGIN) // block * block
    return max((per_seq + 1) * block, min(wanted, room))
