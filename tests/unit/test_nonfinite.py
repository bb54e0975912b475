"""Broken outputs are findings, never equal by accident: NaN, infinities and short answers (issue 17, class 2),
and stored results keep only the rows a divergence needs (class 10)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from oracle.checks.base import Runs, within
from oracle.checks.fidelity import fidelity
from oracle.cli import main
from oracle.compare import first_divergence, row_digest
from oracle.config import parse_config
from oracle.engines.contract import Completion, Request, SamplingParams, output_problem
from oracle.execute import ModeExecution, keep_rows
from oracle.judge import check_runs
from oracle.mode_result import ModeResult
from oracle.observer import Observer
from oracle.plan import plan_run, solo_request, trial_requests
from oracle.runner import run


def _c(logprobs: list[float], tokens: list[int] | None = None, logits: list[Any] | None = None,
       top2: list[tuple[float, float]] | None = None) -> Completion:
    return Completion("r", tokens or list(range(len(logprobs))), list(logprobs), logits=logits, top2=top2)


# --- compare: NaN never equal -----------------------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_logprob_never_equals_itself(bad: float) -> None:
    d = first_divergence(_c([-0.5, bad, -0.25]), _c([-0.5, bad, -0.25]))
    assert d is not None and d.step == 1 and d.kind == "logprob" and d.ulp is None


def test_a_nan_logits_row_never_equals_itself() -> None:
    row = np.array([0.5, np.nan, -1.0], dtype=np.float32)
    d = first_divergence(_c([-0.5], logits=[row]), _c([-0.5], logits=[row.copy()]))
    assert d is not None and d.kind == "logits"


def test_a_masked_logit_is_not_broken() -> None:
    row = np.array([0.5, -np.inf, -1.0], dtype=np.float32)
    assert first_divergence(_c([-0.5], logits=[row]), _c([-0.5], logits=[row.copy()])) is None


# --- the contract: what an engine may return ---------------------------------------------------------


REQ = Request("r", (1, 2), SamplingParams(max_tokens=3))


@pytest.mark.parametrize(("c", "says"), [
    (None, "not a Completion"),
    (_c([-0.5, math.nan, -0.25]), "step 1: the sampled token's logprob is nan"),
    (_c([-0.5, -0.5, math.inf]), "step 2"),
    (_c([-0.5, -0.5]), "2 tokens for max_tokens 3"),
    (_c([-0.5, -0.5, -0.5, -0.5]), "4 tokens for max_tokens 3"),
    (_c([-0.5] * 3, tokens=[1, True, 2]), "token id True"),  # type: ignore[list-item]
    (_c([-0.5] * 3, tokens=[1, -4, 2]), "token id -4"),
    (_c([-0.5] * 3, top2=[(1.0, 0.5)]), "1 top2 for 3 tokens"),
    (_c([-0.5] * 3, top2=[(1.0, 0.5), (math.nan, 0.5), (1.0, 0.5)]), "step 1: top-2"),
    (_c([-0.5] * 3, logits=[np.zeros(4, np.float32), np.array([0, np.inf], np.float32), np.zeros(4)]),
     "step 1: logits row holds inf at token 1"),
    (_c([-0.5] * 3, logits=[np.zeros(4, np.float32), None, np.zeros(4)]), "step 1: no logits row"),
])
def test_impossible_outputs_are_named(c: Any, says: str) -> None:
    problem = output_problem(REQ, c)
    assert problem is not None and says in problem


def test_well_formed_outputs_pass_and_an_eos_engine_may_stop_early() -> None:
    masked = np.array([0.0, -np.inf], dtype=np.float32)
    assert output_problem(REQ, _c([-0.5] * 3, logits=[masked] * 3, top2=[(1.0, -math.inf)] * 3)) is None
    eos = (7,)
    assert output_problem(REQ, _c([-0.5, -0.5], tokens=[3, 7]), stop_at_eos=True, eos_token_ids=eos) is None
    assert output_problem(REQ, _c([]), stop_at_eos=True, eos_token_ids=eos) is not None


@pytest.mark.parametrize(("tokens", "eos", "says"), [
    ([3, 4], (7,), "ends in token 4, not an EOS token (7)"),  # cut short in mid-answer
    ([3, 7], (), "the engine declares none"),  # no EOS id known: a short output cannot be told from a cut one
])
def test_an_eos_engine_short_output_must_end_in_eos(tokens: list[int], eos: tuple[int, ...], says: str) -> None:
    problem = output_problem(REQ, _c([-0.5] * len(tokens), tokens=tokens), stop_at_eos=True, eos_token_ids=eos)
    assert problem is not None and says in problem


# --- a whole run: a broken engine is an engine error (exit 3), never a pass -----------------------------


def _config(model: Path, tmp_path: Path, **options: Any) -> dict[str, Any]:
    return {
        "model": str(model),
        "engine": {"kind": "broken_engine:BrokenEngine", "options": options},
        "prompts": {"random": {"count": 3, "min_len": 2, "max_len": 5}},
        "sampling": {"max_tokens": 4},
        "schedule": {"trials": 12, "seed": 7, "batch_size": [1, 6], "repeat_trials": 2},
        "report_dir": str(tmp_path / "report"),
    }


@pytest.mark.parametrize(("fault", "says"), [
    ("nan_logprob", "logprob is nan"),
    ("inf_logprob", "logprob is -inf"),
    ("short", "3 tokens for max_tokens 4"),
    ("long", "5 tokens for max_tokens 4"),
    ("nan_logits", "logits row holds nan"),
    ("none", "returned NoneType, not a Completion"),
    ("bool_token", "token id True"),
])
@pytest.mark.parametrize("fault_mode", ["invariant", "production"])
def test_broken_outputs_in_every_call_are_an_engine_error(fake_model: Path, tmp_path: Path, fault: str, says: str,
                                                          fault_mode: str) -> None:
    """The same broken output in the reference and every trial would compare bitwise equal: exit 3, not 0."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_config(fake_model, tmp_path, fault=fault, fault_mode=fault_mode)))
    assert main(["run", str(path)]) == 3
    written = json.loads((tmp_path / "report" / "report.json").read_text())
    assert written["complete"] is False and written["exit_code"] == 3
    assert f"{fault_mode} engine, request " in written["error"] and says in written["error"]


