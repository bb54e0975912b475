"""The native decoder's fused chains: on in invariant mode where they apply, off under per-op capture and in production.

The fused kernels are CUDA's; here the CPU is let in (`FUSED_DEVICE_TYPES`), where the fused ops run
their composition (kernels/fused.py), so that the switch and the model's fused path (the residual add
moved into the next norm, the last one into the final norm) run on the CPU. Compared bitwise (bf16).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from bitwise import assert_same_bits
from fused_record import record_fused
from native_batches import batch_around_target

from oracle.config import EngineConfig
from oracle.engines.contract import RunSpec
from oracle.engines.native import NativeEngine
from oracle.engines.native import model as native_model
from oracle.engines.native.model import fused_path_applies

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


def test_the_fused_path_applies_to_invariant_mode_on_cuda_in_halves_only() -> None:
    assert fused_path_applies("invariant", CUDA, torch.bfloat16)
    assert fused_path_applies("invariant", CUDA, torch.float16)
    assert not fused_path_applies("production", CUDA, torch.bfloat16)
    assert not fused_path_applies("invariant", CUDA, torch.float32)
    assert not fused_path_applies("invariant", CPU, torch.bfloat16)


@pytest.fixture
def cpu_fuses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_model, "FUSED_DEVICE_TYPES", frozenset({"cpu", "cuda"}))


def _engine(model: Any, mode: str) -> NativeEngine:
    return NativeEngine(model, mode, EngineConfig.of("native", dtype="bfloat16", num_threads=1,  # type: ignore[arg-type]
                                                     fused_kernels=True))


class _Rows:
    """The least of a RowCapture that `NativeEngine.capture` uses: it captures nothing."""

    module_path: Any = None

    @contextlib.contextmanager
    def forward_pass(self, layout: Any, inputs: Any) -> Iterator[None]:
        yield


def test_invariant_mode_fuses_and_its_capture_does_not(tiny_qwen3: Path, cpu_fuses: None) -> None:
    engine = _engine(tiny_qwen3, "invariant")
    seen = record_fused(engine)
    reqs = batch_around_target(4, 1, seed=5)
    engine.generate(reqs)
    assert seen and all(seen)
    seen.clear()
    engine.capture(RunSpec(tuple(reqs), 1, warm_with=tuple(reqs[:1])), _Rows())  # type: ignore[arg-type]
    # The warm-up runs before the capture's hook is set: fused (bitwise the same); the captured run is not.
    assert True in seen and seen[-1] is False
    assert engine.decoder.fused is False  # restored after every call


def test_production_mode_never_fuses(tiny_qwen3: Path, cpu_fuses: None) -> None:
    engine = _engine(tiny_qwen3, "production")
    seen = record_fused(engine)
    engine.generate(batch_around_target(3, 0, seed=6))
    assert seen and not any(seen)


def test_the_fused_path_gives_the_composed_bits(tiny_qwen3: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU the fused ops are their composition, so this checks the model's fused path itself."""
    composed = _engine(tiny_qwen3, "invariant")
    reqs = batch_around_target(5, 2, seed=7)
    expected = composed.generate(reqs)
    monkeypatch.setattr(native_model, "FUSED_DEVICE_TYPES", frozenset({"cpu"}))
    fused = _engine(composed.decoder, "invariant")
    seen = record_fused(fused)
    actual = fused.generate(reqs)
    assert seen and all(seen)
    assert_same_bits(expected, actual)


def test_the_option_turns_the_fused_path_on(tiny_qwen3: Path, cpu_fuses: None) -> None:
    on = _engine(tiny_qwen3, "invariant")
    off = NativeEngine(on.decoder, "invariant", EngineConfig.of("native", dtype="bfloat16", num_threads=1,  # type: ignore[arg-type]
                                                                fused_kernels=False))
    default = NativeEngine(on.decoder, "invariant", EngineConfig.of("native", dtype="bfloat16", num_threads=1))
    assert on.describe()["fused_kernels"] is True and off.describe()["fused_kernels"] is False
    assert default.describe()["fused_kernels"] is True  # on by default where the fused path applies
    seen = record_fused(off)
    off.generate(batch_around_target(3, 1, seed=8))
    assert seen and not any(seen)
