"""Hazard probes (oracle.posture.probes): trials on each side of a known threshold, made from the seed, the
engine's config and the model.

The planted fault (tests/support/fa3_engine.py) is FA3's break: invariant mode diverges only where a
decode of the target shares a pass with more than 64 query tokens of others (x GQA) while the
target's KV length is over 128. The config's random ranges never reach it (prompts of at most 64
tokens, at most 8 fillers, max_tokens 16: the target's KV length stays at or below 80), so only the
probes can find it, at every seed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import pytest

from oracle.config import ProbeName, parse_config
from oracle.plan import plan_run
from oracle.posture.probes import PROBES
from oracle.runner import run


@pytest.fixture
def fake_model(fake_model: Path) -> Path:
    """The fake checkpoint with its heads named (GQA ratio 1): FA3's packed-query probe needs the ratio."""
    import json

    config = json.loads((fake_model / "config.json").read_text())
    (fake_model / "config.json").write_text(json.dumps({**config, "num_attention_heads": 4,
                                                        "num_key_value_heads": 4, "hidden_size": 64}))
    return fake_model


def fa3_config(model: Path, probes: list[str] | None = None, **engine: Any) -> dict[str, Any]:
    schedule: dict[str, Any] = {"trials": 8, "batch_size": [1, 9], "filler_len": [1, 64], "repeat_trials": 0,
                                "shrink": False}
    schedule["probes"] = "all" if probes is None else probes
    return {
        "model": str(model),
        "engine": {"kind": "fa3_engine:Fa3Engine", **engine},
        "prompts": {"random": {"count": 3, "min_len": 8, "max_len": 64}},
        "sampling": {"max_tokens": 16},
        "schedule": schedule,
        "checks": {"prefill_decode": "off", "prefix_cache": "off", "negative_control": "off", "fidelity": "off",
                   "repeatability": "off"},
    }


def test_probe_names_match_the_config_field() -> None:
    assert get_args(ProbeName) == PROBES


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_probes_find_the_planted_fa3_break_that_random_ranges_never_reach(
        fake_model: Path, tmp_path: Path, seed: int) -> None:
    alone = run(parse_config(fa3_config(fake_model, probes=[])), seed=seed, report_dir=tmp_path / "alone")
    assert next(c for c in alone.checks if c.name == "invariance").verdict == "pass"
    assert all(not t.probe for t in alone.schedule)

    found = run(parse_config(fa3_config(fake_model)), seed=seed, report_dir=tmp_path / "probes")
    invariance = next(c for c in found.checks if c.name == "invariance")
    assert invariance.verdict == "fail"
    probe = {t.trial_id: t.probe for t in found.schedule}
    failing = {probe[d.trial_id] for d in found.divergences if d.check == "invariance"}  # type: ignore[index]
    # Exactly the sides over both thresholds fail: the two below 128 or 64 pass; the 256 and 512 probes'
    # lower sides still hold a KV length over 128.
    assert failing == {"fa3_packed_query:above", "fa3_kv_128:above", "fa3_kv_256:below", "fa3_kv_256:above",
                       "fa3_kv_512:below", "fa3_kv_512:above"}
    print(f"seed {seed}: found by {sorted(failing)}")
    # The coverage table counts each probe's sides (the fake engine has neither chunked prefill nor a cache on).
    for name in ("fa3_packed_query", "fa3_kv_128", "fa3_kv_256", "fa3_kv_512"):
        assert found.coverage[f"probe {name}: below"] == 1 and found.coverage[f"probe {name}: above"] == 1


def test_the_coverage_table_counts_every_side_of_the_budget_and_block_probes(
        fake_model: Path, tmp_path: Path) -> None:
    cfg = fa3_config(fake_model, probes=["chunk_budget", "prefix_block"], max_num_batched_tokens=96,
                     enable_prefix_caching=True, block_size=16)
    report = run(parse_config(cfg), seed=1, report_dir=tmp_path)
    sides = {k: v for k, v in report.coverage.items() if k.startswith("probe ")}
    assert sides == {f"probe {p}: {s}": 1 for p in ("chunk_budget", "prefix_block") for s in ("below", "at", "above")}
    budget = [t for t in report.schedule if t.probe.startswith("chunk_budget")]
    target_len = {s: len(plan_run(parse_config(cfg), seed=1).targets[t.target].token_ids) for t in budget
                  for s in [t.probe]}
    demand = {t.probe: target_len[t.probe] + sum(f.length for f in t.fillers) for t in budget}
    assert demand == {"chunk_budget:below": 95, "chunk_budget:at": 96, "chunk_budget:above": 97}
    shared = {t.probe: t.fillers[0].shared_prefix for t in report.schedule if t.probe.startswith("prefix_block")}
    assert shared == {"prefix_block:below": 15, "prefix_block:at": 16, "prefix_block:above": 17}