def test_a_fault_that_starts_mid_run_keeps_what_completed(fake_model: Path, tmp_path: Path) -> None:
    report = run(parse_config(_config(fake_model, tmp_path, fault="nan_logprob", fault_from_call=8)))
    assert report.exit_code() == 3 and report.error is not None and "logprob is nan" in report.error
    inv = report.check("invariance")
    assert inv is not None and 0 < inv.trials < 12


# --- fidelity: NaN is never within ------------------------------------------------------------------------


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, None])
def test_nothing_non_finite_is_within(value: float | None) -> None:
    assert not within(value, 1e9) and not within(value, 1e9, strict=True)
    assert within(0.5, 0.5) and not within(0.5, 0.5, strict=True)


def _fidelity(fake_model: Path, tmp_path: Path, inv: Completion, prod: Completion) -> Any:
    config = parse_config({**_config(fake_model, tmp_path), "prompts": {"random": {"count": 1, "min_len": 2,
                                                                                  "max_len": 3}}})
    plan = plan_run(config)
    runs = Runs(config, plan.targets, {t.trial_id: t for t in plan.trials}, ModeResult("invariant", solo={0: inv}),
                ModeResult("production", solo={0: prod}), {})
    return fidelity(runs, "required").result


@pytest.mark.parametrize(("inv", "prod"), [
    (_c([-0.5, math.nan]), _c([-0.5, -0.25])),  # max(0.0, nan) was 0.0: "within 0 logprob"
    (_c([-0.5, -0.25], logits=[np.zeros(3, np.float32), np.array([0, np.nan, 1], np.float32)]),
     _c([-0.5, -0.25], logits=[np.zeros(3, np.float32), np.zeros(3, np.float32)])),  # KL nan
    (_c([-0.5, -0.25], tokens=[0, 7]), _c([-0.5, -0.25], top2=[(1.0, 0.5), (math.nan, 0.5)])),  # NaN margin
    (_c([-0.5]), _c([-0.5, -0.25])),  # a short output
])
def test_fidelity_fails_what_is_not_a_number_or_short(fake_model: Path, tmp_path: Path, inv: Completion,
                                                     prod: Completion) -> None:
    result = _fidelity(fake_model, tmp_path, inv, prod)
    assert result.verdict == "fail", result.message
    assert math.isfinite(result.evidence["max_abs_logprob_diff"])


# --- class 10: compare as you go, keep digests and the first diverging rows --------------------------------


