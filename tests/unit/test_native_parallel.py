"""Megatron-style shards of the native decoder and the all-reduce's fixed order (no ranks started)."""

from __future__ import annotations

import torch

from oracle.engines.native.model import ModelConfig
from oracle.engines.native.parallel import Reducer, divisibility_problem, shard

CONFIG = ModelConfig(architecture="llama", vocab_size=32, hidden_size=16, intermediate_size=24, num_layers=1,
                     num_heads=4, num_kv_heads=2, head_dim=4, rms_norm_eps=1e-6, rope_theta=1e4,
                     max_position_embeddings=64, tie_word_embeddings=True, attention_bias=True)


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    p = "model.layers.0."
    shapes = {"model.embed_tokens.weight": (32, 16), "model.norm.weight": (16,),
              p + "self_attn.q_proj.weight": (16, 16), p + "self_attn.q_proj.bias": (16,),
              p + "self_attn.k_proj.weight": (8, 16), p + "self_attn.v_proj.weight": (8, 16),
              p + "self_attn.o_proj.weight": (16, 16), p + "self_attn.o_proj.bias": (16,),
              p + "mlp.gate_proj.weight": (24, 16), p + "mlp.up_proj.weight": (24, 16),
              p + "mlp.down_proj.weight": (16, 24), p + "input_layernorm.weight": (16,)}
    return {k: torch.randn(s, generator=g) for k, s in shapes.items()}


def test_shards_put_back_together_are_the_weights() -> None:
    w = _weights()
    parts = [shard(CONFIG, w, r, 2) for r in range(2)]
    config = parts[0][0]
    assert (config.num_heads, config.num_kv_heads, config.intermediate_size) == (2, 1, 12)
    p = "model.layers.0."
    for name in ("self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight",
                 "mlp.gate_proj.weight", "mlp.up_proj.weight"):
        assert torch.equal(torch.cat([s[1][p + name] for s in parts], 0), w[p + name])
    for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
        assert torch.equal(torch.cat([s[1][p + name] for s in parts], 1), w[p + name])
    # A row-parallel bias is added once: rank 0 holds it. Replicated tensors are the same in every rank.
    assert p + "self_attn.o_proj.bias" in parts[0][1] and p + "self_attn.o_proj.bias" not in parts[1][1]
    assert all(torch.equal(s[1]["model.embed_tokens.weight"], w["model.embed_tokens.weight"]) for s in parts)


def test_a_size_that_does_not_divide_names_what() -> None:
    assert divisibility_problem(CONFIG, 2) is None
    assert divisibility_problem(CONFIG, 4) == "tensor_parallel_size 4 does not divide the model's kv heads (2)"
    assert divisibility_problem(CONFIG, 3) == "tensor_parallel_size 3 does not divide the model's attention heads (4)"


def test_the_reduction_adds_the_partials_in_rank_order_then_the_residual() -> None:
    parts = [torch.tensor([1e8, 1.0]), torch.tensor([-1e8, 1.0]), torch.tensor([1.0, 3.0])]
    residual = torch.tensor([0.5, 0.0])
    out = Reducer().reduce(parts, residual, "model.layers.0.mlp.down_proj", rank=2)
    assert torch.equal(out, residual + ((parts[0] + parts[1]) + parts[2]))
    # The same bits whichever rank asks: every rank holds the same sum.
    assert torch.equal(out, Reducer().reduce(parts, residual, "model.layers.0.mlp.down_proj", rank=0))
