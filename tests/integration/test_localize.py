"""Localization on real tiny checkpoints: planted one-op faults are named by module, op, layer and position."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from planted import PlantedEngine

from oracle.capture import capture_run, localize_captured
from oracle.compare import first_divergence
from oracle.engines.contract import Request, SamplingParams
from oracle.engines.native import NativeEngine
from oracle.engines.native.model import Decoder
from oracle.localize import LocalizedOp, RunSpec, localize_runs, localize_trial

SAMPLING = SamplingParams(max_tokens=4, logits="full")
RNG = random.Random(3)
TARGET = tuple(RNG.randrange(512) for _ in range(24))
FILLERS = [tuple(RNG.randrange(512) for _ in range(n)) for n in (30, 12, 20)]
DOWN_PROJ = "model.layers.1.mlp.down_proj"
ATTN0 = "model.layers.0.self_attn.attn"


def target(arrival_step: int = 0) -> Request:
    return Request("target", TARGET, SAMPLING, arrival_step=arrival_step)


def fillers(arrival_step: int = 0, max_tokens: int = 3) -> list[Request]:
    return [Request(f"f{i}", p, SamplingParams(max_tokens=max_tokens, logits="none"), arrival_step=arrival_step)
            for i, p in enumerate(FILLERS)]


@pytest.fixture(scope="module")
def decoder(tiny_qwen3: Path) -> Decoder:
    return NativeEngine(tiny_qwen3, "invariant").decoder


def planted(decoder: Decoder, **fault: object) -> PlantedEngine:
    return PlantedEngine(decoder, "invariant", num_threads=1, **fault)  # type: ignore[arg-type]


def test_names_the_planted_mlp_matmul_of_layer_1(decoder: Decoder) -> None:
    engine = planted(decoder, fault_module=DOWN_PROJ, min_tokens=30)
    trial = fillers()[:1] + [target()] + fillers()[1:]
    # The planted fault makes the trial fail the way the oracle sees it: the target's outputs move.
    assert first_divergence(engine.generate([target()])[0], engine.generate(trial)[1]) is not None
    loc = localize_trial(engine, [target()], trial, 1)
    assert loc is not None
    assert (loc.module, loc.op, loc.layer) == (DOWN_PROJ, "aten.mm.default", 1)
    assert loc.positions == tuple(range(len(TARGET)))  # the prefill pass: every prompt token moved
    assert loc.forward_pass == 0 and loc.engine_step == 0
    assert loc.shape == (30 + len(TARGET) + 12 + 20, 64)
    assert loc.ulp == 1 and loc.max_abs_diff is not None and 0 < loc.max_abs_diff < 1e-5
    assert loc.inputs_equal is True and loc.still_diverged
    assert loc.pass_evidence["num_seqs"] == 4 and loc.pass_evidence["num_tokens"] == 86
    assert loc.pass_evidence["target_is_prefill"] is True
    line = loc.describe()
    assert DOWN_PROJ in line and "aten.mm.default" in line and "1 ULP" in line and "num_seqs 4" in line
    assert LocalizedOp.from_json(loc.to_json()) == loc


def test_names_the_attention_op_when_a_decode_shares_a_pass_with_a_prefill(decoder: Decoder) -> None:
    # Only passes above 40 tokens are hit: the target's prefill (24) alone is not, its decode beside
    # the fillers' prefills (arriving at step 2) is: the FA3-style break of a decode next to a prefill.
    engine = planted(decoder, fault_module=ATTN0, fault_op="oracle_kernels.paged_attention.default",
                     min_tokens=40)
    trial = [target()] + fillers(arrival_step=2)
    loc = localize_trial(engine, [target()], trial, 0)
    assert loc is not None
    assert (loc.module, loc.op, loc.layer) == (ATTN0, "oracle_kernels.paged_attention.default", 0)
    assert loc.engine_step == 2 and loc.forward_pass == 2
    assert loc.positions == (len(TARGET) + 1,)  # the second generated token's position
    assert loc.pass_evidence["target_is_prefill"] is False
    assert loc.pass_evidence["num_prefill_tokens"] == sum(len(p) for p in FILLERS)
    assert loc.pass_evidence["num_decode_tokens"] == 1
    assert loc.inputs_equal is True


def test_nothing_differs_gives_none(decoder: Decoder) -> None:
    engine = planted(decoder, min_tokens=10_000)  # the fault never fires
    trial = fillers()[:2] + [target()] + fillers()[2:]
    assert localize_trial(engine, [target()], trial, 2, 16) is None


def test_chunked_prefill_rows_align_by_position(decoder: Decoder) -> None:
    engine = planted(decoder, min_tokens=10_000)
    # The filler ahead of it takes 30 of the 40-token budget: the target's prompt runs in 10 + 14 tokens.
    solo, trial = RunSpec((target(),), 0), RunSpec((*fillers()[:1], target()), 1, 40)
    expected, actual = capture_run(engine.capture, solo), capture_run(engine.capture, trial)
    assert [p.evidence["target_num_tokens"] for p in actual.passes[:2]] == [10, 14]
    assert actual.passes[0].evidence["target_chunked"] and not expected.passes[0].evidence["target_chunked"]
    # Every prompt position of the chunked run found its row in the unchunked one, all bitwise equal.
    at = expected.rows_at()
    down = [c for c in actual.calls if c.key == (DOWN_PROJ, "aten.mm.default", 0)]
    assert sorted(p for c in down for p in c.positions)[: len(TARGET)] == list(range(len(TARGET)))
    assert all((c.key, p) in at for c in down for p in c.positions)
    assert localize_captured(expected, actual).op is None


def test_chunked_target_localized_to_its_first_chunk(decoder: Decoder) -> None:
    engine = planted(decoder, fault_module=DOWN_PROJ, min_tokens=36)
    loc = localize_trial(engine, [target()], [*fillers()[:1], target()], 1, 40)
    assert loc is not None and loc.module == DOWN_PROJ
    assert loc.positions == tuple(range(10))  # the first chunk (40 tokens); the second (15) is under 36
    assert loc.pass_evidence["target_chunked"] is True and loc.pass_evidence["num_tokens"] == 40


def test_warm_run_localized_against_a_cold_one(decoder: Decoder, tiny_qwen3: Path) -> None:
    # A fault above 20 tokens: the cold prefill (24 tokens) is hit, the warm one (cache hit: 8 tokens) is not.
    engine = PlantedEngine(decoder, "invariant", num_threads=1, enable_prefix_caching=True, min_tokens=20)
    cold = RunSpec((target(),), 0)
    warm = RunSpec((target(),), 0, warm_with=(target(),))
    loc = localize_runs(engine, cold, warm)
    assert loc is not None and loc.module == DOWN_PROJ
    assert loc.positions == tuple(range(16, len(TARGET)))  # only the uncached tail is computed warm


def test_transformers_engine_names_the_planted_op(tiny_qwen3: Path) -> None:
    pytest.importorskip("transformers")
    from planted import PlantedTransformersEngine

    engine = PlantedTransformersEngine(tiny_qwen3, "invariant", fault_module=DOWN_PROJ, min_tokens=30, num_threads=1)
    trial = [target(), Request("f", FILLERS[0], SAMPLING)]
    loc = localize_trial(engine, [target()], trial, 0)
    assert loc is not None
    assert (loc.module, loc.op, loc.layer) == (DOWN_PROJ, "aten.mm.default", 1)
    assert loc.positions == tuple(range(len(TARGET)))
    assert loc.pass_evidence["num_seqs"] == 2 and loc.inputs_equal is True
    quiet = PlantedTransformersEngine(tiny_qwen3, "invariant", min_tokens=10_000, num_threads=1)
    assert localize_trial(quiet, [target()], trial, 0) is None