def test_same_seed_same_probes_and_probes_never_move_the_drawn_schedule(fake_model: Path) -> None:
    a = plan_run(parse_config(fa3_config(fake_model)), seed=7)
    b = plan_run(parse_config(fa3_config(fake_model)), seed=7)
    off = plan_run(parse_config(fa3_config(fake_model, probes=[])), seed=7)
    assert a.trials == b.trials and a.targets == b.targets
    assert a.trials[: len(off.trials)] == off.trials and a.targets[: len(off.targets)] == off.targets
    probes = a.trials[len(off.trials):]
    assert probes and all(t.probe for t in probes)
    assert [t.trial_id for t in probes] == list(range(len(off.trials), len(a.trials)))
    other = plan_run(parse_config(fa3_config(fake_model)), seed=8)
    assert [t.probe for t in other.trials if t.probe] == [t.probe for t in probes]  # same strata, other draws
    assert other.trials[len(off.trials):] != probes
    only = plan_run(parse_config(fa3_config(fake_model, probes=["fa3_kv_256"])), seed=7)
    assert [t.probe for t in only.trials if t.probe] == ["fa3_kv_256:below", "fa3_kv_256:above"]


@pytest.mark.parametrize("n", [2, 3])
def test_merged_shards_with_probes_equal_the_unsharded_run(fake_model: Path, tmp_path: Path, n: int) -> None:
    from test_shard import _assert_equal

    data = fa3_config(fake_model)
    data["schedule"]["seed"] = 2
    data["report_dir"] = str(tmp_path / "r")
    merged = _assert_equal(tmp_path, data, n)
    assert merged["coverage"]["probe fa3_kv_256: above"] == 1 and merged["exit_code"] == 1


def _model_dir(tmp_path: Path, config_json: dict[str, Any]) -> Path:
    import json

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(config_json))
    return tmp_path / "m"


def test_model_facts_read_every_spelling_and_a_multimodal_text_config(tmp_path: Path) -> None:
    from oracle.models.facts import read_model_facts

    facts = read_model_facts(_model_dir(tmp_path, {"architectures": ["X"], "text_config": {
        "n_head": 32, "n_kv_heads": 8, "hidden_size": 4096}})).hazard_facts()
    assert facts == {"head_dim": 128, "num_attention_heads": 32, "num_key_value_heads": 8, "architecture": "X",
                     "gqa_ratio": 4, "sliding_window": 0, "linear_attention": False}


def test_without_a_known_gqa_ratio_the_packed_query_probe_is_left_out(tmp_path: Path, fake_model: Path) -> None:
    """FA3's packed-query threshold is query length x GQA ratio: with heads unknown no side can be placed
    honestly, so that probe makes no trials (the KV-length probes, well over the limit, still run)."""
    from oracle.models.facts import read_model_facts
    from oracle.posture.probes import make_probes
    from oracle.prompts import Target

    headless = read_model_facts(_model_dir(tmp_path, {"hidden_size": 64, "vocab_size": 128}))
    assert "gqa_ratio" not in headless.hazard_facts() and headless.gqa_ratio is None
    config = parse_config(fa3_config(fake_model))
    targets = [Target("t", (1, 2, 3))]
    names = {t.probe.partition(":")[0] for t in make_probes(config, targets, headless, 1, 0, 128).trials}
    assert "fa3_packed_query" not in names and "fa3_kv_128" in names
    known = {t.probe.partition(":")[0] for t in make_probes(config, targets, read_model_facts(fake_model), 1, 0,
                                                                   128).trials}
    assert "fa3_packed_query" in known


@pytest.mark.parametrize(("flag", "sampler"), [("1", "flashinfer"), ("0", "torch (VLLM_USE_FLASHINFER_SAMPLER=0)"),
                                               (None, "unknown")])
def test_vllm_sampler_posture_follows_the_flag_and_is_unknown_unset(flag: str | None, sampler: str) -> None:
    from oracle.posture import UNKNOWN, _vllm_sampler

    env = {} if flag is None else {"VLLM_USE_FLASHINFER_SAMPLER": flag}
    assert _vllm_sampler(env) == (UNKNOWN if sampler == "unknown" else sampler)


def test_a_quantity_the_engine_does_not_report_forms_no_side() -> None:
    """A custom engine's evidence without the longest query, the KV length or chunked prompts (None) shows no
    fa3, chunk_budget or pass_bytes side formed, and says which quantity was missing; with them it does."""
    from oracle.engines.contract import StepEvidence
    from oracle.posture.formed import Side, side_of
    from oracle.schedule import Filler, Trial

    fa3 = Trial(3, 0, 0, 0, (Filler(1, 66, 1, 2),), None, probe="fa3_kv_128:above")
    bare = [StepEvidence(0, 1, 129, True), StepEvidence(1, 1, 1, False, token_index=0),
            StepEvidence(2, 2, 67, False, token_index=1)]
    side = side_of(fa3, bare)
    assert side is not None and not side.formed and "does not report the pass's longest query" in side.shown
    told = [*bare[:2], StepEvidence(2, 2, 67, False, token_index=1, max_query_len=66, kv_len=131)]
    assert side_of(fa3, told) == Side(True, "trial 3: the target decoded at KV length 131 beside a prefill of 66 tokens")
    below = Trial(4, 0, 0, 0, (Filler(1, 66, 1, 2),), None, probe="fa3_kv_128:below")
    assert not side_of(below, told).formed  # type: ignore[union-attr]  # KV 131 is over 128
    whole = Trial(5, 0, 0, 0, (Filler(1, 20, 1, 0),), None, probe="pass_bytes=10240:above")
    side = side_of(whole, [StepEvidence(0, 2, 41, True)])
    assert side is not None and not side.formed and "does not report whether a prompt" in side.shown
    assert side_of(whole, [StepEvidence(0, 2, 41, True, has_chunked=False)]).formed  # type: ignore[union-attr]
