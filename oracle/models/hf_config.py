"""config.json and generation_config.json for a preset, in Hugging Face's on-disk format.

The keys are those transformers 4.51 (the first release with Qwen3) writes for
`Qwen3ForCausalLM` / `LlamaForCausalLM`, as in the published Qwen3 and Llama checkpoints:
`torch_dtype` and `rope_theta` rather than transformers 5's `dtype` and `rope_parameters`.
transformers 4.51+ and 5.x and vLLM all read this form. `transformers_version` is pinned
rather than read from the installed library, so the files do not change with the environment.
"""

from __future__ import annotations

import json
from typing import Any

from oracle.models.presets import ModelPreset
from oracle.models.tokenizer import special_token_ids

HF_FORMAT_VERSION = "4.51.0"
ARCHITECTURE_CLASSES = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}


def make_config_dict(preset: ModelPreset) -> dict[str, Any]:
    """The contents of config.json."""
    ids = special_token_ids(preset.vocab_size)
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURE_CLASSES[preset.architecture]],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": ids.endoftext,
        "eos_token_id": ids.im_end,
        "head_dim": preset.head_dim,
        "hidden_act": "silu",
        "hidden_size": preset.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": preset.intermediate_size,
        "max_position_embeddings": preset.max_position_embeddings,
        "model_type": preset.architecture,
        "num_attention_heads": preset.num_attention_heads,
        "num_hidden_layers": preset.num_hidden_layers,
        "num_key_value_heads": preset.num_key_value_heads,
        "rms_norm_eps": preset.rms_norm_eps,
        "rope_scaling": None,
        "rope_theta": preset.rope_theta,
        "tie_word_embeddings": preset.tie_word_embeddings,
        "torch_dtype": preset.torch_dtype,
        "transformers_version": HF_FORMAT_VERSION,
        "use_cache": True,
        "vocab_size": preset.vocab_size,
    }
    if preset.architecture == "qwen3":
        config.update(
            max_window_layers=preset.num_hidden_layers, sliding_window=None, use_sliding_window=False
        )
    else:
        config.update(mlp_bias=False, pretraining_tp=1)
    return config


def make_generation_config_dict(preset: ModelPreset) -> dict[str, Any]:
    """The contents of generation_config.json: greedy, so that engines reading defaults from it
    (vLLM does) do not start sampling."""
    ids = special_token_ids(preset.vocab_size)
    return {
        "bos_token_id": ids.endoftext,
        "do_sample": False,
        "eos_token_id": ids.im_end,
        "pad_token_id": ids.endoftext,
        "transformers_version": HF_FORMAT_VERSION,
    }


def dump_json(data: dict[str, Any]) -> str:
    """JSON as transformers writes it: sorted keys, two-space indent, trailing newline."""
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
