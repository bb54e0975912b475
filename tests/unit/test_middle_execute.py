"""execute, called directly with the fake engine (tests/support/fake_engine.py): one mode's execution gives the
frozen result the judge reads, and an output that cannot be judged (short, NaN) is an engine error."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from broken_engine import BrokenEngine
from fake_engine import FakeEngine

from oracle.checks.base import Runs
from oracle.checks.invariance import invariance
from oracle.checks.repeatability import repeatability
from oracle.compare import first_divergence
from oracle.config import parse_config
from oracle.engines.contract import Completion, Engine, Mode, Request, SamplingParams
from oracle.errors import ConfigError, EngineError
from oracle.execute import ModeExecution, generate, repeated_trials
from oracle.judge import check_runs
from oracle.mode_result import ModeResult
from oracle.observer import Observer
from oracle.plan import Plan, plan_run, solo_request, trial_requests

CHECKS_OFF = {"prefill_decode": "off", "prefix_cache": "off"}


def _plan(model: Path, trials: int = 12, repeat: int = 3, **checks: Any) -> Plan:
    return plan_run(parse_config({
        "model": str(model),
        "engine": {"kind": "fake_engine:FakeEngine"},
        "prompts": {"random": {"count": 3, "min_len": 2, "max_len": 5}},
        "sampling": {"max_tokens": 4},
        "schedule": {"trials": trials, "seed": 7, "batch_size": [1, 8], "repeat_trials": repeat,
                     "max_shrink_runs": 40},
        "checks": {**CHECKS_OFF, **checks},
    }))


class Builds:
    """An engine builder that keeps every engine it built (and whether it was closed)."""

    def __init__(self, model: Path, cls: type[FakeEngine] = FakeEngine, **options: Any) -> None:
        self.model, self.cls, self.options = model, cls, options
        self.engines: list[FakeEngine] = []
        self.closed: list[FakeEngine] = []
        self.open_when_built: list[int] = []  # per engine: how many others were open when it was built

    def __call__(self, mode: Mode) -> Engine:
        self.open_when_built.append(len(self.engines) - len(self.closed))
        engine = self.cls(self.model, mode, **self.options)
        close = engine.close

        def closing() -> None:
            self.closed.append(engine)
            close()

        engine.close = closing  # type: ignore[method-assign]
        self.engines.append(engine)
        return engine


def _execute(plan: Plan, mode: Mode, build: Builds) -> ModeResult:
    execution = ModeExecution(plan, mode, Observer(), build, check_runs=check_runs(plan.config))
    try:
        execution.run()
    finally:
        result = execution.result()
    return result


def _runs(plan: Plan, inv: ModeResult | None, prod: ModeResult | None = None) -> Runs:
    trials = {t.trial_id: t for t in plan.trials}
    if inv is not None:
        trials.update({t.trial_id: t for t in inv.shrink_trials})
    return Runs(plan.config, plan.targets, trials, inv, prod, {})


def test_a_mode_gives_the_outputs_the_engine_gives(fake_model: Path) -> None:
    plan = _plan(fake_model)
    build = Builds(fake_model)
    result = _execute(plan, "invariant", build)
    assert result.mode == "invariant" and dict(result.engine) == {"engine": "fake",
                                                                 "invariance_mechanism": "none (fake)"}
    engine = FakeEngine(fake_model, "invariant")
    assert set(result.solo) == {0, 1, 2}
    for i in range(3):
        expected = engine.generate([solo_request(plan, i)])[0]
        assert result.solo[i].token_ids == expected.token_ids and result.solo[i].logprobs == expected.logprobs
        assert result.solo[i].request_id == f"solo-{plan.targets[i].name}"
    assert set(result.trials) == {t.trial_id for t in plan.trials}
    for trial in plan.trials:
        requests, at = trial_requests(plan, trial)
        expected = engine.generate(requests)[at]
        got = result.trials[trial.trial_id]
        assert (got.token_ids, got.logprobs, got.max_batch) == (expected.token_ids, expected.logprobs,
                                                                 trial.batch_size)
    assert set(result.repeats) == {0, 1, 2} == {t.trial_id for t in repeated_trials(plan)}
    assert result.shrink is None and result.shrink_trials == () and "prefill_decode" not in result.checks
    assert len(build.engines) == 1 and build.closed == build.engines  # one engine per mode, closed


def test_the_result_is_frozen(fake_model: Path) -> None:
    result = _execute(_plan(fake_model), "invariant", Builds(fake_model))
    with pytest.raises(TypeError):
        result.trials[99] = result.trials[0]  # type: ignore[index]
    with pytest.raises(AttributeError):
        result.mode = "production"  # type: ignore[misc]
    assert {"engine_start", "references", "trials", "repeats", "close"} <= set(result.timings)


def test_the_judge_reads_a_clean_execution_as_a_pass(fake_model: Path) -> None:
    plan = _plan(fake_model)
    inv = _execute(plan, "invariant", Builds(fake_model))
    prod = _execute(plan, "production", Builds(fake_model))
    runs = _runs(plan, inv, prod)
    judged = invariance(runs, "required").result
    assert (judged.verdict, judged.trials, judged.divergent) == ("pass", 12, 0)
    rep = repeatability(runs, "required").result
    assert (rep.verdict, rep.trials) == ("pass", 6)  # three repeats in each mode


def test_a_planted_fault_diverges_exactly_where_planted_and_is_shrunk(fake_model: Path) -> None:
    plan = _plan(fake_model, trials=16)
    result = _execute(plan, "invariant", Builds(fake_model, diverge_from_batch=5, diverge_step=1))
    diverged = {t.trial_id for t in plan.trials
                if first_divergence(result.solo[t.target], result.trials[t.trial_id]) is not None}
    big = {t.trial_id for t in plan.trials if t.batch_size >= 5}
    assert big and diverged == big
    s = result.shrink
    assert s is not None and s.start.trial_id == min(big) and s.minimal and s.smallest.batch_size == 5
    ids = [t.trial_id for t in result.shrink_trials]
    assert ids == list(range(16, 16 + s.runs)) == s.tried  # every candidate ran, numbered after the schedule
    assert all(t.origin == "shrink" and t.trial_id in result.trials for t in result.shrink_trials)
    judged = invariance(_runs(plan, result), "required")
    assert judged.result.verdict == "fail" and judged.result.divergent == len(big)
    assert [d.trial_id for d in judged.divergences] == [*sorted(big), s.smallest.trial_id]
    assert all(d.step == 1 and d.kind == "logprob" for d in judged.divergences)


def test_production_mode_neither_shrinks_nor_re_prefills(fake_model: Path) -> None:
    plan = _plan(fake_model, prefill_decode="warn")
    prod = _execute(plan, "production", Builds(fake_model, diverge_from_batch=2, diverge_mode="production"))
    assert prod.shrink is None and prod.checks == {} and len(prod.repeats) == 3
    inv = _execute(plan, "invariant", Builds(fake_model))
    steps = plan.config.checks.prefill_decode.steps
    assert set(inv.checks["prefill_decode"]) == {(t, i) for t in range(3) for i in range(steps)}  # 4 tokens: every step


def test_an_engine_without_a_prefix_cache_says_so(fake_model: Path) -> None:
    result = _execute(_plan(fake_model, prefix_cache="warn"), "invariant", Builds(fake_model))
    assert result.checks["prefix_cache"].pairs == {} and "without prefix caching" in result.checks["prefix_cache"].note


@pytest.mark.parametrize(("fault", "says"), [
    ("short", "3 tokens for max_tokens 4"),
    ("nan_logprob", "step 3: the sampled token's logprob is nan"),
    ("inf_logprob", "step 0: the sampled token's logprob is -inf"),
    ("nan_logits", "step 0: logits row holds nan at token 0"),
])
@pytest.mark.parametrize("mode", ["invariant", "production"])
def test_a_short_or_nan_output_is_an_engine_error(fake_model: Path, fault: str, says: str, mode: Mode) -> None:
    build = Builds(fake_model, BrokenEngine, fault=fault, fault_mode=mode)
    with pytest.raises(EngineError) as raised:
        _execute(_plan(fake_model), mode, build)
    assert f"{mode} engine, request solo-random-0: {says}" in str(raised.value)
    assert build.closed == build.engines  # the engine is closed on the way out


def test_a_fault_mid_run_keeps_what_completed(fake_model: Path) -> None:
    """From the 6th call (3 references, 2 trials before it) every output is NaN: the run stops there, and the
    result holds the references and the two trials, never the broken one."""
    plan = _plan(fake_model)
    build = Builds(fake_model, BrokenEngine, fault="nan_logprob", fault_from_call=6)
    execution = ModeExecution(plan, "invariant", Observer(), build, check_runs=check_runs(plan.config))
    with pytest.raises(EngineError, match="request trial2-"):
        execution.run()
    result = execution.result()
    assert set(result.solo) == {0, 1, 2} and set(result.trials) == {0, 1}
    judged = invariance(_runs(plan, result), "required").result
    assert [t.batch_size for t in plan.trials[:2]] == [2, 1]
    assert (judged.verdict, judged.trials, judged.evidence["trials_batched"]) == ("pass", 2, 1)


class _Returns:
    """An engine whose generate() returns what it is given."""

    mode: Mode = "invariant"

    def __init__(self, out: Any = None, raises: BaseException | None = None) -> None:
        self.out, self.raises = out, raises

    def generate(self, requests: Sequence[Request], max_num_batched_tokens: int | None = None) -> Any:
        if self.raises is not None:
            raise self.raises
        return self.out

    def describe(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


REQ = Request("r0", (1, 2), SamplingParams(max_tokens=2))


@pytest.mark.parametrize(("engine", "says"), [
    (_Returns(raises=RuntimeError("boom")), "engine raised RuntimeError: boom"),
    (_Returns(out=(Completion("r0", [1, 2], [-0.5, -0.5]),)), "returned tuple, not a list of Completions"),
    (_Returns(out=[]), "engine returned 0 completions for 1 requests"),
    (_Returns(out=[Completion("r0", [1], [-0.5])]), "1 tokens for max_tokens 2"),
    (_Returns(out=[Completion("r0", [1, 2], [-0.5, float("nan")])]), "step 1: the sampled token's logprob is nan"),
])
def test_generate_turns_every_engine_failure_into_an_engine_error(engine: Any, says: str) -> None:
    with pytest.raises(EngineError) as raised:
        generate(engine, [REQ])
    assert says in str(raised.value)


def test_generate_passes_a_users_error_through_and_accepts_good_output() -> None:
    with pytest.raises(ConfigError, match="per-call budget"):
        generate(_Returns(raises=ConfigError("per-call budget")), [REQ], 64)
    good = [Completion("r0", [1, 2], [-0.5, -0.25])]
    assert generate(_Returns(out=good), [REQ]) == good


def test_generate_checks_every_request_once_before_any_engine_sees_it() -> None:
    # An engine that would answer anything: the empty prompt is caught before it, for every engine alike.
    engine = _Returns(raises=AssertionError("the engine was called"))
    with pytest.raises(ConfigError, match=r"^request r1: empty prompt$"):
        generate(engine, [REQ, Request("r1", (), SamplingParams(max_tokens=2))])


def test_a_check_that_starts_its_own_engine_starts_it_once_the_modes_engine_has_closed(fake_model: Path) -> None:
    """cross_instance's second engine of the mode runs after the first closed (never two of one model at once),
    and what it ran is the check's, in the mode's result."""
    plan = _plan(fake_model, cross_instance={"requirement": "required", "mode": "invariant", "trials": 2})
    build = Builds(fake_model)
    execution = ModeExecution(plan, "invariant", Observer(), build, build, check_runs=check_runs(plan.config))
    execution.run()
    result = execution.result()
    assert len(build.engines) == 2 and build.open_when_built == [0, 0] and build.closed == build.engines
    second = result.checks["cross_instance"]
    assert set(second.solo) == {0, 1, 2} and len(second.trials) == 2


class RecordingLocalizer:
    """Localizes nothing; records each call with how many requests the engine had served by then."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, int]] = []

    def can_localize(self, engine: Engine) -> bool:
        return True

    def localize(self, engine: Engine, expected: Any, actual: Any) -> None:
        assert isinstance(engine, FakeEngine)
        self.calls.append((actual, engine.calls))


