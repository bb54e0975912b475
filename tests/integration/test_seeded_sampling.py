"""Seeded sampling and two engine instances on the native engine (tiny Qwen3, CPU): the checks pass on the
real engine and catch planted faults: a batch that shares one seed's noise (vLLM #50440), and an engine
whose instances differ by one ULP (tests/support/seed_fault.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from oracle.compare import first_divergence
from oracle.config import EngineConfig, parse_config
from oracle.engines.contract import Request, SamplingParams
from oracle.engines.native import NativeEngine
from oracle.report import Report
from oracle.runner import run

ROOT = Path(__file__).resolve().parents[2]
CHECKS_OFF = {"repeatability": "off", "fidelity": "off", "drift": "off", "negative_control": "off",
              "prefill_decode": "off", "prefix_cache": "off"}


def _run(tmp_path: Path, kind: str = "native", engine: dict[str, Any] | None = None,
         schedule: dict[str, Any] | None = None, **checks: Any) -> Report:
    data = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    data["engine"].update(engine or {})
    data["report_dir"] = str(tmp_path / "report")
    data["schedule"].update(seed=3, trials=6, repeat_trials=0, shrink=False, **(schedule or {}))
    data["checks"] = {**CHECKS_OFF, "invariance": "required", **checks}
    if kind != "native":
        e = data.pop("engine")
        data["engine"] = {"kind": kind, "options": {k: e[k] for k in (
            "device", "dtype", "max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill",
            "enable_prefix_caching", "num_threads")}}
    return run(parse_config(data))


VARIANTS = [SamplingParams(max_tokens=10, temperature=1.0), SamplingParams(max_tokens=10, temperature=1.0, top_p=0.9),
            SamplingParams(max_tokens=10, temperature=0.7, top_k=8)]


@pytest.mark.parametrize("sampling", VARIANTS, ids=["t1", "top_p", "top_k"])
def test_a_seeded_request_is_bitwise_the_same_alone_and_in_a_batch(tiny_qwen3: Path, sampling: SamplingParams) -> None:
    """Invariant mode: the request with seed 5 alone, then beside the same prompt with seed 6 and other prompts
    arriving later: the same tokens and logprob bits; the seed-6 twin samples other tokens."""
    engine = NativeEngine(tiny_qwen3, "invariant", EngineConfig.of("native", num_threads=1))
    prompt = (3, 14, 15, 92, 65, 35, 89, 79)
    mine = Request("mine", prompt, SamplingParams(**{**sampling.__dict__, "seed": 5}))
    twin = Request("twin", prompt, SamplingParams(**{**sampling.__dict__, "seed": 6}))
    others = [Request(f"other{i}", tuple(range(10 + i, 30 + 2 * i)), SamplingParams(**{**sampling.__dict__, "seed": i}),
                      arrival_step=i) for i in range(3)]
    alone = engine.generate([mine])[0]
    batch = engine.generate([others[0], twin, mine, *others[1:]])
    assert first_divergence(alone, batch[2]) is None
    assert batch[1].token_ids != batch[2].token_ids
    assert max(e.num_seqs for e in batch[2].evidence) >= 3  # it really shared passes


def test_seeded_sampling_passes_on_the_native_engine_and_names_its_seeds(tiny_qwen3: Path, tmp_path: Path) -> None:
    report = _run(tmp_path, seeded_sampling="required")
    result = report.check("seeded_sampling")
    assert result is not None and result.verdict == "pass", result
    ev = result.evidence
    assert ev["requests_compared"] == 3 * 4 * 2 and ev["seed_pairs_that_differ_alone"] > 0
    assert len(ev["seeds"]) == 3 and all(len(set(s)) == 4 for s in ev["seeds"])
    assert report.exit_code() == 0


def test_seeded_sampling_that_never_formed_a_batch_is_vacuous(tiny_qwen3: Path, tmp_path: Path) -> None:
    """One sequence per pass: the "batched" runs are solo runs again, so nothing was tested (never `pass`)."""
    report = _run(tmp_path, seeded_sampling="required", invariance="off", engine={"max_num_seqs": 1},
                  schedule={"batch_size": [1, 1]})
    result = report.check("seeded_sampling")
    assert result is not None and result.verdict == "vacuous", result
    assert result.evidence["requests_batched"] == 0 and report.exit_code() == 1


def test_a_batch_that_shares_one_seed_fails_seeded_sampling(tiny_qwen3: Path, tmp_path: Path) -> None:
    report = _run(tmp_path, "seed_fault:SharedSeedEngine", seeded_sampling="required")
    result = report.check("seeded_sampling")
    assert result is not None and result.verdict == "fail"
    assert "share" in result.message and result.evidence["seed_pairs_identical_in_a_batch"] > 0
    divergences = [d for d in report.divergences if d.check == "seeded_sampling"]
    assert divergences and {d.cause for d in divergences} == {"sampling"}
    assert {d.evidence["layout"] for d in divergences} == {"in order", "reversed"}
    assert report.check("invariance").verdict == "pass"  # type: ignore[union-attr]  # greedy cannot see it
    assert report.exit_code() == 1


def test_two_native_instances_agree_and_an_instance_dependent_fault_does_not(tiny_qwen3: Path,
                                                                             tmp_path: Path) -> None:
    good = _run(tmp_path / "good", cross_instance="required", seeded_sampling="off")
    result = good.check("cross_instance")
    assert result is not None and result.verdict == "pass" and result.trials == 8 + 4
    assert "invariant_second_instance_s" in good.timings

    bad = _run(tmp_path / "bad", "seed_fault:InstanceFaultEngine", cross_instance="required", seeded_sampling="off")
    result = bad.check("cross_instance")
    assert result is not None and result.verdict == "fail" and result.divergent == 8 + 4
    assert {d.cause for d in bad.divergences if d.check == "cross_instance"} == {"instance"}
    assert bad.check("invariance").verdict == "pass"  # type: ignore[union-attr]
    assert bad.exit_code() == 1


def test_cross_instance_in_production_mode_runs_production_only(tiny_qwen3: Path, tmp_path: Path) -> None:
    report = _run(tmp_path, invariance="off", seeded_sampling="off",
                  cross_instance={"requirement": "required", "mode": "production", "trials": 2})
    assert list(report.environment["engines"]) == ["production"]
    result = report.check("cross_instance")
    assert result is not None and result.verdict == "pass" and result.evidence["mode"] == "production"




@pytest.mark.parametrize("sampling", VARIANTS[1:], ids=["top_p", "top_k"])
def test_transformers_invariant_mode_samples_each_request_from_its_own_seed(tiny_qwen3: Path,
                                                                            sampling: SamplingParams) -> None:
    """The packed invariant mode of the transformers engine: the same request alone and beside its seed-6 twin
    and a later arrival, bitwise; and the same tokens as the native engine's sampler gives it alone."""
    pytest.importorskip("transformers")
    from oracle.engines.transformers_engine import TransformersEngine

    engine = TransformersEngine(tiny_qwen3, "invariant", EngineConfig.of("transformers", num_threads=1))
    prompt = (3, 14, 15, 92, 65, 35, 89, 79)
    mine = Request("mine", prompt, SamplingParams(**{**sampling.__dict__, "seed": 5}))
    twin = Request("twin", prompt, SamplingParams(**{**sampling.__dict__, "seed": 6}))
    late = Request("late", tuple(range(20, 33)), SamplingParams(**{**sampling.__dict__, "seed": 7}), arrival_step=2)
    alone = engine.generate([mine])[0]
    batch = engine.generate([twin, late, mine])
    assert first_divergence(alone, batch[2]) is None
    assert batch[0].token_ids != batch[2].token_ids
    native = NativeEngine(tiny_qwen3, "invariant", EngineConfig.of("native", num_threads=1)).generate([mine])[0]
    assert native.token_ids == alone.token_ids
