"""Seeded weights: independent per tensor, the scales the init promises, and the file order."""

from __future__ import annotations

import math

import torch

from oracle.models import build_state_dict, get_preset, iter_weights
from oracle.models.layout import tensor_layout
from oracle.models.weights import LOGIT_STD, make_tensor, tensor_seed


def test_a_tensor_does_not_depend_on_the_tensors_made_before_it() -> None:
    preset = get_preset("tiny-llama")
    specs = {spec.name: spec for spec in tensor_layout(preset)}
    alone = make_tensor(preset, specs["model.layers.1.mlp.up_proj.weight"], seed=9)
    assert torch.equal(alone, build_state_dict(preset, seed=9)["model.layers.1.mlp.up_proj.weight"])


def test_iteration_follows_the_layout_order() -> None:
    preset = get_preset("tiny-qwen3")
    names = [name for name, _ in iter_weights(preset)]
    assert names == [spec.name for spec in tensor_layout(preset)]
    assert names[0] == "model.embed_tokens.weight" and names[-1] == "model.norm.weight"
    assert "lm_head.weight" not in names  # tied


def test_tensor_seeds_differ_by_name_and_seed_and_fit_a_generator() -> None:
    seeds = {tensor_seed(s, n) for s in (0, 1) for n in ("a", "b")}
    assert len(seeds) == 4
    assert all(0 <= s < 2**63 for s in seeds)
    assert tensor_seed(0, "a") == tensor_seed(0, "a")


def test_linear_weights_have_std_one_over_sqrt_fan_in() -> None:
    preset = get_preset("tiny-llama")
    down = build_state_dict(preset)["model.layers.0.mlp.down_proj.weight"]  # [64, 176]
    assert math.isclose(down.std().item(), 1 / math.sqrt(176), rel_tol=0.05)
    assert abs(down.mean().item()) < 0.01


def test_tied_embedding_sets_the_logit_scale() -> None:
    preset = get_preset("tiny-qwen3")
    embed = build_state_dict(preset)["model.embed_tokens.weight"]
    assert math.isclose(embed.std().item(), LOGIT_STD / math.sqrt(preset.hidden_size), rel_tol=0.05)


def test_norms_are_near_one_and_the_final_norm_has_both_signs() -> None:
    weights = build_state_dict(get_preset("tiny-qwen3"))
    layer_norm = weights["model.layers.0.input_layernorm.weight"]
    q_norm = weights["model.layers.1.self_attn.q_norm.weight"]
    assert layer_norm.min() > 0.5 and layer_norm.max() < 1.5 and not torch.all(layer_norm == 1)
    assert q_norm.min() > 0.5 and q_norm.max() < 1.5
    final = weights["model.norm.weight"]
    assert (final > 0).sum() > 10 and (final < 0).sum() > 10
    assert final.abs().min() > 0.5 and final.abs().max() < 1.5
