"""engine.options are typed per built-in engine and checked when the config is read, naming file:line:field."""

from __future__ import annotations

from pathlib import Path

import pytest

from oracle.config import load_config, parse_config
from oracle.engine_options import OpenAIOptions
from oracle.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
BASE = "model: preset:tiny-qwen3\nprompts: {random: {count: 1}}\n"


def _write(tmp_path: Path, engine: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(BASE + engine)
    return path


@pytest.mark.parametrize("name", sorted(p.stem for p in CONFIGS.glob("*.yaml")))
def test_every_shipped_config_keeps_its_options_valid(name: str) -> None:
    config = load_config(CONFIGS / f"{name}.yaml")
    typed = config.engine.typed_options()
    assert typed is not None or ":" in config.engine.kind


@pytest.mark.parametrize(("engine", "where"), [
    ("engine:\n  kind: openai\n  options:\n    base_url: http://x\n    concurrency: 0\n",
     "c.yaml:7: engine.options.concurrency: Input should be greater than or equal to 1"),
    ("engine:\n  kind: native\n  options:\n    stop_at_eos: true\n    typo: 1\n",
     "c.yaml:7: engine.options.typo: unknown field"),
    ("engine:\n  kind: vllm\n  options: {invariance: fast}\n",
     "c.yaml:5: engine.options.invariance: Input should be 'oracle_kernels', 'vllm' or 'none'"),
    ("engine:\n  kind: transformers\n  options:\n    attn: sdpa\n", "c.yaml:6: engine.options.attn: unknown field"),
    ("engine:\n  kind: openai\n  options:\n    command: [vllm, serve, --port, '{port}']\n",
     "c.yaml:6: engine.options.command: must bind the server to {host}"),
    ("engine:\n  kind: openai\n  options:\n    base_url: {invariant: http://a}\n",
     "c.yaml:6: engine.options.base_url"),
    ("engine:\n  kind: openai\n  options:\n    base_url:\n      invariant: http://a\n      production: localhost:8000\n",
     "c.yaml:8: engine.options.base_url.production: 'localhost:8000' is not an http:// or https:// URL"),
])
def test_bad_options_name_file_line_and_field(tmp_path: Path, engine: str, where: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, engine))
    assert where in str(info.value)


def test_options_keep_only_what_was_given() -> None:
    """Defaults are not written into the config (its digest does not move), but the typed view has them."""
    cfg = parse_config({"model": "m", "prompts": {"random": {"count": 1}},
                        "engine": {"kind": "openai", "options": {"base_url": {"invariant": "http://a",
                                                                              "production": "http://b"}}}})
    assert cfg.engine.options == {"base_url": {"invariant": "http://a", "production": "http://b"}}
    typed = cfg.engine.typed_options()
    assert isinstance(typed, OpenAIOptions) and typed.concurrency == 32 and typed.max_retries == 4
