"""A real vLLM OpenAI server on the CPU, started and stopped by the openai engine, on small-qwen3.

Skipped where vllm is not installed. The server takes ~45 s to answer on 2 cores, so one server
serves every test of this module. The CPU server is batch-variant: tokens of greedy decoding are
asserted equal, logprob differences between solo and batched runs are only reported.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("vllm")

from oracle.config import EngineConfig  # noqa: E402
from oracle.engines.contract import Request, SamplingParams  # noqa: E402
from oracle.engines.openai_engine import OpenAIEngine  # noqa: E402

pytestmark = pytest.mark.slow

CONFIG = Path(__file__).parents[2] / "configs" / "server.yaml"
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, logits="digest")
PROMPTS = ((5, 17, 300, 41, 999, 2048, 7, 77), tuple(range(1000, 1030)), (42,) * 12, (3, 1, 4, 1, 5, 9, 2, 6))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def server_options() -> dict[str, Any]:
    options: dict[str, Any] = yaml.safe_load(CONFIG.read_text())["engine"]["options"]
    return options


@pytest.fixture(scope="module")
def engine(model_cache: Path, server_options: dict[str, Any]) -> Iterator[OpenAIEngine]:
    from oracle.models import ensure_model

    model = ensure_model("small-qwen3", cache_dir=model_cache)
    engine = OpenAIEngine(model, "production",
                          EngineConfig.of("openai", **{**server_options, "startup_timeout_s": 240}))
    yield engine
    engine.close()


def test_batched_greedy_tokens_repeat_and_match_the_solo_run(engine: OpenAIEngine) -> None:
    reqs = [Request(f"r{i}", p, GREEDY) for i, p in enumerate(PROMPTS)]
    first = engine.generate(reqs)
    second = engine.generate(reqs)
    solo = engine.generate(reqs[:1])[0]
    assert [c.token_ids for c in first] == [c.token_ids for c in second]
    assert all(len(c.token_ids) == GREEDY.max_tokens for c in first)
    assert first[0].token_ids == solo.token_ids
    assert solo.max_batch == 1
    assert max(c.max_batch for c in first) >= 2  # the four were in flight together
    diff = max(abs(a - b) for a, b in zip(first[0].logprobs, solo.logprobs, strict=True))
    print(f"target solo vs in a batch of {len(reqs)}: max |logprob diff| = {diff:.3g}; "
          f"digests equal: {first[0].logits_digests == solo.logits_digests}")
    info = engine.describe()
    assert info["engine"] == "openai" and info["served_model"] == str(engine.model)


def test_the_servers_prefix_cache_is_reset_by_salt_and_its_hits_are_read(engine: OpenAIEngine) -> None:
    """configs/server.yaml: a fresh cache_salt starts a request cold; the same prompt again under that salt
    is served from vLLM's prefix cache, as usage.prompt_tokens_details.cached_tokens says."""
    req = [Request("long", tuple(range(2000, 2300)), GREEDY)]  # 300 tokens: two full blocks of 128 (CPU)
    engine.reset_prefix_cache()
    cold = engine.generate(req)[0]
    warm = engine.generate(req)[0]
    engine.reset_prefix_cache()
    cold_again = engine.generate(req)[0]
    hits = [c.evidence[0].num_cached_tokens for c in (cold, warm, cold_again)]
    print(f"cached prompt tokens (cold, warm, cold after reset): {hits}")
    assert hits == [0, 256, 0]
    assert warm.token_ids == cold.token_ids


def test_server_process_is_gone_after_close(model_cache: Path, engine: OpenAIEngine) -> None:
    pid = engine.server_pid
    assert pid is not None and _alive(pid)
    engine.close()
    assert engine.server_pid is None
    assert not _alive(pid)
