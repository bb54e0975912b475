"""A model's attention layers from config.json (oracle.models.layers): a sliding window in use, layers that
are not full attention; the hazards' `model.sliding_window` / `model.linear_attention` and the reason
`prefill_decode` is not applicable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from oracle.models.layers import attention_layout
from oracle.posture.hazards import load_hazards, match_hazards


@pytest.mark.parametrize(("raw", "window", "linear"), [
    ({"sliding_window": 4096, "use_sliding_window": False}, None, False),  # Qwen2/Qwen3: named, not used
    ({"sliding_window": 4096}, 4096, False),  # Mistral
    ({"sliding_window": None}, None, False),
    ({"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 512}, 512, False),  # Gemma 3
    ({"layer_types": ["linear_attention", "linear_attention", "full_attention"]}, None, True),  # Qwen3.5 (GDN)
    ({"text_config": {"layer_types": ["linear_attention", "full_attention"]}}, None, True),
    ({"layers_block_type": ["mamba", "attention"]}, None, True),  # Jamba, Granite 4 H
    ({"hybrid_override_pattern": "M-M*-"}, None, True),  # Nemotron-H
    ({"num_hidden_layers": 2}, None, False),
])
def test_config_json_gives_the_window_and_the_layer_kinds(raw: dict[str, Any], window: int | None,
                                                          linear: bool) -> None:
    layout = attention_layout(raw)
    assert layout.sliding_window == window and layout.linear_attention is linear
    differs = layout.prefill_decode_differs()
    assert (differs is None) is (window is None and not linear)
    if differs is not None:
        assert "55138" in differs


FLAG = {"engine": "vllm", "engine_version": "0.26.0", "device": "cuda:0", "chunked_prefill": False,
        "invariance_mechanism": "VLLM_BATCH_INVARIANT=1 (vLLM's own batch-invariant kernels)", "prefix_caching": True,
        "sequence_parallel": False, "tensor_parallel": 1}


def _ids(posture: dict[str, Any], model: dict[str, Any]) -> set[str]:
    return {m.hazard.id for m in match_hazards(posture, {"head_dim": 128, **model}, {}, load_hazards())
            if m.match == "matches"}


def test_the_new_hazards_match_what_their_rows_say() -> None:
    plain = {"linear_attention": False}
    assert _ids(FLAG, plain) == set()
    assert _ids(FLAG, {"linear_attention": True}) == {"vllm-gdn-batch-invariant-not-in-force"}
    assert _ids({**FLAG, "chunked_prefill": True}, plain) == {"vllm-chunked-prefill-untested"}
    # Cascade: off under vLLM's flag (PR #32561), on under oracle_kernels, gone in 0.32.0.
    ours = {**FLAG, "invariance_mechanism": "oracle_kernels in every rank"}
    assert _ids(ours, plain) == {"vllm-cascade-shared-prefix"}
    assert _ids({**ours, "engine_version": "0.32.0"}, plain) == set()
    assert _ids({**ours, "prefix_caching": False}, plain) == set()
    tp4 = {**FLAG, "sequence_parallel": True, "tensor_parallel": 4}
    assert "vllm-sequence-parallel-tp4-run-to-run" in _ids(tp4, plain)
    assert "vllm-sequence-parallel-tp4-run-to-run" not in _ids({**tp4, "tensor_parallel": 2}, plain)


def _prefill_decode(model: Path, tmp_path: Path, extra: dict[str, Any]) -> Any:
    """prefill_decode (required) on the fake engine, whose decode and re-prefilled steps differ by construction
    (its outputs hash the prompt and the step), with config.json saying `extra`."""
    import json

    from oracle.config import parse_config
    from oracle.runner import run

    (model / "config.json").write_text(json.dumps({**json.loads((model / "config.json").read_text()), **extra}))
    cfg = {"model": str(model), "engine": {"kind": "fake_engine:FakeEngine"},
           "prompts": {"random": {"count": 2, "min_len": 4, "max_len": 8}}, "sampling": {"max_tokens": 4},
           "schedule": {"trials": 2, "repeat_trials": 0, "shrink": False},
           "checks": {"invariance": "off", "repeatability": "off", "fidelity": "off", "drift": "off",
                      "negative_control": "off", "prefix_cache": "off", "prefill_decode": "required"},
           "report_dir": str(tmp_path / "report")}
    report = run(parse_config(cfg))
    return report, next(c for c in report.checks if c.name == "prefill_decode")


@pytest.mark.parametrize(("extra", "reason"), [
    ({"sliding_window": 16}, "the model attends over a sliding window of 16 tokens"),
    ({"layer_types": ["linear_attention", "full_attention"]}, "the model has linear_attention layers"),
])
def test_prefill_decode_is_not_applicable_where_the_model_says_they_differ_by_construction(
        fake_model: Path, tmp_path: Path, extra: dict[str, Any], reason: str) -> None:
    report, check = _prefill_decode(fake_model, tmp_path, extra)
    assert check.verdict == "skipped" and check.trials == 0, check.message
    assert check.message.startswith(f"not applicable: {reason}") and "55138" in check.message
    assert report.exit_code() == 0
    assert not report.divergences


def test_prefill_decode_still_fails_where_the_model_says_nothing(fake_model: Path, tmp_path: Path) -> None:
    report, check = _prefill_decode(fake_model, tmp_path, {"sliding_window": None})
    assert check.verdict == "fail" and report.exit_code() == 1
