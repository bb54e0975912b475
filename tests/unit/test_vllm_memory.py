"""A vLLM engine's KV cache sized from its config (engine option `start_together`), and when two vLLM engines may
start on one GPU at once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oracle.config import EngineConfig
from oracle.engines.kinds import BUILTIN
from oracle.engines.vllm_memory import MARGIN, SHARE, fixed_kv_cache_bytes, kv_bytes_per_token, weight_bytes
from oracle.engines.vllm_worker import WorkerSpec

GIB = 1 << 30


def _model(tmp_path: Path, weights: int = 0, **config: object) -> Path:
    base = {"num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 64,
            "hidden_size": 1024, "max_position_embeddings": 2048, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps({**base, **config}))
    (tmp_path / "model.safetensors").write_bytes(b"\0" * weights)
    return tmp_path


def test_bytes_per_token_count_every_layers_keys_and_values(tmp_path: Path) -> None:
    model = _model(tmp_path)
    assert kv_bytes_per_token(model, "bfloat16") == 4 * 2 * 8 * 64 * 2
    assert kv_bytes_per_token(model, "float32") == kv_bytes_per_token(model, "float") == 4 * 2 * 8 * 64 * 4
    assert kv_bytes_per_token(model, "auto") == 4 * 2 * 8 * 64 * 2  # the checkpoint's bf16
    assert kv_bytes_per_token(model, "bfloat16", tensor_parallel_size=2) == 4 * 2 * 4 * 64 * 2
    assert kv_bytes_per_token(model, "bfloat16", tensor_parallel_size=16) == 4 * 2 * 1 * 64 * 2  # a head each


def test_head_size_and_a_nested_text_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {
        "num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 512}}))
    assert kv_bytes_per_token(tmp_path, "float16") == 2 * 2 * 8 * 64 * 2  # no KV heads given: every head


def test_the_size_is_what_the_sequences_need_within_the_share(tmp_path: Path) -> None:
    model = _model(tmp_path, weights=1000)
    block = 16 * kv_bytes_per_token(model, "bfloat16")  # vLLM's default block of 16 tokens
    assert weight_bytes(model) == 1000 and weight_bytes(model, 2) == 500
    # Room enough: every sequence at full length, in whole blocks, and vLLM's null block.
    assert fixed_kv_cache_bytes(model, "bfloat16", 8, 1024, 80 * GIB) == (8 * 64 + 1) * block
    assert fixed_kv_cache_bytes(model, "bfloat16", 8, 1000, 80 * GIB) == (8 * 63 + 1) * block  # 1000 -> 63 blocks
    assert fixed_kv_cache_bytes(model, "bfloat16", 8, 1000, 80 * GIB, block_size=32) == (8 * 32 + 1) * 2 * block
    # max_model_len unset: the config's max_position_embeddings.
    assert fixed_kv_cache_bytes(model, "bfloat16", 8, None, 80 * GIB) == (8 * 128 + 1) * block
    # Too many sequences for the share: the share, less the weights and the margin, in whole blocks.
    room = int(80 * GIB * SHARE) - 1000 - MARGIN
    assert fixed_kv_cache_bytes(model, "bfloat16", 100_000, 1024, 80 * GIB) == room // block * block
    # Not even one sequence fits: one and the null block (vLLM refuses less, and says so).
    assert fixed_kv_cache_bytes(model, "bfloat16", 8, 1024, 2 * GIB) == 65 * block


def test_two_vllm_engines_start_together_on_a_gpu_only_where_neither_measures(monkeypatch: pytest.MonkeyPatch) -> None:
    from oracle.models import memory

    together = BUILTIN["vllm"].starts_together
    measured = EngineConfig.model_validate({"kind": "vllm"})
    fixed = EngineConfig.model_validate({"kind": "vllm", "options": {"start_together": True}})
    given = EngineConfig.model_validate({"kind": "vllm", "options": {
        "engine_args": {"kv_cache_memory_bytes": 4 * GIB}}})
    monkeypatch.setattr(memory, "gpus_free", lambda: memory.Memory(80 * GIB, "GPU memory"))
    assert not together(measured) and together(fixed) and together(given)
    beside = BUILTIN["vllm"].beside  # a given cache: the share is only what vLLM checks is free as it starts
    assert beside(measured).options["engine_args"]["gpu_memory_utilization"] == 0.45
    assert beside(fixed).options["engine_args"]["gpu_memory_utilization"] == 0.1
    assert beside(given).options["engine_args"]["gpu_memory_utilization"] == 0.1
    monkeypatch.setattr(memory, "gpus_free", lambda: None)
    assert together(measured)  # a CPU: always


@pytest.mark.parametrize("start_together", [False, True])
def test_the_worker_is_asked_for_a_fixed_cache_only_with_start_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start_together: bool,
) -> None:
    from oracle.engines import vllm_engine

    class Started:
        info: dict[str, object] = {}

    specs: list[WorkerSpec] = []
    monkeypatch.setattr(vllm_engine._Worker, "start",
                        classmethod(lambda cls, spec, env, timeout_s: specs.append(spec) or Started()))
    model = _model(tmp_path)
    vllm_engine.VllmEngine(model, "production", EngineConfig.of("vllm", start_together=start_together, audit=False))
    assert [s.fixed_kv_cache for s in specs] == [start_together]
