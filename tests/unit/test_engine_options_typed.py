"""Engine options flow as one typed object from the YAML to the engine: validated once, defaults stated once
(in oracle.config), and a wrong option is a ConfigError naming engine.options.FIELD (and the file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from oracle.config import EngineConfig, load_config
from oracle.engine_options import NativeOptions, OpenAIOptions, VllmOptions
from oracle.engines.contract import capabilities
from oracle.engines.openai_engine import mode_url
from oracle.errors import ConfigError
from oracle.lifecycle.watchdog import build_engine

BASE = "model: preset:tiny-qwen3\nprompts: {random: {count: 1}}\n"


def _load(tmp_path: Path, engine: str) -> EngineConfig:
    path = tmp_path / "c.yaml"
    path.write_text(BASE + engine)
    return load_config(path).engine


@pytest.mark.parametrize(("engine", "where"), [
    ("engine:\n  kind: native\n  options:\n    cuda_graphs: sometimes\n",
     "c.yaml:6: engine.options.cuda_graphs: Input should be a valid boolean"),
    ("engine:\n  kind: native\n  options:\n    cuda_graph: false\n", "c.yaml:6: engine.options.cuda_graph: unknown field"),
    ("engine:\n  kind: native\n  options:\n    cuda_graphs: true\n",
     "c.yaml:6: engine.options.cuda_graphs: needs a CUDA device, not engine.device 'cpu'"),
    ("engine:\n  kind: vllm\n  options:\n    logprobs: many\n",
     "c.yaml:6: engine.options.logprobs: Input should be a valid integer"),
    ("engine:\n  kind: vllm\n  options:\n    threads: 2\n", "c.yaml:6: engine.options.threads: unknown field"),
    ("engine:\n  kind: openai\n  options:\n    base_url: http://a\n    command: [serve, '{host}']\n",
     "c.yaml:6: engine.options.base_url: give base_url or command, not both"),
    ("engine:\n  kind: openai\n  options:\n    command: [serve, '{host}', --host=0.0.0.0]\n",
     "c.yaml:6: engine.options.command: '--host=0.0.0.0' binds 0.0.0.0, not loopback"),
    ("engine:\n  kind: transformers\n  options:\n    attn_implementation: [sdpa]\n",
     "c.yaml:6: engine.options.attn_implementation: Input should be a valid string"),
])
def test_a_wrong_or_unknown_option_names_the_file_line_and_field(tmp_path: Path, engine: str, where: str) -> None:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, engine)
    assert where in str(info.value)


@pytest.mark.parametrize(("kind", "values", "where"), [
    ("native", {"cuda_graphs": "sometimes"}, "engine.options.cuda_graphs: Input should be a valid boolean"),
    ("native", {"stop_at_eos": True, "typo": 1}, "engine.options.typo: unknown field"),
    ("native", {"max_num_seqs": 0}, "engine.max_num_seqs: Input should be greater than or equal to 1"),
    ("openai", {"base_url": "http://a", "concurrency": 0}, "engine.options.concurrency: Input should be greater"),
    ("vllm", {"invariance": "fast"}, "engine.options.invariance: Input should be 'oracle_kernels', 'vllm' or 'none'"),
])
def test_an_engine_config_built_in_python_names_the_field(kind: str, values: dict[str, object], where: str) -> None:
    with pytest.raises(ConfigError) as info:
        EngineConfig.of(kind, **values)
    assert str(info.value).startswith(where)


def test_options_read_as_another_engines_name_the_field() -> None:
    cfg = EngineConfig.of("vllm", invariance="vllm")
    with pytest.raises(ConfigError, match=r"^engine.options.invariance: unknown field$"):
        cfg.options_as(NativeOptions)


def test_cuda_graphs_is_a_native_option(tmp_path: Path) -> None:
    cfg = _load(tmp_path, "engine:\n  kind: native\n  options:\n    cuda_graphs: false\n    stop_at_eos: true\n")
    assert cfg.options == {"cuda_graphs": False, "stop_at_eos": True}
    assert cfg.options_as(NativeOptions) == NativeOptions(cuda_graphs=False, stop_at_eos=True)


def test_the_native_engine_gets_the_typed_options_and_the_configs_defaults(tiny_qwen3: Path) -> None:
    cfg = EngineConfig.of("native", cuda_graphs=False, stop_at_eos=True, max_num_seqs=8, num_threads=1)
    engine = build_engine(cfg, tiny_qwen3, "production")
    try:
        described = engine.describe()
        assert described["cuda_graphs"] is False and described["max_num_seqs"] == 8
        # Fields the config leaves out take the config's defaults, stated once (in EngineConfig).
        assert described["max_num_batched_tokens"] == EngineConfig.model_fields["max_num_batched_tokens"].default
        assert described["enable_chunked_prefill"] is EngineConfig.model_fields["enable_chunked_prefill"].default
        assert capabilities(engine).stop_at_eos is True
    finally:
        engine.close()


def test_defaults_are_the_options_models_own() -> None:
    """The start deadline, the vLLM worker's environment and the openai server's URL read the typed options."""
    from oracle.engines.vllm_engine import VllmEngine
    from oracle.lifecycle.watchdog import START_GRACE_S, start_timeout

    vllm = EngineConfig.of("vllm", timeout_s=1.0)
    default = VllmOptions.model_fields["start_timeout_s"].default
    assert start_timeout(vllm)[0] == 1.0 + default + START_GRACE_S
    env = VllmEngine._worker_env("invariant", vllm.options_as(VllmOptions), 3)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == str(VllmOptions.model_fields["kv_cache_space_gib"].default)
    assert env["OMP_NUM_THREADS"] == "3" and "VLLM_BATCH_INVARIANT" not in env  # invariance: oracle_kernels
    options = EngineConfig.of("vllm", invariance="vllm", split_kv=False, env={"X": "1"}).options_as(VllmOptions)
    env = VllmEngine._worker_env("invariant", options, None)
    assert env["VLLM_BATCH_INVARIANT"] == "1" and env["VLLM_CPU_ATTN_SPLIT_KV"] == "0" and env["X"] == "1"
    assert "VLLM_CPU_ATTN_SPLIT_KV" not in VllmEngine._worker_env("production", options, None)  # invariant only


def test_the_openai_engine_reads_its_modes_url_from_the_typed_options() -> None:
    urls = OpenAIOptions.model_validate({"base_url": {"invariant": ["http://i1", "http://i2"],
                                                      "production": "http://p"}}).base_url
    assert urls is not None
    assert mode_url(urls, "invariant") == "http://i1" and mode_url(urls, "production") == "http://p"
    assert mode_url("http://one", "invariant") == "http://one"
