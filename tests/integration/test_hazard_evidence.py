"""Evidence classes of the known hazards a run matched (`environment.posture.hazards`, oracle.posture.evidence), on
the native engine: `verified` when the pass evidence shows each probe side formed, `failed` on a divergence at
the crossing, `not verified` naming the side that did not form and what prevented it; a side that did not form
never counts as crossed. Each view says the class.

The hazards are declared for `engine: native` by a hazards file of the test; the planted fault (failed) and the
engine that ignores a trial's budget (a side that ran without forming) are tests/support/hazard_engine.py's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from oracle.config import parse_config
from oracle.posture import report_posture
from oracle.render.files import write_formats
from oracle.report import Report
from oracle.runner import run

HAZARD = {"id": "native-test-hazard", "title": "a threshold of the native engine (test)", "engine": "native",
          "when": {"device": "cpu"}, "threshold": "a chunked prompt; a shared prefix of 24 tokens",
          "references": ["tests/integration/test_hazard_evidence.py"]}
CHECKS = {"invariance": {"requirement": "required", "localize": "off"}, "repeatability": "off", "fidelity": "off",
          "drift": "off", "negative_control": "off", "prefill_decode": "off", "prefix_cache": "off"}


def _config(model: Path, tmp_path: Path, probes: list[Any], kind: str = "native",
            **engine: Any) -> dict[str, Any]:
    (tmp_path / "hazards.yaml").write_text(yaml.safe_dump([{**HAZARD, "probes": probes}]))
    return {
        "model": str(model), "hazards": str(tmp_path / "hazards.yaml"),
        "engine": {"kind": kind, "max_num_batched_tokens": 64, "enable_prefix_caching": True, "block_size": 8,
                   **engine},
        "prompts": {"random": {"count": 2, "min_len": 20, "max_len": 30}},
        "sampling": {"max_tokens": 3},
        "schedule": {"trials": 2, "batch_size": [1, 2], "repeat_trials": 0, "shrink": False},
        "checks": CHECKS,
        "report_dir": str(tmp_path / "report"),
    }


def _evidence(report: Report) -> Any:
    assert report.posture is not None
    (h,) = report.posture.hazards
    return h


def _invariance(report: Report) -> Any:
    return next(c for c in report.checks if c.name == "invariance")


def test_a_hazard_crossed_on_both_sides_is_verified_by_its_pass_evidence_in_every_view(tiny_qwen3: Path,
                                                                                       tmp_path: Path) -> None:
    report = run(parse_config(_config(tiny_qwen3, tmp_path, ["short_budget", {"shared_prefix": 24}])),
                 views=[write_formats])
    assert _invariance(report).verdict == "pass"
    h = _evidence(report)
    assert h.evidence == "verified" and h.divergent == []
    probe = {t.trial_id: t.probe for t in report.schedule if t.probe}
    sides = {f"{p.probe}:{s.side}": s for p in h.probes for s in p.sides}
    assert [p.evidence for p in h.probes] == ["verified", "verified"]
    assert set(sides) == {"short_budget:below", "short_budget:above", "shared_prefix=24:below", "shared_prefix=24:at"}
    for key, s in sides.items():  # each side's formed trials are its own, shown by their passes
        assert [probe[t] for t in s.formed] == [key] and s.not_formed == ""
    assert sides["short_budget:above"].shown.endswith(": chunked")
    assert sides["short_budget:below"].shown.endswith(": not chunked")
    assert "all 8 sequences sharing the prefix" in sides["shared_prefix=24:at"].shown

    folder = tmp_path / "report"
    written = json.loads((folder / "report.json").read_text())["environment"]["posture"]
    assert written["hazards"][0]["evidence"] == "verified"
    assert written["digest"] == report_posture(report.environment["engines"]).digest  # outside the digests
    line = "hazard native-test-hazard: verified: short_budget:below trial"
    assert line in (folder / "summary.md").read_text()
    assert "<td>native-test-hazard</td><td>verified</td><td>short_budget:below trial" in (folder / "report.html").read_text()
    junit = (folder / "junit.xml").read_text()
    assert 'name="hazard.native-test-hazard.evidence" value="verified"' in junit


def test_the_console_says_the_class(tiny_qwen3: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from oracle.cli import main

    cfg = _config(tiny_qwen3, tmp_path, ["short_budget"], max_num_batched_tokens=16)
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    main(["run", str(tmp_path / "cfg.yaml")])
    out = " ".join(capsys.readouterr().out.split())
    assert "hazard native-test-hazard: not verified: short_budget:below not formed: engine.max_num_batched_tokens 16" \
        in out


@pytest.mark.parametrize(("probes", "engine", "unformed", "limit"), [
    # The engine's budget cannot hold the longest target (20-30 tokens) and the filler in one pass.
    (["short_budget"], {"max_num_batched_tokens": 16}, ["short_budget:below"], "engine.max_num_batched_tokens 16 <"),
    # Fewer sequences than the 8 sharing the prefix: neither side can form.
    ([{"shared_prefix": 24}], {"max_num_seqs": 4}, ["shared_prefix=24:below", "shared_prefix=24:at"],
     "engine.max_num_seqs 4 < 8"),
], ids=["token-budget", "max-num-seqs"])
def test_a_limit_that_rules_out_a_side_leaves_the_hazard_not_verified_naming_it(
        tiny_qwen3: Path, tmp_path: Path, probes: list[Any], engine: dict[str, Any], unformed: list[str],
        limit: str) -> None:
    report = run(parse_config(_config(tiny_qwen3, tmp_path, probes, **engine)))
    h = _evidence(report)
    assert h.evidence == "not verified"
    (p,) = h.probes
    assert p.evidence == "not verified"
    missing = {f"{p.probe}:{s.side}": s for s in p.sides if not s.formed}
    assert sorted(missing) == sorted(unformed)
    assert all(s.not_formed.startswith(limit) and s.formed == [] for s in missing.values())
    assert all(f"{key} not formed: {limit}" in h.why for key in unformed)
    (record,) = report.hazard_probes  # a side that did not form is never counted crossed
    crossing = {t.trial_id for t in report.schedule if t.probe in unformed}
    assert crossing == set() and not set(record.crossed_by) & crossing


def test_a_side_that_ran_without_forming_is_not_verified_and_never_crossed(tiny_qwen3: Path, tmp_path: Path) -> None:
    """The engine runs short_budget's `above` trial under its own budget of 64, not the trial's: the target's
    prompt is prefilled in one pass, so the side did not form, whatever the probe meant."""
    cfg = _config(tiny_qwen3, tmp_path, ["short_budget"], kind="hazard_engine:BudgetBlindEngine")
    cfg["engine"]["options"] = {"min_tokens": 100_000}  # no planted fault
    report = run(parse_config(cfg))
    above = next(t.trial_id for t in report.schedule if t.probe == "short_budget:above")
    h = _evidence(report)
    assert h.evidence == "not verified"
    (p,) = h.probes
    sides = {s.side: s for s in p.sides}
    assert sides["below"].formed and sides["above"].formed == []
    assert sides["above"].not_formed.startswith(f"trial {above}: the target's prefill took 1 pass under a budget")
    assert sides["above"].not_formed.endswith(": not chunked")
    (record,) = report.hazard_probes
    assert above not in record.crossed_by
    assert _invariance(report).verdict == "vacuous"  # the matched hazard went uncrossed: no pass


def test_a_planted_batch_fault_at_the_crossing_is_failed(tiny_qwen3: Path, tmp_path: Path) -> None:
    """down_proj's matmul moves by one ULP in passes over 48 tokens (tests/support/hazard_engine.py): the probe's
    `above` trial (a pass of 49 tokens) diverges, its `below` one (48) does not."""
    cfg = _config(tiny_qwen3, tmp_path, [{"pass_tokens": 48}], kind="hazard_engine:HazardEngine",
                  max_num_batched_tokens=256, enable_prefix_caching=False)
    cfg["engine"]["options"] = {"min_tokens": 48}
    cfg["prompts"]["random"].update(min_len=4, max_len=8)
    report = run(parse_config(cfg), views=[write_formats])
    assert _invariance(report).verdict == "fail"
    probe = {t.trial_id: t.probe for t in report.schedule if t.probe}
    h = _evidence(report)
    assert h.evidence == "failed"
    assert [probe.get(t) for t in h.divergent] == ["pass_tokens=48:above"]
    (p,) = h.probes
    assert p.evidence == "failed" and p.divergent == h.divergent
    assert all(s.formed for s in p.sides)  # both sides formed: the fault is at the crossing
    assert "diverged from the solo reference at the crossing" in h.why
    junit = (tmp_path / "report" / "junit.xml").read_text()
    assert 'name="hazard.native-test-hazard.evidence" value="failed"' in junit


def test_a_run_without_a_matched_hazard_writes_no_evidence(tiny_qwen3: Path, tmp_path: Path) -> None:
    cfg = _config(tiny_qwen3, tmp_path, ["short_budget"])
    del cfg["hazards"]
    report = run(parse_config(cfg), views=[write_formats])
    assert report.hazards == [] and report.posture is not None and report.posture.hazards == []
    written = json.loads((tmp_path / "report" / "report.json").read_text())["environment"]["posture"]
    assert "hazards" not in written
    assert "hazard " not in (tmp_path / "report" / "summary.md").read_text()


def test_every_probe_is_verified_by_the_native_engines_pass_evidence(tiny_qwen3: Path, tmp_path: Path) -> None:
    """Each probe's evidence rule (oracle/posture/formed.py) reads its sides as formed from what the native
    engine reports: pass tokens and sequences, the longest query, KV lengths, chunked prompts, cached tokens.
    tiny-qwen3's hidden state is 64 float32 values (256 bytes): pass_bytes=10240 is a pass of 40 tokens."""
    probes = ["short_budget", "chunk_budget", "prefix_block", "shared_pass", {"pass_tokens": 40},
              {"pass_bytes": 10240}, "fa3_kv_128", "fa3_packed_query"]
    cfg = _config(tiny_qwen3, tmp_path, probes, max_num_batched_tokens=256, dtype="float32")
    cfg["sampling"]["max_tokens"] = 4
    report = run(parse_config(cfg))
    h = _evidence(report)
    assert {p.probe: p.evidence for p in h.probes} == {
        "short_budget": "verified", "chunk_budget": "verified", "prefix_block": "verified",
        "shared_pass": "verified", "pass_tokens=40": "verified", "pass_bytes=10240": "verified",
        "fa3_kv_128": "verified", "fa3_packed_query": "verified"}, h.why
    assert h.evidence == "verified"
    shown = {f"{p.probe}:{s.side}": s.shown for p in h.probes for s in p.sides}
    assert "a pass filled to the budget of 256 tokens with a prompt chunked" in shown["chunk_budget:above"]
    assert shown["prefix_block:below"].endswith("started from 0 cached tokens")
    assert shown["prefix_block:at"].endswith("started from 8 cached tokens")
    assert "held 40 tokens (threshold 40)" in shown["pass_tokens=40:below"]
    assert "prefill pass of 41 tokens" in shown["pass_bytes=10240:above"]
    kv = {side: int(shown[f"fa3_kv_128:{side}"].split("KV length ")[1].split()[0]) for side in ("below", "above")}
    assert kv["below"] <= 128 < kv["above"]
