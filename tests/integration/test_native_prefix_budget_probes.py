"""The shared-prefix and short-budget probes (oracle.posture.probes) on the native engine: each side forms
as planned, the pass evidence says so, and a side that did not form never counts as crossed.

A hazards file of the test declares both probes for `engine: native` (a shared prefix of 24 tokens, so the
run stays small), so the report's `hazard_probes` lists the trials that crossed and the sides that did not form.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from oracle.config import parse_config
from oracle.engines.contract import StepEvidence
from oracle.posture.formed import crossed, unformed_side
from oracle.posture.hazards import ProbeSpec
from oracle.runner import run
from oracle.schedule import Filler, Trial

HAZARD = {"id": "native-prefix-and-budget", "title": "probes of a shared prefix and a short budget (test)",
          "engine": "native", "when": {"device": "cpu"}, "threshold": "a shared prefix of 24 tokens; a chunked prompt",
          "references": ["tests/integration/test_native_prefix_budget_probes.py"],
          "probes": [{"shared_prefix": 24}, "short_budget"]}


def _config(model: Path, tmp_path: Path, budget: int = 64) -> dict[str, Any]:
    (tmp_path / "hazards.yaml").write_text(yaml.safe_dump([HAZARD]))
    return {
        "model": str(model), "hazards": str(tmp_path / "hazards.yaml"),
        "engine": {"kind": "native", "max_num_batched_tokens": budget, "enable_prefix_caching": True,
                   "block_size": 8},
        "prompts": {"random": {"count": 2, "min_len": 20, "max_len": 30}},
        "sampling": {"max_tokens": 3},
        "schedule": {"trials": 2, "batch_size": [1, 2], "repeat_trials": 0, "shrink": False},
        "checks": {"invariance": {"requirement": "required", "localize": "off"}, "repeatability": "off",
                   "fidelity": "off", "drift": "off", "negative_control": "off", "prefill_decode": "off",
                   "prefix_cache": "off"},
        "report_dir": str(tmp_path / "report"),
    }


def test_both_probes_form_both_sides_on_the_native_engine_and_invariance_holds(tiny_qwen3: Path,
                                                                               tmp_path: Path) -> None:
    report = run(parse_config(_config(tiny_qwen3, tmp_path)))
    assert report.error is None
    invariance = next(c for c in report.checks if c.name == "invariance")
    assert invariance.verdict == "pass", invariance.message
    probe = {t.trial_id: t.probe for t in report.schedule if t.probe}
    assert sorted(probe.values()) == ["shared_prefix=24:at", "shared_prefix=24:below", "short_budget:above",
                                      "short_budget:below"]
    (record,) = report.hazard_probes
    assert record.not_formed == [] and record.untested == ""
    assert sorted(probe[t] for t in record.crossed_by) == ["shared_prefix=24:at", "short_budget:above"]
    shared = [t for t in report.schedule if t.probe.startswith("shared_prefix")]
    assert {t.probe: max(f.shared_prefix for f in t.fillers) for t in shared} == {
        "shared_prefix=24:below": 23, "shared_prefix=24:at": 24}
    assert all(len(t.fillers) == 7 for t in shared)
    budget = {t.probe: t for t in report.schedule if t.probe.startswith("short_budget")}
    assert budget["short_budget:above"].max_num_batched_tokens < 30  # below the longest target's prompt
    assert budget["short_budget:below"].target == budget["short_budget:above"].target


def test_a_budget_that_rules_out_a_side_names_it_and_the_other_still_crosses(tiny_qwen3: Path,
                                                                             tmp_path: Path) -> None:
    """An engine budget of 16 cannot hold the longest target (20-30 tokens) and the filler in one pass: the
    short budget's below side is ruled out, with the limit; the above side still forms and crosses."""
    cfg = _config(tiny_qwen3, tmp_path, budget=16)
    only_budget = {**HAZARD, "probes": ["short_budget"]}
    (tmp_path / "hazards.yaml").write_text(yaml.safe_dump([only_budget]))
    report = run(parse_config(cfg))
    (record,) = report.hazard_probes
    assert [n.probe for n in record.not_formed] == ["short_budget:below"]
    assert "engine.max_num_batched_tokens 16" in record.not_formed[0].limit
    assert [t.probe for t in report.schedule if t.trial_id in record.crossed_by] == ["short_budget:above"]


def _ev(*prefill_tokens: int, decode_seqs: int = 1) -> list[StepEvidence]:
    passes = [StepEvidence(i, 1, n, True, chunked=len(prefill_tokens) > 1) for i, n in enumerate(prefill_tokens)]
    return [*passes, StepEvidence(len(passes), decode_seqs, decode_seqs, False, token_index=0)]


def test_a_probe_side_whose_evidence_shows_it_did_not_form_never_counts_as_crossed() -> None:
    """The engine ignored the trial's budget (one prefill pass) or never batched the sharers: not crossed."""
    short = Trial(5, 0, 0, 0, (Filler(1, 4, 2, 0),), 10, probe="short_budget:above")
    spec = ProbeSpec("short_budget")
    assert not crossed(spec, short, _ev(24))
    assert unformed_side(short, _ev(24)) == ("trial 5: the target's prefill took 1 pass under a budget of 10: "
                                             "not chunked")
    assert crossed(spec, short, _ev(10, 10, 4))
    below = Trial(6, 0, 0, 0, (Filler(1, 4, 2, 0),), 40, probe="short_budget:below")
    assert unformed_side(below, _ev(10, 10, 4)) is not None and unformed_side(below, _ev(28)) is None
    fillers = tuple(Filler(i, 28, 2, 1, shared_prefix=24) for i in range(7))
    sharing = Trial(7, 0, 3, 1, fillers, None, probe="shared_prefix=24:at")
    spec24 = ProbeSpec("shared_prefix", 24)
    assert not crossed(spec24, sharing, _ev(32, decode_seqs=5))
    assert "at most 5 of the 8 sequences" in (unformed_side(sharing, _ev(32, decode_seqs=5)) or "")
    assert crossed(spec24, sharing, _ev(32, decode_seqs=8))

