"""Both modes' vLLM engines starting at once on one GPU (engine option `start_together`): each takes a KV cache
sized from the config (oracle.engines.vllm_memory) instead of measuring the free memory, and the run gives the
checks, divergences and schedule that a run starting them one after the other gives.

Needs a CUDA device and vLLM installed with oracle: `pytest -m gpu tests/gpu/test_vllm_start_together_cuda.py`.
Not yet run on a GPU as written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
pytest.importorskip("vllm")

from oracle.config import parse_config  # noqa: E402
from oracle.runner import run  # noqa: E402

CONFIG = Path(__file__).parents[2] / "configs" / "vllm-gpu-triton-attn.yaml"


def _config(model: Path, out: Path, together: bool) -> dict[str, Any]:
    raw = yaml.safe_load(CONFIG.read_text())
    raw["model"] = str(model)
    raw["report_dir"] = str(out)
    raw["schedule"]["trials"] = 8
    raw["engine"]["options"]["start_together"] = together
    return raw


def _outcome(out: Path) -> str:
    """What the run found: the checks, the divergences and the schedule, as report.json holds them."""
    report = json.loads((out / "report.json").read_text())
    return json.dumps({k: report[k] for k in ("checks", "divergences", "schedule")}, sort_keys=True)


def test_engines_started_together_find_what_engines_started_in_turn_find(small_qwen3: Path, tmp_path: Path) -> None:
    out = tmp_path / "r"
    in_turn = run(parse_config(_config(small_qwen3, out, together=False)))
    assert in_turn.exit_code() == 0, in_turn.error
    assert "kv_cache_memory_bytes" not in in_turn.environment["engines"]["production"]  # measured by vLLM
    expected = _outcome(out)
    together = run(parse_config(_config(small_qwen3, out, together=True)))
    assert together.exit_code() == 0, together.error
    engines = together.environment["engines"]
    assert all(engines[m]["kv_cache_memory_bytes"] > 0 for m in ("invariant", "production"))
    assert _outcome(out) == expected
