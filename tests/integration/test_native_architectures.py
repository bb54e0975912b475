"""The native engine's architectures: Qwen2 and Mistral checkpoints written by transformers itself run
the same as in transformers, and anything the decoder cannot run is refused before a run starts."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from oracle.config import parse_config
from oracle.engines.contract import Request, SamplingParams
from oracle.engines.native import NativeEngine
from oracle.errors import ModelError
from oracle.models.architectures import native_layout_problem
from oracle.runner import plan_run

transformers = pytest.importorskip("transformers")
from oracle.engines.transformers_engine import TransformersEngine  # noqa: E402

SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, rope_theta=5000.0, tie_word_embeddings=False)


def _save(model: Any, path: Path) -> Path:
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):  # transformers initialises biases to zero: make them count
                p.normal_(0, 0.5)
    model.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(1)
    config = transformers.Qwen2Config(**SMALL, use_sliding_window=False)
    return _save(transformers.Qwen2ForCausalLM(config), tmp_path_factory.mktemp("qwen2"))


@pytest.fixture(scope="module")
def mistral(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(2)
    config = transformers.MistralConfig(**SMALL, sliding_window=None, head_dim=8)
    return _save(transformers.MistralForCausalLM(config), tmp_path_factory.mktemp("mistral"))


@pytest.mark.parametrize("name", ["qwen2", "mistral"])
def test_native_engine_matches_transformers(name: str, request: pytest.FixtureRequest) -> None:
    path: Path = request.getfixturevalue(name)
    prompt = tuple(random.Random(5).randrange(128) for _ in range(9))
    req = Request("t", prompt, SamplingParams(max_tokens=6, logits="full"))
    ours = NativeEngine(path, "production").generate([req])[0]
    theirs = TransformersEngine(path, "production").generate([req])[0]
    assert ours.token_ids == theirs.token_ids
    assert max(abs(a - b) for a, b in zip(ours.logprobs, theirs.logprobs, strict=True)) < 1e-4
    assert ours.logits is not None and theirs.logits is not None
    assert max(float(abs(a - b).max()) for a, b in zip(ours.logits, theirs.logits, strict=True)) < 1e-4


def test_qwen2_biases_are_loaded(qwen2: Path) -> None:
    decoder = NativeEngine(qwen2, "production").decoder
    assert decoder.config.architecture == "qwen2" and decoder.config.attention_bias
    assert "model.layers.0.self_attn.q_proj.bias" in decoder.w


def _checkpoint(path: Path, **config: Any) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({**SMALL, **config}))
    (path / "model.safetensors").write_bytes(b"")
    return path


@pytest.mark.parametrize(("config", "message"), [
    ({"architectures": ["GPT2LMHeadModel"]}, r"architectures \['GPT2LMHeadModel'\] are not supported"),
    ({"architectures": ["MistralForCausalLM"], "sliding_window": 64}, "sliding window of 64 tokens"),
    ({"architectures": ["LlamaForCausalLM"], "rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
     "rope scaling 'llama3'"),
    ({"architectures": ["LlamaForCausalLM"], "hidden_act": "gelu"}, "hidden_act 'gelu'"),
])
def test_unsupported_layouts_fail_at_plan_time_routing_to_other_engines(tmp_path: Path, config: dict[str, Any],
                                                                       message: str) -> None:
    model = _checkpoint(tmp_path / "m", **config)
    cfg = parse_config({"model": str(model), "prompts": {"random": {"count": 1}}})
    with pytest.raises(ModelError, match=message) as info:
        plan_run(cfg, seed=0)  # before any engine is built
    assert "engine.kind: transformers" in str(info.value) and "config.json" in str(info.value)


def test_the_transformers_engine_is_not_held_to_the_native_list(tmp_path: Path) -> None:
    model = _checkpoint(tmp_path / "m", architectures=["GPT2LMHeadModel"])
    cfg = parse_config({"model": str(model), "engine": {"kind": "transformers"}, "prompts": {"random": {"count": 1}}})
    assert plan_run(cfg, seed=0).model_dir == model


@pytest.mark.parametrize(("config", "ok"), [
    ({"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": False, "sliding_window": 32}, True),
    ({"architectures": ["MistralForCausalLM"], "sliding_window": None}, True),
    ({"architectures": ["MistralForCausalLM"], "sliding_window": 4096, "max_position_embeddings": 4096}, True),
    ({"architectures": ["Qwen3ForCausalLM"], "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}, True),
    ({"architectures": ["Qwen3ForCausalLM"], "rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, False),
])
def test_layout_rules(config: dict[str, Any], ok: bool) -> None:
    assert (native_layout_problem({**SMALL, **config}) is None) == ok
