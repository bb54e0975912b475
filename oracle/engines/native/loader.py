"""Load an HF-format checkpoint (config.json + safetensors) into a `Decoder`."""

from __future__ import annotations

from pathlib import Path

import torch

from oracle.engines.native.model import Decoder, ModelConfig
from oracle.errors import ModelError
from oracle.models.architectures import native_architecture, read_config_json, rope_theta

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def read_model_config(model_dir: Path) -> ModelConfig:
    """Parse `model_dir/config.json`; raises ModelError naming the file when it is missing or unsupported."""
    arch = native_architecture(model_dir)
    raw = read_config_json(model_dir)
    heads = int(raw["num_attention_heads"])
    eos = raw.get("eos_token_id")
    return ModelConfig(
        architecture=arch,
        vocab_size=int(raw["vocab_size"]),
        hidden_size=int(raw["hidden_size"]),
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=int(raw["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads", heads)),
        head_dim=int(raw.get("head_dim") or raw["hidden_size"] // heads),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta(raw),
        max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=arch == "qwen2" or bool(raw.get("attention_bias", False)),
        eos_token_id=eos if isinstance(eos, int) else (eos[0] if eos else None),
    )


def load_decoder(model_dir: Path, dtype: torch.dtype, device: torch.device) -> Decoder:
    """Read config and weights; every tensor is cast to `dtype` and moved to `device`."""
    from safetensors.torch import load_file

    config = read_model_config(model_dir)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{model_dir}: no *.safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        for name, t in load_file(str(f), device="cpu").items():
            weights[name] = t.to(dtype=dtype, device=device)
    missing = [n for n in _required_names(config) if n not in weights]
    if missing:
        raise ModelError(f"{model_dir}: weights lack {len(missing)} tensors, e.g. {missing[0]}")
    return Decoder(config, weights)


def _required_names(c: ModelConfig) -> list[str]:
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not c.tie_word_embeddings:
        names.append("lm_head.weight")
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        names += [p + s for s in (
            "input_layernorm.weight", "post_attention_layernorm.weight",
            "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
            "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
        )]
        if c.architecture == "qwen3":
            names += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
        if c.attention_bias:  # Qwen2: q, k, v; Llama with attention_bias: o too (checked only where given)
            names += [p + f"self_attn.{x}_proj.bias" for x in "qkv"]
    return names
