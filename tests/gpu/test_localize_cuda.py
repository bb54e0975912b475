"""Localization on CUDA: the planted one-op fault is named by module, op and layer (Triton kernels underneath).

Run with `pytest -m gpu tests/gpu/test_localize_cuda.py`.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from planted import PlantedEngine

from oracle.engines.contract import Request, SamplingParams
from oracle.localize import localize_trial

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SAMPLING = SamplingParams(max_tokens=4, logits="full")
RNG = random.Random(3)
TARGET = tuple(RNG.randrange(512) for _ in range(24))
FILLERS = [tuple(RNG.randrange(512) for _ in range(n)) for n in (30, 12, 20)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize(("module", "op", "layer"), [
    ("model.layers.1.mlp.down_proj", "aten.mm.default", 1),
    ("model.layers.0.self_attn.attn", "oracle_kernels.paged_attention.default", 0),
])
def test_planted_fault_named_on_cuda(tiny_qwen3: Path, dtype: str, module: str, op: str, layer: int) -> None:
    pytest.importorskip("triton")
    engine = PlantedEngine(tiny_qwen3, "invariant", device="cuda", dtype=dtype, fault_module=module,
                           fault_op=op, min_tokens=30)
    target = Request("target", TARGET, SAMPLING)
    trial = [Request(f"f{i}", p, SamplingParams(max_tokens=3, logits="none")) for i, p in enumerate(FILLERS)]
    trial.insert(1, target)
    loc = localize_trial(engine, [target], trial, 1)
    assert loc is not None
    assert (loc.module, loc.op, loc.layer) == (module, op, layer)
    assert loc.positions == tuple(range(len(TARGET))) and loc.inputs_equal is True
    assert loc.ulp == 1
    quiet = PlantedEngine(engine.decoder, "invariant", device="cuda", dtype=dtype, min_tokens=10_000)
    assert localize_trial(quiet, [target], trial, 1) is None
