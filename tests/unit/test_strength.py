"""The strength of a pass: batched trials, distinct pass compositions and the rate a clean run rules out, in
report.json and every view; `schedule.confidence` sizes a run and leaves invariance vacuous where it cannot."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from oracle.checks.strength import composition, rate_bound
from oracle.config import ConfidenceConfig, ScheduleConfig, parse_config
from oracle.engines.contract import Completion, StepEvidence
from oracle.render.files import write_formats
from oracle.report import CheckResult, Strength
from oracle.runner import run
from oracle.schedule import draw_schedule


def _config(model: Path, tmp_path: Path, schedule: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
    return {
        "model": str(model),
        "engine": {"kind": "fake_engine:FakeEngine", "options": options},
        "prompts": {"random": {"count": 3, "min_len": 2, "max_len": 5}},
        "sampling": {"max_tokens": 4},
        "schedule": {"trials": 16, "seed": 7, "batch_size": [1, 12], "repeat_trials": 3, **(schedule or {})},
        "report_dir": str(tmp_path / "report"),
    }


def test_rule_of_three() -> None:
    assert rate_bound(0, 0.95) is None
    assert rate_bound(15, 0.95) == pytest.approx(1 - 0.05 ** (1 / 15))  # 18%
    assert rate_bound(300, 0.95) == pytest.approx(3 / 300, rel=0.01)  # about 3/N
    assert ConfidenceConfig().batched_trials == 59  # 5% at 95%
    assert ConfidenceConfig(rate=0.01, level=0.99).batched_trials == math.ceil(math.log(0.01) / math.log(0.99))
    assert (1 - 0.05) ** 59 <= 0.05 < (1 - 0.05) ** 58


def test_composition_is_the_set_of_pass_shapes() -> None:
    def c(*passes: tuple[int, int, bool, bool, int]) -> Completion:
        return Completion("r", [], [], evidence=[StepEvidence(i, s, t, p, ch, num_cached_tokens=k)
                                                 for i, (s, t, p, ch, k) in enumerate(passes)])

    a = c((2, 9, True, False, 0), (2, 2, False, False, 0))
    assert composition(a) == composition(c((2, 2, False, False, 0), (2, 9, True, False, 0), (2, 2, False, False, 0)))
    assert composition(a) != composition(c((2, 9, True, False, 4), (2, 2, False, False, 0)))  # cached
    assert composition(a) != composition(c((2, 9, True, True, 0), (2, 2, False, False, 0)))  # chunked


def test_a_pass_states_its_strength_everywhere(fake_model: Path, tmp_path: Path) -> None:
    report = run(parse_config(_config(fake_model, tmp_path)), views=[write_formats])
    inv = report.check("invariance")
    assert inv is not None and inv.verdict == "pass" and inv.strength is not None
    s = inv.strength
    assert s.batched_trials == inv.evidence["trials_batched"] and s.batched_trials > 0
    assert 0 < s.compositions <= s.batched_trials
    assert s.rate_bound == pytest.approx(1 - 0.05 ** (1 / s.batched_trials)) and s.level == 0.95
    pct = f"{s.rate_bound * 100:.0f}%"
    line = f"{s.batched_trials} batched; {s.compositions} compositions; rules out a break in >= {pct} of batched"
    assert inv.message.startswith(f"{inv.trials} trials bitwise equal to the solo reference; {line}")
    rep = report.check("repeatability")
    assert rep is not None and rep.strength is not None and rep.message.endswith(rep.strength.line())
    written = json.loads((tmp_path / "report" / "report.json").read_text())
    checks = {c["name"]: c for c in written["checks"]}
    assert checks["invariance"]["strength"] == {"batched_trials": s.batched_trials, "compositions": s.compositions,
                                                "level": 0.95, "rate_bound": s.rate_bound}
    assert "strength" not in checks["fidelity"]  # a check that states none writes no key
    assert line in (tmp_path / "report" / "summary.md").read_text()
    junit = (tmp_path / "report" / "junit.xml").read_text()
    assert line.replace(">", "&gt;") in junit
    assert f'<property name="strength.batched_trials" value="{s.batched_trials}" />' in junit


def test_a_failure_states_no_strength(fake_model: Path, tmp_path: Path) -> None:
    report = run(parse_config(_config(fake_model, tmp_path, diverge_from_batch=5, diverge_step=2)))
    inv = report.check("invariance")
    assert inv is not None and inv.verdict == "fail" and inv.strength is None
    assert "strength" not in inv.model_dump(mode="json")


def test_strength_is_left_out_of_a_check_result_without_it() -> None:
    plain = CheckResult.passed("x", "required", message="ok")
    assert "strength" not in plain.model_dump(mode="json")
    s = Strength(batched_trials=0, compositions=0, level=0.95, rate_bound=None)
    assert CheckResult.passed("x", "required", message="ok", strength=s).message == \
        "ok; no batched trial: rules out nothing"


def test_confidence_sizes_the_schedule() -> None:
    cfg = ScheduleConfig(trials=16, batch_size=(1, 12), confidence=ConfidenceConfig())
    trials = draw_schedule(cfg, [3, 4, 5], 7)
    assert sum(t.batch_size >= 2 for t in trials) >= 59
    assert len(draw_schedule(ScheduleConfig(trials=16, batch_size=(1, 12)), [3, 4, 5], 7)) == 16
    assert len(draw_schedule(cfg.model_copy(update={"trials": 200}), [3, 4, 5], 7)) == 200  # never fewer


def test_confidence_reached_passes_and_says_so(fake_model: Path, tmp_path: Path) -> None:
    report = run(parse_config(_config(fake_model, tmp_path, {"confidence": {"rate": 0.2, "level": 0.9}})))
    inv = report.check("invariance")
    assert inv is not None and inv.verdict == "pass" and inv.strength is not None
    assert inv.strength.wanted == 11 and inv.strength.batched_trials >= 11 and inv.strength.level == 0.9
    assert inv.strength.rate_bound is not None and inv.strength.rate_bound <= 0.2
    assert report.config["schedule"]["confidence"] == {"rate": 0.2, "level": 0.9}


def test_confidence_not_formed_is_vacuous(fake_model: Path, tmp_path: Path) -> None:
    # The engine runs every request alone: no trial is batched, so nothing is ruled out.
    report = run(parse_config(_config(fake_model, tmp_path, {"confidence": {"rate": 0.2}}, always_alone=True)))
    assert report.check("invariance").verdict == "vacuous"  # type: ignore[union-attr]
    # The batches form, but too few of them: from the 8th call on (3 references, then 4 trials) none does.
    report = run(parse_config(_config(fake_model, tmp_path, {"confidence": {"rate": 0.2}}, alone_from_call=8)))
    inv = report.check("invariance")
    assert inv is not None and inv.verdict == "vacuous" and report.exit_code() == 1
    assert inv.strength is not None and 0 < inv.strength.batched_trials < 14 == inv.strength.wanted
    assert f"schedule.confidence needs 14 batched trials, the run formed {inv.strength.batched_trials}" in inv.message


def test_a_config_without_confidence_keeps_its_digest() -> None:
    base = {"model": "preset:tiny-qwen3", "prompts": {"random": {"count": 1}}, "schedule": {"trials": 4}}
    a = parse_config(base)
    assert "confidence" not in a.model_dump(mode="json")["schedule"]
    b = parse_config({**base, "schedule": {"trials": 4, "confidence": {"rate": 0.05}}})
    assert a.digest() != b.digest()