def test_every_localization_comes_after_the_last_request(fake_model: Path) -> None:
    """Localizations of the failing trials and of the checks wait until the run's last request, so an engine that
    localizes elsewhere (a compiled vLLM engine's eager twin) is not switched back and forth; the requests run
    in their usual order, and the shrunk trial is still localized first."""
    plan = _plan(fake_model, trials=10, repeat=2, prefill_decode="warn", prefix_cache="warn")
    build, localizer = Builds(fake_model, diverge_from_batch=2), RecordingLocalizer()
    execution = ModeExecution(plan, "invariant", Observer(), build, localizer, check_runs=check_runs(plan.config))
    execution.run()
    result = execution.result()
    engine = build.engines[0]
    assert result.shrink is not None and len(localizer.calls) >= 2
    assert all(served == engine.calls for _, served in localizer.calls)  # no request after any of them
    assert set(result.localized) >= {result.shrink.smallest.trial_id}
    assert next(iter(result.localized)) == result.shrink.smallest.trial_id


def test_a_check_that_fails_still_leaves_the_failures_localized(fake_model: Path) -> None:
    """A check's engine error stops the run, but what was asked before it is localized first, as it was when
    localizations ran before the checks."""
    from oracle.checks.base import CheckRun

    def boom(context: Any) -> None:
        raise EngineError("the check's engine died")

    plan = _plan(fake_model, trials=10, repeat=2)
    build, localizer = Builds(fake_model, diverge_from_batch=2), RecordingLocalizer()
    runs = {"boom": CheckRun(dict, boom, lambda context: True)}
    execution = ModeExecution(plan, "invariant", Observer(), build, localizer, check_runs=runs)
    with pytest.raises(EngineError, match="died"):
        execution.run()
    result = execution.result()
    assert result.shrink is not None and result.shrink.smallest.trial_id in result.localized
    assert localizer.calls
