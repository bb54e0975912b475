"""How many bytes a model needs, from config.json alone, so that absurd dimensions are refused before
anything is allocated.

A config.json with `num_hidden_layers: 1e9` would otherwise have an engine build shapes and
tensors layer by layer for hours. The estimate is a lower bound, in the engine's dtype:

    weights   embeddings (vocab_size x hidden_size, twice unless the lm_head is tied) + per layer
              q/k/v/o projections (hidden_size x heads x head_dim) and the MLP (2 or 3 matrices of
              hidden_size x intermediate_size, times the experts of a mixture) + norms
    KV cache  2 (K and V) x layers x num_key_value_heads x head_dim per token, times the tokens
              the engine holds at once (the caller says how many)

No torch, no weights: pure arithmetic on config.json, so it is instant whatever the numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oracle.errors import ModelError

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Each dimension under the names Hugging Face configs use for it, most common first.
DIM_KEYS: dict[str, tuple[str, ...]] = {
    "vocab_size": ("vocab_size", "n_vocab", "padded_vocab_size"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "num_key_value_heads": ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num"),
    "head_dim": ("head_dim",),
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "moe_intermediate_size": ("moe_intermediate_size",),
}
# About the largest value of each dimension among published models: a value far beyond its bound is
# the field a message blames first.
REAL_MAX = {
    "vocab_size": 262_144, "hidden_size": 18_432, "num_hidden_layers": 128, "intermediate_size": 73_728,
    "num_attention_heads": 128, "num_key_value_heads": 128, "head_dim": 512, "num_experts": 512,
    "moe_intermediate_size": 32_768,
}
GATED_MLP_ACTS = ("silu", "swiglu", "swish")  # SiLU-gated MLPs have three matrices, others two
OPTIONAL_DIMS = ("head_dim", "num_experts", "moe_intermediate_size")  # 0 there means "none" (dense models)


@dataclass(frozen=True)
class ModelDims:
    """The dimensions of config.json an estimate needs (None: absent)."""

    values: dict[str, int]  # canonical name -> value, for the names present
    keys: dict[str, str]  # canonical name -> the key config.json spells it with
    tie_word_embeddings: bool
    gated_mlp: bool

    def get(self, name: str) -> int | None:
        return self.values.get(name)


@dataclass(frozen=True)
class SizeEstimate:
    """A lower bound of the bytes one engine holds: its weights and its KV cache, in `dtype`."""

    weights_bytes: int
    kv_bytes: int
    kv_tokens: int
    dtype: str
    blame: str  # the config.json key furthest beyond real models ("" when none is)
    blame_value: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes


def human_bytes(n: float) -> str:
    """1.5 GB, 7.3 PB: decimal units, three significant digits."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB", "EB"):
        if abs(n) < 1000 or unit == "EB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.3g} EB"  # pragma: no cover - the loop returns


def _dimension(raw: dict[str, Any], key: str, path: Path, least: int) -> int:
    """A dimension's value: an integer >= `least` (an integral float such as 1e9 is taken at its value)."""
    value = raw[key]
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        what = "a positive integer" if least == 1 else f"an integer >= {least}"
        raise ModelError(f"{path}: {key}: must be {what} (got {value!r})")
    return value


def _read_dim(sources: list[dict[str, Any]], name: str, path: Path) -> tuple[str, int] | None:
    """Dimension `name` as the first source that spells it gives it, with that spelling; None when no source
    does, or gives an optional dimension as 0."""
    for source in sources:
        key = next((k for k in DIM_KEYS[name] if source.get(k) is not None), None)
        if key is not None:
            value = _dimension(source, key, path, 0 if name in OPTIONAL_DIMS else 1)
            return (key, value) if value else None
    return None


def read_dims(raw: dict[str, Any], path: Path) -> ModelDims:
    """The dimensions of a parsed config.json (a multimodal model's `text_config` fills in what the top
    level lacks); ModelError naming the file and key for a value that is not a positive integer."""
    sources = [raw]
    text = raw.get("text_config")
    if isinstance(text, dict):
        sources.append(text)
    values: dict[str, int] = {}
    keys: dict[str, str] = {}
    for name in DIM_KEYS:
        found = _read_dim(sources, name, path)
        if found is not None:
            keys[name], values[name] = found
    tie = raw.get("tie_word_embeddings", True) is not False  # only an explicit false adds an lm_head
    act = str(raw.get("hidden_act") or raw.get("activation_function") or "")
    return ModelDims(values, keys, tie, act in GATED_MLP_ACTS)


