"""The harness end to end over a fake engine with planted faults: each check fails what it must."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from oracle.cli import main
from oracle.config import parse_config
from oracle.runner import run


def _config(model: Path, tmp_path: Path, **options: Any) -> dict[str, Any]:
    return {
        "model": str(model),
        "engine": {"kind": "fake_engine:FakeEngine", "options": options},
        "prompts": {"random": {"count": 3, "min_len": 2, "max_len": 5}},
        "sampling": {"max_tokens": 4},
        "schedule": {"trials": 20, "seed": 7, "batch_size": [1, 12], "repeat_trials": 3},
        "report_dir": str(tmp_path / "report"),
    }


def test_clean_engine_passes(fake_model: Path, tmp_path: Path) -> None:
    report = run(parse_config(_config(fake_model, tmp_path)))
    assert report.check("invariance").verdict == "pass"  # type: ignore[union-attr]
    assert report.check("repeatability").verdict == "pass"  # type: ignore[union-attr]
    assert report.exit_code() == 0
    written = json.loads((tmp_path / "report" / "report.json").read_text())
    assert {"oracle_version", "seed", "config", "config_digest", "environment", "checks", "divergences",
            "timings"} <= written.keys()
    assert written["seed"] == 7


def test_planted_invariant_fault_fails_invariance(fake_model: Path, tmp_path: Path) -> None:
    report = run(parse_config(_config(fake_model, tmp_path, diverge_from_batch=5, diverge_step=2)))
    inv = report.check("invariance")
    assert inv is not None and inv.verdict == "fail" and report.exit_code() == 1
    recs = [d for d in report.divergences if d.check == "invariance"]
    assert recs and all(d.step == 2 and d.kind == "logprob" and d.trial is not None for d in recs)
    assert all(len(d.trial.fillers) + 1 >= 5 for d in recs)  # type: ignore[union-attr]
    assert all(d.cause == "batch" for d in recs)
    assert all(d.ulp is not None and d.ulp > 0 for d in recs)


def test_token_flip_is_reported_as_token(fake_model: Path, tmp_path: Path) -> None:
    report = run(parse_config(_config(fake_model, tmp_path, diverge_from_batch=2, flip_token=True)))
    recs = [d for d in report.divergences if d.check == "invariance"]
    assert recs and recs[0].kind == "token" and recs[0].first_token_step == 0
    assert recs[0].expected_token != recs[0].actual_token


def test_production_fault_is_drift_not_failure(fake_model: Path, tmp_path: Path) -> None:
    report = run(parse_config(_config(fake_model, tmp_path, diverge_from_batch=3, diverge_mode="production")))
    assert report.check("invariance").verdict == "pass"  # type: ignore[union-attr]
    drift = report.check("drift")
    assert drift is not None and drift.divergent > 0 and drift.requirement == "report"
    assert report.exit_code() == 0


def test_never_batched_is_vacuous(fake_model: Path, tmp_path: Path) -> None:
    report = run(parse_config(_config(fake_model, tmp_path, always_alone=True)))
    assert report.check("invariance").verdict == "vacuous"  # type: ignore[union-attr]
    assert report.exit_code() == 1


def test_engine_dying_mid_run_exits_3_with_partial_report(fake_model: Path, tmp_path: Path) -> None:
    cfg = _config(fake_model, tmp_path, fail_after_calls=10)
    path = tmp_path / "c.yaml"
    import yaml

    path.write_text(yaml.safe_dump(cfg))
    assert main(["run", str(path)]) == 3
    written = json.loads((tmp_path / "report" / "report.json").read_text())
    assert "planted engine failure" in written["error"] and written["complete"] is False
    inv = next(c for c in written["checks"] if c["name"] == "invariance")
    assert 0 < inv["trials"] < 20  # what completed before the failure is judged


def test_shrinks_planted_fault_to_batch_7_target_second_and_replays(
    fake_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _config(fake_model, tmp_path, diverge_from_batch=7, diverge_not_first=True)
    cfg["schedule"].update(trials=40, batch_size=[1, 40], filler_len=[1, 30], arrival_step=[0, 3])
    report = run(parse_config(cfg))
    inv = report.check("invariance")
    assert inv is not None and inv.verdict == "fail"
    shrink = inv.evidence["shrink"]
    assert shrink["minimal"] is True and "(minimal)" in inv.message
    minimal = report.trial(shrink["smallest_trial"])
    assert minimal is not None and minimal.origin == "shrink" and minimal.parent is not None
    assert len(minimal.fillers) + 1 == 7 and minimal.position == 1
    assert all(f.length == 1 and f.arrival_step == 0 for f in minimal.fillers)
    shrunk = [d for d in report.divergences if d.shrunk]
    assert len(shrunk) == 1 and shrunk[0].trial == minimal
    # Every shrink candidate is a trial of the report, numbered after the schedule's 40.
    ids = [t.trial_id for t in report.schedule]
    assert ids == list(range(len(ids))) and len(ids) == 40 + shrink["runs"]
    assert set(shrink["tried"]) == {t.trial_id for t in report.schedule if t.origin == "shrink"}
    # oracle replay reruns that trial from the report and shows the same divergence.
    code = main(["replay", str(tmp_path / "report" / "report.json"), "--trial", str(shrunk[0].trial_id), "--trust-report"])
    out = capsys.readouterr().out
    assert code == 1 and "batch 7" in out and "position 1" in out and "same as the report" in out


def test_fault_keyed_on_pass_size_shrinks_to_batch_2_with_a_longer_filler(fake_model: Path, tmp_path: Path) -> None:
    # Diverges once the call's prompts hold 60 tokens: many short fillers are traded for one long one.
    cfg = _config(fake_model, tmp_path, diverge_from_tokens=60)
    cfg["schedule"].update(trials=30, batch_size=[1, 40], filler_len=[1, 80])
    report = run(parse_config(cfg))
    inv = report.check("invariance")
    assert inv is not None and inv.verdict == "fail"
    minimal = report.trial(inv.evidence["shrink"]["smallest_trial"])
    assert minimal is not None and len(minimal.fillers) == 1 and inv.evidence["shrink"]["minimal"]
    assert minimal.fillers[0].length >= 60 - 5  # the target's prompt is at most 5 tokens


def test_nondeterminism_is_labelled_as_such(fake_model: Path, tmp_path: Path) -> None:
    # Every call after the references perturbs the outputs: batch-1 trials differ too, and repeats disagree.
    cfg = _config(fake_model, tmp_path, nondeterministic_from_call=4)
    report = run(parse_config(cfg))
    inv, rep = report.check("invariance"), report.check("repeatability")
    assert inv is not None and inv.verdict == "fail" and "nondeterminism" in inv.message
    assert rep is not None and rep.verdict == "fail" and "nondeterminism" in rep.message
    recs = [d for d in report.divergences if d.check == "invariance" and not d.shrunk]
    alone = [d for d in recs if d.trial is not None and not d.trial.fillers]
    assert alone and all(d.cause == "nondeterminism" for d in alone)
    assert all(d.cause == "nondeterminism" for d in report.divergences if d.check == "repeatability")


def test_every_trial_run_is_in_the_report_and_replays_agree(fake_model: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _config(fake_model, tmp_path, diverge_from_batch=4)
    cfg["schedule"].update(trials=12, max_shrink_runs=6)
    report = run(parse_config(cfg))
    assert report.check("invariance").evidence["shrink"]["minimal"] is False  # type: ignore[union-attr]
    assert "smallest found" in report.check("invariance").message  # type: ignore[union-attr]
    diverged = {d.trial_id for d in report.divergences if d.check == "invariance"}
    for t in report.schedule:
        code = main(["replay", str(tmp_path / "report" / "report.json"), "--trial", str(t.trial_id), "--trust-report"])
        out = capsys.readouterr().out
        assert code == (1 if t.trial_id in diverged else 0), out
        assert "the report had" not in out


def test_fidelity_fails_when_invariant_kernels_are_wrong(fake_model: Path, tmp_path: Path) -> None:
    # Invariant solo flips tokens at a margin of 0.5, far above the near-tie tolerance.
    report = run(parse_config(_config(fake_model, tmp_path, diverge_from_batch=1, flip_token=True)))
    fidelity = report.check("fidelity")
    assert fidelity is not None and fidelity.verdict == "fail" and "margin 0.5" in fidelity.message
    # A few ULPs of logprob, no token flip: within tolerance.
    report = run(parse_config(_config(fake_model, tmp_path, diverge_from_batch=1)))
    assert report.check("fidelity").verdict == "pass"  # type: ignore[union-attr]


def test_negative_control_is_vacuous_without_production_divergence(fake_model: Path, tmp_path: Path) -> None:
    clean = run(parse_config(_config(fake_model, tmp_path)))
    assert clean.check("negative_control").verdict == "vacuous"  # type: ignore[union-attr]
    noisy = run(parse_config(_config(fake_model, tmp_path, diverge_from_batch=2, diverge_mode="production")))
    assert noisy.check("negative_control").verdict == "pass"  # type: ignore[union-attr]


def test_drift_gate_fails_past_its_threshold(fake_model: Path, tmp_path: Path) -> None:
    cfg = _config(fake_model, tmp_path, diverge_from_batch=2, diverge_mode="production")
    cfg["checks"] = {"drift": {"requirement": "required", "max_divergent_fraction": 0.0}}
    report = run(parse_config(cfg))
    drift = report.check("drift")
    assert drift is not None and drift.verdict == "fail" and "divergent fraction" in drift.message
    assert report.exit_code() == 1


def test_prefix_cache_for_an_engine_without_one_is_skipped_at_warn_and_blocks_when_required(
        fake_model: Path, tmp_path: Path) -> None:
    """Not applicable is not a pass: `skipped` (named as such) at warn; at required it is vacuous and fails."""
    cfg = _config(fake_model, tmp_path)
    cfg.setdefault("checks", {})["prefix_cache"] = "warn"
    report = run(parse_config(cfg))
    check = report.check("prefix_cache")
    assert check is not None and check.verdict == "skipped" and "without prefix caching" in check.message
    cfg["checks"]["prefix_cache"] = "required"
    report = run(parse_config(cfg))
    assert report.check("prefix_cache").verdict == "vacuous" and report.exit_code() == 1  # type: ignore[union-attr]


def test_only_the_modes_the_checks_read_are_run(fake_model: Path, tmp_path: Path) -> None:
    cfg = _config(fake_model, tmp_path)
    cfg["checks"] = {"invariance": "required", "repeatability": "off", "fidelity": "off", "drift": "off",
                     "negative_control": "off", "prefill_decode": "off", "prefix_cache": "off", "seeded_sampling": "off"}
    report = run(parse_config(cfg))
    assert list(report.environment["engines"]) == ["invariant"] and "production_s" not in report.timings
    assert [c.name for c in report.checks] == ["invariance"] and report.exit_code() == 0
