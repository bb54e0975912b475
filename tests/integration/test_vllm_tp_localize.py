"""Localization in every rank of vLLM's CPU build at tensor_parallel_size 2, over planted faults in rank 1.

The faults come from a vLLM plugin for tests only (tests/support/vllm_planted_tp.py, installed by the fixture
into a temporary folder on the worker's PYTHONPATH, loaded by vLLM's entry points in every rank); one engine
serves every case, the fault chosen by a file it reads at each call. Needs two CPU cores and vllm; slow: a TP 2
engine takes a minute or two to start on 2 cores, each localization four to six captured runs.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("vllm")

import vllm_planted_tp  # noqa: E402
from tp_reduction import assert_every_failure_names_the_all_reduce  # noqa: E402

from oracle.compare import first_divergence  # noqa: E402
from oracle.config import EngineConfig  # noqa: E402
from oracle.engines.contract import Request, SamplingParams  # noqa: E402
from oracle.engines.vllm_engine import VllmEngine  # noqa: E402
from oracle.localize import localize_trial  # noqa: E402
from oracle.localized_op import LocalizedOp  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="tensor_parallel_size 2 needs two CPU cores"),
]

VOCAB = 4096
TARGET = Request("target", tuple(range(1000, 1012)), SamplingParams(max_tokens=3, logits="full"))


@pytest.fixture(scope="module")
def planted(small_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[VllmEngine, Path]]:
    """An invariant TP 2 engine with the test plugin in every rank, and the file that picks its fault."""
    folder = vllm_planted_tp.install(tmp_path_factory.mktemp("plugins"))
    fault = folder / "fault"
    fault.write_text("none")
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
    config = EngineConfig.of("vllm", invariance="oracle_kernels", dtype="float32", max_num_seqs=16,
                             max_num_batched_tokens=64, num_threads=1, audit=False, tensor_parallel_size=2,
                             env={"VLLM_CPU_OMP_THREADS_BIND": "0|1", "PYTHONPATH": path,
                                  vllm_planted_tp.ENV: str(fault)})
    engine = VllmEngine(small_qwen3, "invariant", config)
    try:
        yield engine, fault
    finally:
        engine.close()


def _fillers(n: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    return [Request(f"f{seed}-{i}", tuple(rng.randrange(VOCAB) for _ in range(rng.randint(3, 12))),
                    SamplingParams(max_tokens=3, logits="none")) for i in range(n)]


TRIAL = [*_fillers(2, seed=0), TARGET]


def _localize(engine: VllmEngine) -> tuple[bool, LocalizedOp | None]:
    solo = engine.generate([TARGET])[0]
    diverged = first_divergence(solo, engine.generate(TRIAL)[-1]) is not None
    return diverged, localize_trial(engine, [TARGET], TRIAL, len(TRIAL) - 1)


def test_a_clean_tp2_run_names_nothing(planted: tuple[VllmEngine, Path]) -> None:
    engine, fault = planted
    fault.write_text("none")
    diverged, loc = _localize(engine)
    assert not diverged and loc is None, loc


def test_rank_1s_all_reduce_is_named_in_its_rank_and_confirmed(planted: tuple[VllmEngine, Path]) -> None:
    engine, fault = planted
    fault.write_text("all_reduce")
    diverged, loc = _localize(engine)
    assert diverged
    assert loc is not None, "a diverging trial localized to nothing"
    print(f"\nplanted all-reduce, rank 1: {loc.describe()}; {loc.confirmation}: {loc.confirm_note}")
    assert loc.status == "localized" and loc.rank == 1, loc.describe()
    assert loc.op == "oracle_vllm.all_reduce.default" and loc.op_class == "communication"
    assert loc.module == "model.layers.0.self_attn.o_proj" and loc.inputs_equal
    assert loc.confirmation == "confirmed", loc.confirm_note
    assert loc.depends_on.get("num_tokens") == [1, 3]


def test_a_matmul_that_follows_m_in_rank_1_is_named_in_its_rank_and_confirmed(
        planted: tuple[VllmEngine, Path]) -> None:
    engine, fault = planted
    fault.write_text("matmul")
    diverged, loc = _localize(engine)
    assert diverged
    assert loc is not None, "a diverging trial localized to nothing"
    print(f"\nplanted matmul, rank 1: {loc.describe()}; {loc.confirmation}: {loc.confirm_note}")
    assert loc.status == "localized" and loc.rank == 1, loc.describe()
    assert loc.op == "aten.linear.default" and loc.op_class == "matmul"  # F.linear, whose mm is the planted one
    assert loc.module == "model.layers.0.mlp.down_proj" and loc.inputs_equal
    assert loc.confirmation == "confirmed", loc.confirm_note
    assert loc.depends_on.get("rows") == [1, 3]


def test_oracle_run_localizes_every_failing_trial_to_rank_1s_all_reduce(
        small_qwen3: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`oracle run` at TP 2 with `localize: all`: invariance fails, the failing trial is shrunk, and every failing
    trial (shrunk ones included) is localized to rank 1's all-reduce, confirmed."""
    import json

    import yaml

    from oracle.cli import main

    folder = vllm_planted_tp.install(tmp_path / "plugins")
    (folder / "fault").write_text("all_reduce")
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
    config = {
        "model": str(small_qwen3),
        "engine": {"kind": "vllm", "dtype": "float32", "max_num_seqs": 8, "max_num_batched_tokens": 64,
                   "num_threads": 1,
                   "options": {"invariance": "oracle_kernels", "tensor_parallel_size": 2, "audit": False,
                               "env": {"VLLM_CPU_OMP_THREADS_BIND": "0|1", "PYTHONPATH": path,
                                       vllm_planted_tp.ENV: str(folder / "fault")}}},
        "prompts": {"random": {"count": 1, "min_len": 8, "max_len": 12, "seed": 0}},
        "sampling": {"max_tokens": 3, "logits": "full"},
        "schedule": {"trials": 3, "seed": 1, "batch_size": [2, 3], "filler_len": [3, 8], "filler_max_tokens": [2, 3],
                     "repeat_trials": 0, "max_shrink_runs": 3},
        "checks": {"invariance": {"requirement": "required", "localize": "all"}, "fidelity": "off", "drift": "off",
                   "negative_control": "off", "prefill_decode": "off", "prefix_cache": "off", "tp_parity": "off"},
    }
    yaml_path = tmp_path / "tp2.yaml"
    yaml_path.write_text(yaml.safe_dump(config))
    assert main(["run", str(yaml_path), "--report-dir", str(tmp_path / "report")]) == 1  # invariance fails
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    found = [d for d in report["divergences"] if d["check"] == "invariance"]
    assert found and any(d["evidence"].get("shrunk") for d in found), "the failing trial is shrunk"
    for op in assert_every_failure_names_the_all_reduce(found, rank=1):  # the logic the two-GPU test shares
        assert (op["module"], op["layer"]) == ("model.layers.0.self_attn.o_proj", 0), op
        assert op["confirmation"] == "confirmed", op["confirm_note"]
    trials = {d["trial_id"] for d in found}
    print(f"\noracle run, planted all-reduce: {len(trials)} failing trials, each localized to rank 1's all-reduce")