def test_keep_rows_keeps_digests_of_every_row_and_the_asked_rows_only() -> None:
    rows = [np.arange(4, dtype=np.float32) + i for i in range(3)]
    base = np.stack(rows)  # [3, 4]: kept rows must not pin it
    c = keep_rows(_c([-0.5] * 3, logits=list(base)), (1, None))
    assert c.logits is not None and c.logits[0] is None and c.logits[2] is None
    assert c.logits[1] is not None and c.logits[1].base is None and np.array_equal(c.logits[1], rows[1])
    assert c.logits_digests == [row_digest(r) for r in rows]
    again = keep_rows(c, ())
    assert again.logits == [None, None, None] and again.logits_digests == c.logits_digests


def test_stored_trials_keep_one_row_and_judge_as_full_rows_would(fake_model: Path, tmp_path: Path) -> None:
    """Rows differ (one ULP of one logit) from batch 3 on, from step 2: every divergence the compact results
    give equals the one the engine's full rows give, max abs diff included; a trial keeps at most one row
    (two while a repeat is compared), where it first differs."""
    data = _config(fake_model, tmp_path, vocab=64, row_fault_from_batch=3, row_fault_step=2)
    data["sampling"]["logits"] = "full"
    data["schedule"].update(trials=24, repeat_trials=4)
    plan = plan_run(parse_config(data))
    from broken_engine import BrokenEngine

    def build(mode: Any) -> Any:
        return BrokenEngine(fake_model, mode, vocab=64, row_fault_from_batch=3, row_fault_step=2)

    execution = ModeExecution(plan, "invariant", Observer(), build, check_runs=check_runs(plan.config))
    execution.run()
    result = execution.result()
    engine = build("invariant")
    solo = {i: engine.generate([solo_request(plan, i)])[0] for i in range(len(plan.targets))}
    diverged = 0
    for trial in plan.trials:
        requests, at = trial_requests(plan, trial)
        full = engine.generate(requests)[at]
        kept = result.trials[trial.trial_id]
        assert kept.logits is not None and sum(r is not None for r in kept.logits) <= 1
        expected = first_divergence(solo[trial.target], full)
        assert first_divergence(result.solo[trial.target], kept) == expected
        diverged += expected is not None
        if expected is not None:
            assert expected.kind == "logits" and expected.max_abs_logits_diff is not None
            assert expected.max_abs_logits_diff > 0
    assert 0 < diverged < len(plan.trials)
    for tid, again in result.repeats.items():
        assert again.logits is not None and all(r is None for r in again.logits)  # equal to the trial
        assert first_divergence(result.trials[tid], again) is None


def test_a_repeat_that_differs_keeps_the_rows_repeatability_reads(fake_model: Path, tmp_path: Path) -> None:
    """Batched trials differ from solo at step 2; every repeat (calls after the schedule's) differs from its
    trial at step 1. The trial keeps rows 1 and 2 where it diverged, the repeat row 1; repeatability and
    invariance judge exactly as full rows would, max abs diff included."""
    data = _config(fake_model, tmp_path)
    data["sampling"]["logits"] = "full"
    data["schedule"].update(trials=16, repeat_trials=6)
    plan = plan_run(parse_config(data))
    first_repeat_call = len(plan.targets) + len(plan.trials) + 1
    from broken_engine import BrokenEngine

    def build(mode: Any) -> Any:
        return BrokenEngine(fake_model, mode, vocab=32, row_fault_from_batch=3, row_fault_step=2,
                            row_noise_from_call=first_repeat_call)

    execution = ModeExecution(plan, "invariant", Observer(), build, check_runs=check_runs(plan.config))
    execution.run()
    result = execution.result()
    clean, noisy = build("invariant"), build("invariant")
    noisy.calls = first_repeat_call
    solo = {i: clean.generate([solo_request(plan, i)])[0] for i in range(len(plan.targets))}
    assert len(result.repeats) == 6
    for tid, again in result.repeats.items():
        trial = plan.trials[tid]
        requests, at = trial_requests(plan, trial)
        full, full_again = clean.generate(requests)[at], noisy.generate(requests)[at]
        expected = first_divergence(full, full_again)
        assert expected is not None and expected.step == 1 and expected.max_abs_logits_diff
        assert first_divergence(result.trials[tid], again) == expected
        assert first_divergence(result.solo[trial.target], result.trials[tid]) == first_divergence(
            solo[trial.target], full)
        kept = result.trials[tid].logits
        assert kept is not None and {i for i, r in enumerate(kept) if r is not None} <= {1, 2}
        assert again.logits is not None and [i for i, r in enumerate(again.logits) if r is not None] == [1]