def _attention_widths(d: ModelDims, h: int) -> tuple[int, int]:
    """The widths of the queries (heads x head_dim) and of K or of V (KV heads x head_dim); `h` where the
    heads are not given."""
    heads = d.get("num_attention_heads")
    head_dim = d.get("head_dim") or (max(1, h // heads) if heads else None)
    q_dim = heads * head_dim if heads and head_dim else h
    kv_dim = (d.get("num_key_value_heads") or heads or 0) * head_dim if head_dim else h
    return q_dim, kv_dim


def _mlp_params(d: ModelDims, h: int) -> int:
    """One layer's MLP: 2 or 3 matrices of hidden x intermediate, per expert of a mixture."""
    mlp_mats = 3 if d.gated_mlp else 2
    experts = d.get("num_experts") or 1
    inter = d.get("moe_intermediate_size") if experts > 1 and d.get("moe_intermediate_size") else None
    return mlp_mats * h * (inter or d.get("intermediate_size") or 4 * h) * experts  # GPT-2's n_inner: null is 4h


def weight_params(d: ModelDims) -> int | None:
    """A lower bound of the parameter count; None when config.json lacks a dimension it needs."""
    vocab, h, layers = d.get("vocab_size"), d.get("hidden_size"), d.get("num_hidden_layers")
    if vocab is None or h is None or layers is None:
        return None
    q_dim, kv_dim = _attention_widths(d, h)
    per_layer = 2 * h * q_dim + 2 * h * kv_dim + _mlp_params(d, h) + 2 * h  # q, o; k, v; MLP; two norms
    embeddings = vocab * h * (1 if d.tie_word_embeddings else 2)
    return embeddings + layers * per_layer + h


def kv_bytes_per_token(d: ModelDims, dtype: str) -> int:
    """K and V of every layer for one token; 0 when config.json lacks what it needs."""
    h, layers, heads = d.get("hidden_size"), d.get("num_hidden_layers"), d.get("num_attention_heads")
    if h is None or layers is None:
        return 0
    head_dim = d.get("head_dim") or (max(1, h // heads) if heads else h)
    kv_heads = d.get("num_key_value_heads") or heads or 1
    return 2 * layers * kv_heads * head_dim * DTYPE_BYTES[dtype]


def estimate(d: ModelDims, dtype: str, kv_tokens: int = 0, kv_bytes: int | None = None) -> SizeEstimate | None:
    """Weights and KV cache of the model of dimensions `d` (`read_dims`) in `dtype`, holding `kv_tokens`
    tokens of KV cache (or exactly `kv_bytes`, for an engine with a fixed pool); None when it cannot be told."""
    params = weight_params(d)
    if params is None:
        return None
    kv = kv_bytes if kv_bytes is not None else kv_tokens * kv_bytes_per_token(d, dtype)
    ratios = {d.keys[n]: (v / REAL_MAX[n], v) for n, v in d.values.items() if v > REAL_MAX[n]}
    blame = max(ratios, key=lambda k: ratios[k][0]) if ratios else ""
    return SizeEstimate(params * DTYPE_BYTES[dtype], kv, kv_tokens, dtype, blame, ratios[blame][1] if blame else 0)


def check_fits(size: SizeEstimate, available: int, where: str, path: Path, kv_source: str) -> None:
    """ModelError, one line, when the estimate exceeds `available` bytes (`where`: "RAM available", ...).

    Blames the config.json key furthest beyond real models when there is one; else the KV cache
    (`kv_source` names the config fields that size it) when the weights alone would fit; else the model.
    """
    if size.total_bytes <= available:
        return
    kv = f" + {human_bytes(size.kv_bytes)} of KV cache" if size.kv_bytes else ""
    need = f"the weights need at least {human_bytes(size.weights_bytes)} in {size.dtype}{kv}"
    have = f"more than the {human_bytes(available)} of {where}"
    if size.blame:
        raise ModelError(f"{path}: {size.blame}: {size.blame_value:,} is beyond any real model: {need}, {have}; "
                         "refusing to load it (fix config.json)")
    if size.weights_bytes <= available:
        raise ModelError(f"{path}: the KV cache for {size.kv_tokens:,} tokens at once needs "
                         f"{human_bytes(size.kv_bytes)} ({need}), {have}; lower {kv_source}")
    raise ModelError(f"{path}: the model is too large for this machine: {need}, {have}; use a smaller model, "
                     "engine.dtype: bfloat16, or a device with more memory")
