"""Preset table: lookup errors, validation, and the shapes the big preset must copy."""

from __future__ import annotations

import dataclasses

import pytest

from oracle.errors import ConfigError
from oracle.models import PRESETS, ModelPreset, get_preset


def test_every_preset_is_found_by_its_name() -> None:
    assert set(PRESETS) == {"tiny-qwen3", "tiny-llama", "small-qwen3", "qwen3-8b-shape"}
    for name, preset in PRESETS.items():
        assert get_preset(name) is preset
        assert preset.name == name


def test_unknown_preset_names_itself_and_the_known_ones() -> None:
    with pytest.raises(ConfigError) as info:
        get_preset("qwen9-huge")
    message = str(info.value)
    assert "qwen9-huge" in message
    for name in PRESETS:
        assert name in message


def test_qwen3_8b_shape_has_qwen3_8b_dimensions() -> None:
    p = get_preset("qwen3-8b-shape")
    assert (p.architecture, p.hidden_size, p.num_hidden_layers) == ("qwen3", 4096, 36)
    assert (p.num_attention_heads, p.num_key_value_heads, p.head_dim) == (32, 8, 128)
    assert (p.intermediate_size, p.vocab_size) == (12288, 151936)
    assert (p.rope_theta, p.max_position_embeddings, p.rms_norm_eps) == (1e6, 40960, 1e-6)
    assert (p.tie_word_embeddings, p.torch_dtype) == (False, "bfloat16")
    # Qwen3-8B's published parameter count (8.19B), counted here from the dims by hand:
    per_layer = 4096 * (4096 + 1024 + 1024) + 4096 * 4096 + 3 * 4096 * 12288 + 2 * 128 + 2 * 4096
    assert p.num_parameters == 2 * 151936 * 4096 + 36 * per_layer + 4096 == 8_190_735_360
    assert p.num_bytes == 2 * p.num_parameters


def test_tied_preset_does_not_count_lm_head_twice() -> None:
    tied = get_preset("tiny-qwen3")
    untied = dataclasses.replace(tied, name="tiny-untied", tie_word_embeddings=False)
    assert untied.num_parameters - tied.num_parameters == tied.vocab_size * tied.hidden_size


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"vocab_size": 100}, "vocab_size"),
        ({"hidden_size": 0}, "hidden_size"),
        ({"architecture": "gpt2"}, "architecture"),
        ({"torch_dtype": "int8"}, "torch_dtype"),
        ({"head_dim": 15}, "head_dim"),
    ],
)
def test_invalid_hand_made_preset_raises_config_error_naming_the_field(
    change: dict[str, object], field: str
) -> None:
    with pytest.raises(ConfigError, match=field):
        dataclasses.replace(get_preset("tiny-qwen3"), **change)  # type: ignore[arg-type]


def test_presets_are_frozen() -> None:
    preset: ModelPreset = get_preset("tiny-qwen3")
    with pytest.raises(dataclasses.FrozenInstanceError):
        preset.hidden_size = 128  # type: ignore[misc]
