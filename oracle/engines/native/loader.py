"""Load an HF-format checkpoint (config.json + safetensors) into a `Decoder`."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from oracle.engines.native.model import Decoder, ModelConfig
from oracle.errors import ModelError
from oracle.models.architectures import native_architecture, rope_theta
from oracle.models.facts import read_model_facts
from oracle.models.safetensors_file import FLOAT_DTYPES, read_header

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def read_model_config(model_dir: Path) -> ModelConfig:
    """Parse `model_dir/config.json`; raises ModelError naming the file when it is missing or unsupported."""
    facts = read_model_facts(model_dir)
    arch = native_architecture(facts)
    raw = facts.config_json()
    path = facts.path

    def positive(key: str, default: int | None = None) -> int:
        value = raw.get(key, default)
        if value is None:
            raise ModelError(f"{path}: {key} missing")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelError(f"{path}: {key} must be a positive integer, got {value!r}")
        return value

    def number(key: str, default: float) -> float:
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ModelError(f"{path}: {key} must be a positive number, got {value!r}")
        return float(value)

    heads = positive("num_attention_heads")
    hidden = positive("hidden_size")
    eos = raw.get("eos_token_id")
    return ModelConfig(
        architecture=arch,
        vocab_size=positive("vocab_size"),
        hidden_size=hidden,
        intermediate_size=positive("intermediate_size"),
        num_layers=positive("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=positive("num_key_value_heads", heads),
        head_dim=positive("head_dim", None) if raw.get("head_dim") else max(1, hidden // heads),
        rms_norm_eps=number("rms_norm_eps", 1e-6),
        rope_theta=rope_theta(raw),
        max_position_embeddings=positive("max_position_embeddings", 4096),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=arch == "qwen2" or bool(raw.get("attention_bias", False)),
        eos_token_id=eos if isinstance(eos, int) else (eos[0] if isinstance(eos, list) and eos else None),
    )


def load_decoder(model_dir: Path, dtype: torch.dtype, device: torch.device) -> Decoder:
    """Read config and weights; every tensor is cast to `dtype` and moved to `device`."""

    config = read_model_config(model_dir)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{model_dir}: no *.safetensors weights")
    expected = expected_shapes(config)
    known = {**optional_shapes(config), **expected}
    where: dict[str, Path] = {}
    for f in files:
        for name, info in read_header(f).items():
            where[name] = f
            shape = known.get(name)
            if shape is None:
                continue
            if info["shape"] != shape:
                raise ModelError(f"{f}: tensor {name} has shape {list(info['shape'])}, config.json needs "
                                 f"{list(shape)}")
            if info["dtype"] not in FLOAT_DTYPES:
                raise ModelError(f"{f}: tensor {name} has dtype {info['dtype']}, not a float type "
                                 f"({', '.join(FLOAT_DTYPES)})")
    missing = [n for n in expected if n not in where]
    if missing:
        raise ModelError(f"{model_dir}: weights lack {len(missing)} tensors, e.g. {missing[0]}")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        tensors = _read_tensors(f, dtype, device)
        problem = nonfinite_weights(tensors.items())
        if problem is not None:
            raise ModelError(f"{f}: {problem}")
        weights.update(tensors)
    return Decoder(config, weights)


def nonfinite_weights(tensors: Iterable[tuple[str, torch.Tensor]]) -> str | None:
    """The first tensor holding NaN or Inf (as loaded, after the cast to the engine's dtype), described.

    A model with such weights computes NaN logits, and two NaN runs are bitwise equal: it must be
    refused, never judged. A cast can make Inf too (a float32 value beyond float16's range).
    """
    for name, t in tensors:
        if not t.is_floating_point():
            continue
        bad = ~torch.isfinite(t)
        if bool(bad.any()):
            nan = int(torch.isnan(t).sum())
            return (f"tensor {name} holds {int(bad.sum())} non-finite values ({nan} NaN, the rest Inf) as "
                    f"{str(t.dtype).removeprefix('torch.')}: the checkpoint is broken (or overflows this dtype)")
    return None


def _read_tensors(path: Path, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """Every tensor of one file, cast and moved; ModelError naming the file and tensor on a failure."""
    from safetensors import safe_open

    out: dict[str, torch.Tensor] = {}
    name = None
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                out[name] = f.get_tensor(name).to(dtype=dtype, device=device)
    except Exception as e:  # noqa: BLE001 - the library raises its own error types for corrupt files
        what = f"tensor {name}" if name is not None else "file"
        raise ModelError(f"{path}: {what} unreadable ({type(e).__name__}: {e})") from e
    return out


def expected_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the decoder needs and its shape, from config.json."""
    h, q, kv, i = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
    shapes = {"model.embed_tokens.weight": (c.vocab_size, h), "model.norm.weight": (h,)}
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, h)
    for n in range(c.num_layers):
        p = f"model.layers.{n}."
        shapes.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h), p + "mlp.down_proj.weight": (h, i),
        })
        if c.architecture == "qwen3":
            shapes.update({p + "self_attn.q_norm.weight": (c.head_dim,), p + "self_attn.k_norm.weight": (c.head_dim,)})
        if c.architecture == "qwen2":  # Qwen2 always has q, k, v biases
            shapes.update({p + f"self_attn.{x}_proj.bias": (n,) for x, n in (("q", q), ("k", kv), ("v", kv))})
    return shapes


def optional_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Tensors the decoder uses when present (attention biases), and their shapes."""
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    return {f"model.layers.{n}.self_attn.{proj}.bias": (size,) for n in range(c.num_layers)
            for proj, size in (("q_proj", q), ("k_proj", kv), ("v_proj", kv))}
