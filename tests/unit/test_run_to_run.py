"""Run-to-run apart from batch variance: a failing invariant trial is run again as is, and its target alone
again, before the batch is blamed; a token sampled from bitwise equal logits is the sampler's. Each planted in
the fake engine: a run-to-run fault, a sampler fault, a batch fault."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from oracle.config import parse_config
from oracle.execute import RECHECKED
from oracle.report import Report
from oracle.runner import run


def _run(model: Path, tmp_path: Path, **options: Any) -> Report:
    return run(parse_config({
        "model": str(model),
        "engine": {"kind": "fake_engine:FakeEngine", "options": options},
        "prompts": {"random": {"count": 3, "min_len": 2, "max_len": 5}},
        "sampling": {"max_tokens": 4},
        "schedule": {"trials": 20, "seed": 7, "batch_size": [1, 12], "repeat_trials": 3},
        "report_dir": str(tmp_path / "report"),
    }))


def _invariance(report: Report) -> list[Any]:
    return [d for d in report.divergences if d.check == "invariance"]


def test_a_run_to_run_fault_is_reported_as_run_to_run(fake_model: Path, tmp_path: Path) -> None:
    # Every 7th engine call misfires, whatever the batch: the batched trials it hits would have been blamed on
    # the batch, and the shrinker would have "shrunk" one to a batch of 1 by chance.
    report = _run(fake_model, tmp_path, misfire_every=7)
    inv = report.check("invariance")
    assert inv is not None and inv.verdict == "fail"
    recs = _invariance(report)
    assert recs and len(recs) <= RECHECKED  # every failing trial was rechecked
    assert any(len(d.trial.fillers) >= 1 for d in recs)  # type: ignore[union-attr]  # batched, yet not the batch's
    assert all(d.cause == "nondeterminism" for d in recs)
    assert "run-to-run nondeterminism, not batch variance" in inv.message
    assert not any(d.shrunk for d in recs) and "shrink" not in inv.evidence  # no batch of 1 called minimal
    assert "not shrunk" in inv.message
    assert inv.evidence["recheck"]["reproduced"] == []
    assert inv.evidence["recheck"]["trials"]
    rep = report.check("repeatability")
    assert rep is not None and rep.verdict == "fail" and "run-to-run nondeterminism" in rep.message
    assert rep.evidence["rechecked"] > 0
    assert all(d.cause == "nondeterminism" for d in report.divergences if d.check == "repeatability")
    assert report.exit_code() == 1


def test_a_moving_solo_run_is_run_to_run(fake_model: Path, tmp_path: Path) -> None:
    # From the 4th call on (after the 3 references) every call gives other bits: the solo run moves too.
    report = _run(fake_model, tmp_path, nondeterministic_from_call=4)
    inv = report.check("invariance")
    assert inv is not None and inv.verdict == "fail"
    assert inv.evidence["recheck"]["solo_moved"] == inv.evidence["recheck"]["targets"] != []
    moved = set(inv.evidence["recheck"]["targets"])
    # every failing trial of a target whose solo run moved, rechecked or not, is run-to-run
    assert all(d.cause == "nondeterminism" for d in _invariance(report) if d.trial.target in moved)  # type: ignore[union-attr]
    assert report.check("repeatability").verdict == "fail"  # type: ignore[union-attr]
    solo = [d for d in report.divergences if d.check == "repeatability" and d.evidence.get("solo_again")]
    assert solo and all(d.trial_id is None for d in solo)


def test_a_sampler_fault_is_the_samplers(fake_model: Path, tmp_path: Path) -> None:
    # From batch 3 on another token is sampled from the same logits (bitwise, by their digests).
    report = _run(fake_model, tmp_path, sampler_from_batch=3, diverge_step=1)
    inv = report.check("invariance")
    assert inv is not None and inv.verdict == "fail"
    recs = _invariance(report)
    assert recs and all(d.cause == "sampling" and d.kind == "token" and d.step == 1 for d in recs)
    assert "the sampler's (another token sampled from bitwise equal logits)" in inv.message
    assert "run-to-run" not in inv.message
    assert report.check("repeatability").verdict == "pass"  # type: ignore[union-attr]  # the same bits twice


def test_a_batch_fault_is_still_the_batchs(fake_model: Path, tmp_path: Path) -> None:
    report = _run(fake_model, tmp_path, diverge_from_batch=5, diverge_step=2)
    inv = report.check("invariance")
    assert inv is not None and inv.verdict == "fail"
    recs = [d for d in _invariance(report) if not d.shrunk]
    assert recs and all(d.cause == "batch" for d in recs)
    recheck = inv.evidence["recheck"]
    assert recheck["reproduced"] == recheck["trials"] != [] and recheck["solo_moved"] == []
    assert len(recheck["trials"]) <= RECHECKED
    shrunk = [d for d in _invariance(report) if d.shrunk]
    assert len(shrunk) == 1 and shrunk[0].cause == "batch"
    assert len(shrunk[0].trial.fillers) + 1 == 5  # type: ignore[union-attr]  # the fault's threshold
    assert "shrunk to trial" in inv.message and "run-to-run" not in inv.message
    assert report.check("repeatability").verdict == "pass"  # type: ignore[union-attr]


def test_a_clean_run_rechecks_nothing(fake_model: Path, tmp_path: Path) -> None:
    report = _run(fake_model, tmp_path)
    assert "recheck" not in report.check("invariance").evidence  # type: ignore[union-attr]
    assert "rechecked" not in report.check("repeatability").evidence  # type: ignore[union-attr]
    assert not any(k.endswith("recheck_s") for k in report.timings)


def test_a_batch_fault_beside_a_run_to_run_one(fake_model: Path, tmp_path: Path) -> None:
    # Both planted: every batch of 2 or more diverges (reproducibly), and every 7th call misfires.
    report = _run(fake_model, tmp_path, misfire_every=7, diverge_from_batch=2)
    inv = report.check("invariance")
    assert inv is not None and inv.verdict == "fail"
    recheck = inv.evidence["recheck"]
    causes = {d.trial_id: d.cause for d in _invariance(report) if not d.shrunk}
    assert {causes[t] for t in recheck["reproduced"]} == {"batch"}
    assert {"batch", "nondeterminism"} <= set(causes.values())
    assert "of them run-to-run nondeterminism" in inv.message
    assert "blamed on the batch were not run again (past the first rechecked): unconfirmed" in inv.message
    # the shrinker started from a trial that reproduced, and found the batch fault's threshold
    shrunk = next(d for d in _invariance(report) if d.shrunk)
    assert inv.evidence["shrink"]["start_trial"] in recheck["reproduced"]
    assert shrunk.cause == "batch" and len(shrunk.trial.fillers) + 1 == 2  # type: ignore[union-attr]
