"""The tensors of a checkpoint: Hugging Face names, shapes and roles, in file order.

No torch here: the layout is pure data, so the safetensors header can be written (and a
preset's size computed) before any weight exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Literal, Protocol

TensorRole = Literal["embedding", "linear", "norm", "final_norm", "lm_head"]


class Shape(Protocol):
    """The dims the layout needs, in Hugging Face config terms: a `ModelPreset` (oracle.models.presets) is one;
    the layout reads nothing else of it, so it does not import the presets (which compute their size from it)."""

    @property
    def architecture(self) -> str: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def intermediate_size(self) -> int: ...
    @property
    def num_hidden_layers(self) -> int: ...
    @property
    def num_attention_heads(self) -> int: ...
    @property
    def num_key_value_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def tie_word_embeddings(self) -> bool: ...


@dataclass(frozen=True)
class TensorSpec:
    """One stored tensor. For `linear`, shape is [out_features, in_features] as nn.Linear keeps it."""

    name: str
    shape: tuple[int, ...]
    role: TensorRole

    @property
    def numel(self) -> int:
        return prod(self.shape)


def tensor_layout(preset: Shape) -> list[TensorSpec]:
    """Every tensor `{Qwen3,Llama}ForCausalLM` loads, in the order written to model.safetensors.

    A tied lm_head is absent: transformers and vLLM reuse embed_tokens for it.
    """
    h = preset.hidden_size
    q_dim = preset.num_attention_heads * preset.head_dim
    kv_dim = preset.num_key_value_heads * preset.head_dim
    specs = [TensorSpec("model.embed_tokens.weight", (preset.vocab_size, h), "embedding")]
    for i in range(preset.num_hidden_layers):
        layer = f"model.layers.{i}"
        specs += [
            TensorSpec(f"{layer}.self_attn.q_proj.weight", (q_dim, h), "linear"),
            TensorSpec(f"{layer}.self_attn.k_proj.weight", (kv_dim, h), "linear"),
            TensorSpec(f"{layer}.self_attn.v_proj.weight", (kv_dim, h), "linear"),
            TensorSpec(f"{layer}.self_attn.o_proj.weight", (h, q_dim), "linear"),
        ]
        if preset.architecture == "qwen3":
            # Qwen3 RMS-normalizes each head's query and key before rotary embedding.
            specs += [
                TensorSpec(f"{layer}.self_attn.q_norm.weight", (preset.head_dim,), "norm"),
                TensorSpec(f"{layer}.self_attn.k_norm.weight", (preset.head_dim,), "norm"),
            ]
        specs += [
            TensorSpec(f"{layer}.mlp.gate_proj.weight", (preset.intermediate_size, h), "linear"),
            TensorSpec(f"{layer}.mlp.up_proj.weight", (preset.intermediate_size, h), "linear"),
            TensorSpec(f"{layer}.mlp.down_proj.weight", (h, preset.intermediate_size), "linear"),
            TensorSpec(f"{layer}.input_layernorm.weight", (h,), "norm"),
            TensorSpec(f"{layer}.post_attention_layernorm.weight", (h,), "norm"),
        ]
    specs.append(TensorSpec("model.norm.weight", (h,), "final_norm"))
    if not preset.tie_word_embeddings:
        specs.append(TensorSpec("lm_head.weight", (preset.vocab_size, h), "lm_head"))
    return specs
