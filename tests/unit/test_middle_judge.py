"""judge, called directly: a table of checks over hand-made frozen results, each case's exact verdict,
counts and divergence records. No engine runs; every output is a literal here.

Logprobs sit in (-1, -0.5), where one float32 ULP is 2**-24, so `_ulps(x, k)` is exactly k ULPs away.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest

from oracle.checks.base import Runs
from oracle.checks.prefix_cache import PrefixRuns
from oracle.checks.seeded_sampling import SampledRound, SampledRuns
from oracle.config import Config, parse_config
from oracle.engines.contract import Completion, StepEvidence
from oracle.judge import CHECKS, coverage, judge, modes_read
from oracle.mode_result import InstanceRun, ModeResult
from oracle.prompts import Target
from oracle.schedule import Filler, Trial
from oracle.shrink import ShrinkResult

LPS = [-0.5625, -0.625, -0.75, -0.875]
TARGETS = (Target("t0", (1, 2, 3)), Target("t1", (4, 5, 6, 7)))


def _ulps(x: float, k: int) -> float:
    return x + k * 2.0**-24


def _c(tokens: list[int], lps: list[float], batch: int = 1, *, cached: int = 0, rid: str = "r",
       top2: list[tuple[float, float]] | None = None, logits: list[Any] | None = None) -> Completion:
    """A completion whose every step shared its pass with `batch - 1` others; the first pass hit `cached`
    prefix tokens."""
    ev = [StepEvidence(i, batch, batch + 3 * (i == 0), i == 0, num_cached_tokens=cached if i == 0 else 0,
                       token_index=i) for i in range(len(tokens))]
    return Completion(rid, list(tokens), list(lps), logits=logits, top2=top2, evidence=ev)


def _solo(t: int) -> Completion:
    return _c([10 * t + i for i in range(4)], LPS, 1, rid=f"solo-t{t}", top2=[(2.0, 1.0)] * 4)


def _like(c: Completion, batch: int, *, step: int | None = None, ulps: int = 0, token: int | None = None,
          cached: int = 0, lps: list[float] | None = None, tokens: list[int] | None = None) -> Completion:
    """`c` as a batched run gives it: the same outputs unless `step` moves its logprob or token."""
    new_tokens, new_lps = list(tokens if tokens is not None else c.token_ids), list(lps if lps is not None else c.logprobs)
    if step is not None:
        new_lps[step] = _ulps(new_lps[step], ulps)
        if token is not None:
            new_tokens[step] = token
    return _c(new_tokens, new_lps, batch, cached=cached, rid="trial", top2=c.top2, logits=c.logits)


def _filler(seed: int) -> Filler:
    return Filler(seed=seed, length=3, max_tokens=2, arrival_step=0)


# Trial i: target i % 2, batch i + 2 (fillers i + 1), the target last.
TRIALS = {i: Trial(i, i % 2, i + 1, 0, tuple(_filler(10 * i + j) for j in range(i + 1))) for i in range(3)}
SOLO = {0: _solo(0), 1: _solo(1)}


def _config(**checks: Any) -> Config:
    return parse_config({"model": "unused", "prompts": {"random": {"count": 2}}, "checks": checks})


def _mode(mode: str, *, solo: Mapping[int, Completion] | None = None, trials: Mapping[int, Completion] | None = None,
          **kw: Any) -> ModeResult:
    ro = MappingProxyType
    return ModeResult(mode, solo=ro(dict(SOLO if solo is None else solo)),  # type: ignore[arg-type]
                      trials=ro(dict(trials or {})), **kw)


Changes = Mapping[int, Mapping[str, Any]]


def _batched(changes: Changes | None = None, batch_of: Callable[[int], int] = lambda i: i + 2) -> dict[int, Completion]:
    """Every trial's target output, equal to its solo run except where `changes[trial id]` says (`_like`)."""
    return {i: _like(SOLO[t.target], batch_of(i), **(changes or {}).get(i, {})) for i, t in TRIALS.items()}


def _runs(inv: ModeResult | None = None, prod: ModeResult | None = None, config: Config | None = None,
          trials: Mapping[int, Trial] = TRIALS, environment: Mapping[str, Any] | None = None) -> Runs:
    return Runs(config or _config(), TARGETS, dict(trials), inv, prod, environment or {})


@dataclass(frozen=True)
class Case:
    id: str
    check: str
    runs: Callable[[], Runs]
    verdict: str
    trials: int
    divergent: int = 0
    # (trial id, target name, step, kind, ulp, cause) of every divergence record, in order
    records: tuple[tuple[int | None, str, int, str, int | None, str], ...] = ()
    evidence: dict[str, Any] = field(default_factory=dict)  # a subset of the check's evidence
    message: str = ""  # a part of the check's message
    requirement: str = "required"


def _inv(changes: Changes | None = None, batch_of: Callable[[int], int] = lambda i: i + 2) -> Callable[[], Runs]:
    return lambda: _runs(_mode("invariant", trials=_batched(changes, batch_of)))


def _prod(changes: Changes | None = None, config: Config | None = None,
          batch_of: Callable[[int], int] = lambda i: i + 2) -> Callable[[], Runs]:
    return lambda: _runs(None, _mode("production", trials=_batched(changes, batch_of)), config)


def _gated(changes: Changes, **drift: Any) -> Callable[[], Runs]:
    return _prod(changes, _config(drift={"requirement": "required", **drift}))


def _shrunk() -> Runs:
    """Trial 2 (batch 4) diverged; the shrinker's candidate 3 (batch 2, from trial 2) still does."""
    small = Trial(3, 0, 1, 0, (_filler(99),), origin="shrink", parent=2)
    trials = {**_batched({2: {"step": 1, "ulps": 4}}), 3: _like(SOLO[0], 2, step=1, ulps=4)}
    s = ShrinkResult(start=TRIALS[2], smallest=small, minimal=True, runs=1, tried=[3])
    return _runs(_mode("invariant", trials=trials, shrink=s), trials={**TRIALS, 3: small})


def _fidelity(inv: Completion, prod: Completion | None = None, **fid: Any) -> Callable[[], Runs]:
    config = _config(fidelity={"max_logprob_diff": 0.25, "max_kl": 0.125, "near_tie": 0.5, **fid})
    return lambda: _runs(_mode("invariant", solo={0: inv}), _mode("production", solo={0: prod or _solo(0)}), config)


def _repeats(inv_again: dict[int, Completion], prod_again: dict[int, Completion] | None = None) -> Callable[[], Runs]:
    def runs() -> Runs:
        inv = _mode("invariant", trials=_batched(), repeats=MappingProxyType(inv_again))
        prod = None if prod_again is None else _mode("production", trials=_batched(),
                                                       repeats=MappingProxyType(prod_again))
        return _runs(inv, prod)
    return runs


def _prefix(pairs: dict[int, tuple[Completion, Completion]], note: str = "") -> Callable[[], Runs]:
    return lambda: _runs(_mode("invariant", checks={"prefix_cache": PrefixRuns(MappingProxyType(pairs), note)}))


def _prefill(again: dict[tuple[int, int], Completion]) -> Callable[[], Runs]:
    return lambda: _runs(_mode("invariant", checks={"prefill_decode": MappingProxyType(again)}))


def _step(t: int, i: int, ulps: int = 0) -> Completion:
    s = _solo(t)
    return _c([s.token_ids[i]], [_ulps(s.logprobs[i], ulps)], rid=f"prefill-t{t}-{i}")


def _instance(solo: dict[int, Completion], trials: dict[int, Completion], engine: dict[str, Any] | None = None,
              first_engine: dict[str, Any] | None = None) -> Callable[[], Runs]:
    config = _config(cross_instance="required")
    return lambda: _runs(_mode("invariant", trials=_batched(), engine=first_engine or {"engine": "a"},
                               checks={"cross_instance": InstanceRun(engine or {"engine": "a"}, solo, trials)}),
                         config=config)


def _sampled(batches: tuple[tuple[Completion, ...], ...], solo: tuple[Completion, ...] | None = None,
             targets: tuple[int, ...] = (0, 0), note: str = "") -> Callable[[], Runs]:
    one, two = _c([1, 2], [-0.5, -0.625], rid="s0"), _c([3, 4], [-0.5, -0.625], rid="s1")
    rounds = (SampledRound(0, targets, (11, 12), solo or (one, two), batches),) if batches else ()
    config = _config(seeded_sampling="required")
    return lambda: _runs(_mode("invariant", checks={"seeded_sampling": SampledRuns(rounds, note)}), config=config)


ONE, TWO = _c([1, 2], [-0.5, -0.625], 2, rid="s0"), _c([3, 4], [-0.5, -0.625], 2, rid="s1")
NAN = float("nan")

CASES = [
    # --- invariance: every trial == its target's solo run, bitwise -------------------------------------
    Case("equal and batched", "invariance", _inv(), "pass", 3,
         evidence={"trials_batched": 3, "max_seqs_shared": 4, "scheduled_batch_sizes": [2, 3, 4]},
         message="3 trials bitwise equal to the solo reference; 3 batched; "),
    Case("one logprob 16 ULP off", "invariance", _inv({1: {"step": 2, "ulps": 16}}), "fail", 3, 1,
         ((1, "t1", 2, "logprob", 16, "batch"),),
         {"divergent_fraction": 1 / 3, "first_divergence_steps": {"2": 1}, "max_ulp": 16, "token_divergences": 0},
         "1 of 3 trials diverged from the solo reference"),
    Case("a token flip", "invariance", _inv({0: {"step": 1, "token": 77}}), "fail", 3, 1,
         ((0, "t0", 1, "token", None, "batch"),), {"first_token_divergence_steps": {"1": 1}, "token_divergences": 1}),
    Case("never batched", "invariance", _inv(batch_of=lambda i: 1), "vacuous", 3,
         evidence={"trials_batched": 0, "max_seqs_shared": 1},
         message="no trial put a target in a forward pass with another sequence"),
    Case("engine died before any trial", "invariance", lambda: _runs(_mode("invariant")), "vacuous", 0,
         message="no trial completed"),
    Case("engine died before the references", "invariance", lambda: _runs(_mode("invariant", solo={})), "vacuous",
         0, message="no trial completed"),
    Case("engine died after trial 0: what completed is judged", "invariance",
         lambda: _runs(_mode("invariant", trials={0: _like(SOLO[0], 2, step=3, ulps=1)})), "fail", 1, 1,
         ((0, "t0", 3, "logprob", 1, "batch"),)),
    Case("NaN equal to NaN", "invariance", lambda: _runs(_mode(
        "invariant", solo={0: _c([0, 1], [-0.5, NAN]), 1: _solo(1)},
        trials={0: _c([0, 1], [-0.5, NAN], 2), 1: _like(SOLO[1], 3)})), "fail", 2, 1,
         ((0, "t0", 1, "logprob", None, "batch"),)),
    Case("a short output", "invariance", _inv({2: {"tokens": [0, 1, 2], "lps": LPS[:3]}}), "fail", 3, 1,
         ((2, "t0", 3, "length", None, "batch"),)),
    Case("alone and different: nondeterminism", "invariance",
         _inv({0: {"step": 0, "ulps": 2}}, lambda i: 1 if i == 0 else 2), "fail", 3, 1,
         ((0, "t0", 0, "logprob", 2, "nondeterminism"),), {"nondeterministic": 1},
         "1 of 3 trials diverged from the solo reference: run-to-run nondeterminism, not batch variance"),
    Case("alone, met the fillers through the cache", "invariance",
         _inv({0: {"step": 0, "ulps": 2, "cached": 3}}, lambda i: 1 if i == 0 else 2), "fail", 3, 1,
         ((0, "t0", 0, "logprob", 2, "prefix_cache"),), {"trials_with_cache_hits": 1}),
    Case("shrunk to batch 2", "invariance", _shrunk, "fail", 3, 1,
         ((2, "t0", 1, "logprob", 4, "batch"), (3, "t0", 1, "logprob", 4, "batch")),
         {"shrink": {"start_trial": 2, "smallest_trial": 3, "minimal": True, "runs": 1, "tried": [3]}},
         "shrunk to trial 3 of batch 2 (minimal)"),
    # --- repeatability: the same trial twice, both modes ----------------------------------------------
    Case("repeats equal", "repeatability", _repeats({0: _like(SOLO[0], 2)}, {0: _like(SOLO[0], 2),
                                                                             1: _like(SOLO[1], 3)}),
         "pass", 3, evidence={"modes": ["invariant", "production"], "repeated": 3}),
    Case("a repeat differs", "repeatability", _repeats({1: _like(SOLO[1], 3, step=0, ulps=1)}), "fail", 1, 1,
         ((1, "t1", 0, "logprob", 1, "nondeterminism"),), message="1 of 1 repeated trials differed"),
    Case("NaN repeated", "repeatability", lambda: _runs(_mode(
        "invariant", trials={0: _c([0, 1], [-0.5, NAN], 2)},
        repeats=MappingProxyType({0: _c([0, 1], [-0.5, NAN], 2)}))), "fail", 1, 1,
         ((0, "t0", 1, "logprob", None, "nondeterminism"),)),
    Case("nothing repeated", "repeatability", _repeats({}), "vacuous", 0, message="no trial was repeated"),
    # --- fidelity: invariant solo vs production solo within the tolerances ------------------------------
    Case("identical", "fidelity", _fidelity(_solo(0)), "pass", 1,
         evidence={"targets": 1, "max_abs_logprob_diff": 0.0, "max_kl": None}),
    Case("logprob off by exactly the tolerance", "fidelity",
         _fidelity(_c(_solo(0).token_ids, [-0.5625, -0.625, -0.5, -0.875])), "pass", 1,
         evidence={"max_abs_logprob_diff": 0.25}),
    Case("logprob past the tolerance", "fidelity", _fidelity(_c(_solo(0).token_ids, [-0.5625, -0.625, -0.375, -0.875])),
         "fail", 1, 1, evidence={"max_abs_logprob_diff": 0.375}, message="max |dlogprob| 0.375 > 0.25"),
    Case("a token flip at a near tie", "fidelity", _fidelity(_c([0, 1, 99, 98], LPS), _c(
        [0, 1, 2, 3], LPS, top2=[(2.0, 1.0), (2.0, 1.0), (2.0, 1.75), (2.0, 1.0)])), "pass", 1),
    Case("a token flip far from a tie", "fidelity", _fidelity(_c([0, 7, 2, 3], LPS)), "fail", 1, 1,
         message="t0 step 1: token 7 vs 1 at margin 1.0"),
    Case("a flip where the margin is NaN", "fidelity", _fidelity(_c([0, 7, 2, 3], LPS), _c(
        [0, 1, 2, 3], LPS, top2=[(2.0, 1.0), (NAN, 1.0), (2.0, 1.0), (2.0, 1.0)])), "fail", 1, 1),
    Case("KL within", "fidelity", _fidelity(
        _c([0], [-0.5], logits=[np.array([0.0, 0.0], np.float32)]),
        _c([0], [-0.5], logits=[np.array([0.0, 0.0], np.float32)])), "pass", 1, evidence={"max_kl": 0.0}),
    Case("KL past the tolerance", "fidelity", _fidelity(
        _c([0], [-0.5], logits=[np.array([0.0, 4.0], np.float32)]),
        _c([0], [-0.5], logits=[np.array([0.0, 0.0], np.float32)])), "fail", 1, 1, message="max KL"),
    Case("a NaN logprob", "fidelity", _fidelity(_c(_solo(0).token_ids, [-0.5625, NAN, -0.75, -0.875])), "fail", 1, 1,
         evidence={"max_abs_logprob_diff": 0.0}, message="step 1: logprob nan vs -0.625 is not finite"),
    Case("a short output", "fidelity", _fidelity(_c([0, 1, 2], LPS[:3])), "fail", 1, 1,
         message="t0: 3 tokens in invariant mode, 4 in production"),
    Case("production ran no reference", "fidelity", lambda: _runs(_mode("invariant"), _mode("production", solo={})),
         "vacuous", 0, message="no target ran in both modes"),
    # --- drift: production batched vs production solo; a report unless gated -------------------------
    Case("production equal", "drift", _prod(), "pass", 3, requirement="report",
         message="no production divergence in 3 trials"),
    Case("production drifts (reported)", "drift", _prod({0: {"step": 1, "ulps": 3}, 2: {"step": 0, "ulps": 8}}),
         "pass", 3, 2, ((0, "t0", 1, "logprob", 3, "batch"), (2, "t0", 0, "logprob", 8, "batch")),
         {"divergent_fraction": 2 / 3, "first_divergence_steps": {"0": 1, "1": 1}, "max_ulp": 8},
         "2 of 3 production trials diverged from production solo", requirement="report"),
    Case("drift past the fraction gate", "drift",
         _gated({0: {"step": 1, "ulps": 3}, 2: {"step": 0, "ulps": 8}}, max_divergent_fraction=0.5),
         "fail", 3, 2, ((0, "t0", 1, "logprob", 3, "batch"), (2, "t0", 0, "logprob", 8, "batch")),
         message="divergent fraction 0.667 > 0.5"),
    Case("drift within the ULP gate", "drift", _gated({2: {"step": 0, "ulps": 8}}, max_ulp=8),
         "pass", 3, 1, ((2, "t0", 0, "logprob", 8, "batch"),)),
    Case("drift past the ULP gate", "drift", _gated({2: {"step": 0, "ulps": 8}}, max_ulp=7),
         "fail", 3, 1, ((2, "t0", 0, "logprob", 8, "batch"),), message="max ULP 8 > 7"),
    # A token flip or a short answer has no ULP distance: past any ULP gate, never counted as 0 ULP.
    Case("a token flip past any ULP gate", "drift", _gated({1: {"step": 0, "token": 5}}, max_ulp=1000),
         "fail", 3, 1, ((1, "t1", 0, "token", None, "batch"),), message="a different token"),
    Case("a short output past any ULP gate", "drift", _gated({1: {"tokens": [10, 11], "lps": LPS[:2]}}, max_ulp=1000),
         "fail", 3, 1, ((1, "t1", 2, "length", None, "batch"),)),
    Case("production never batched", "drift", _prod(batch_of=lambda i: 1), "vacuous", 3, requirement="report"),
    # --- negative control: production must diverge somewhere ------------------------------------------
    Case("production diverged", "negative_control", _prod({1: {"step": 3, "ulps": 1}}), "pass", 3, 1,
         requirement="warn"),
    Case("production never diverged", "negative_control", _prod(), "vacuous", 3, requirement="warn",
         message="production never diverged"),
    Case("production did not run", "negative_control", lambda: _runs(_mode("invariant")), "vacuous", 0,
         requirement="warn", message="production mode did not run"),
    # --- prefill vs decode --------------------------------------------------------------------------
    Case("re-prefilled steps equal", "prefill_decode", _prefill({(0, 0): _step(0, 0), (1, 3): _step(1, 3)}),
         "pass", 2),
    Case("a re-prefilled step differs", "prefill_decode", _prefill({(0, 0): _step(0, 0), (1, 3): _step(1, 3, 5)}),
         "fail", 2, 1, ((None, "t1", 3, "logprob", 5, "prefill"),)),
    Case("nothing re-prefilled", "prefill_decode", _prefill({}), "vacuous", 0),
    # --- prefix cache: warm == cold, with evidence of a hit ------------------------------------------
    Case("warm equal with a hit", "prefix_cache", _prefix({0: (_solo(0), _like(_solo(0), 1, cached=3))}), "pass", 1,
         evidence={"warm_runs_with_cache_hits": 1}),
    Case("warm differs", "prefix_cache", _prefix({0: (_solo(0), _like(_solo(0), 1, cached=3, step=2, ulps=1))}),
         "fail", 1, 1, ((None, "t0", 2, "logprob", 1, "prefix_cache"),)),
    Case("the cold run hit the cache too (a reset that did nothing)", "prefix_cache",
         _prefix({0: (_like(_solo(0), 1, cached=3), _like(_solo(0), 1, cached=3))}), "vacuous", 1,
         message="1 of 1 cold runs hit the prefix cache"),
    Case("warm never hit the cache", "prefix_cache", _prefix({0: (_solo(0), _like(_solo(0), 1))}), "vacuous", 1,
         message="no warm run hit the prefix cache"),
    Case("no prefix cache, required", "prefix_cache", _prefix({}, "no cache here"), "vacuous", 0,
         message="no cache here"),
    Case("no prefix cache, warn", "prefix_cache", _prefix({}, "no cache here"), "skipped", 0, requirement="warn"),
    # --- seeded sampling ----------------------------------------------------------------------------
    Case("own noise, batched", "seeded_sampling", _sampled(((ONE, TWO), (ONE, TWO))), "pass", 4,
         evidence={"requests_batched": 4, "seed_pairs_that_differ_alone": 1, "seed_pairs_identical_in_a_batch": 0}),
    Case("one request differs in a batch", "seeded_sampling",
         _sampled(((ONE, TWO), (ONE, _c([3, 4], [-0.5, _ulps(-0.625, 1)], 2)))), "fail", 4, 1,
         ((None, "t0", 1, "logprob", 1, "sampling"),)),
    Case("the batch shares one seed", "seeded_sampling", _sampled(((ONE, replace(ONE, request_id="s1")),
                                                                   (ONE, TWO))), "fail", 4, 1,
         ((None, "t0", 0, "token", None, "sampling"),), message="the batch shares one seed's noise"),
    Case("never batched", "seeded_sampling", _sampled(((_c([1, 2], [-0.5, -0.625]), _c([3, 4], [-0.5, -0.625])),)),
         "vacuous", 2, message="no sampled request shared a forward pass"),
    Case("the engine does not sample", "seeded_sampling", _sampled((), note="greedy only"), "vacuous", 0,
         message="greedy only"),
    # --- cross instance -----------------------------------------------------------------------------
    Case("two instances agree", "cross_instance", _instance({0: _solo(0)}, {1: _like(SOLO[1], 3)}), "pass", 2),
    Case("two instances differ", "cross_instance", _instance({0: _like(_solo(0), 1, step=1, ulps=2)}, {}),
         "fail", 1, 1, ((None, "t0", 1, "logprob", 2, "instance"),)),
    Case("one server for both", "cross_instance", _instance({0: _solo(0)}, {}, {"base_url": "http://x"},
                                                            {"base_url": "http://x"}), "vacuous", 0,
         message="both instances are the server at http://x"),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c.check}: {c.id}" for c in CASES])
def test_each_check_judges_the_table(case: Case) -> None:
    check = CHECKS[case.check].judge
    judged = check(case.runs(), case.requirement)
    r = judged.result
    assert (r.name, r.verdict, r.trials, r.divergent) == (case.check, case.verdict, case.trials, case.divergent), \
        r.message
    assert r.requirement == case.requirement
    got = tuple((d.trial_id, d.target, d.step, d.kind, d.ulp, d.cause) for d in judged.divergences)
    assert got == case.records
    assert all(d.check == case.check for d in judged.divergences)
    for key, value in case.evidence.items():
        assert r.evidence[key] == value, key
    assert case.message in r.message


def test_no_verdict_of_a_broken_output_is_a_pass() -> None:
    """NaN and short outputs, wherever they sit, never pass any check that reads them."""
    broken = [c for c in CASES if "NaN" in c.id or "short" in c.id]
    assert len(broken) >= 5
    for case in broken:
        assert CHECKS[case.check].judge(case.runs(), "required").result.verdict != "pass", case.id


def test_a_divergence_record_carries_the_trial_and_the_values() -> None:
    judged = CHECKS["invariance"].judge(_inv({1: {"step": 2, "ulps": 16}})(), "required")
    (d,) = judged.divergences
    assert d.mode == "invariant" and d.request_id == "trial"
    assert d.trial is not None and d.trial.trial_id == 1 and len(d.trial.fillers) == 2 and d.trial.position == 2
    assert (d.expected_token, d.actual_token) == (12, 12)
    assert d.expected_logprob == -0.75 and d.actual_logprob == _ulps(-0.75, 16)
    assert d.reference_margin == 1.0 and d.near_tie is False  # fidelity.near_tie 0.01 by default
    assert d.evidence["num_seqs"] == 3 and d.evidence["token_index"] == 2  # the pass that computed step 2


def _everything(prod: ModeResult | None) -> Runs:
    inv = _mode("invariant", trials=_batched(), repeats=MappingProxyType({0: _like(SOLO[0], 2)}))
    return _runs(inv, prod)


def test_judge_runs_the_enabled_checks_of_the_modes_that_ran() -> None:
    prod = _mode("production", trials=_batched({1: {"step": 0, "ulps": 1}}))
    results, records = judge(_everything(prod))
    assert {r.name: r.verdict for r in results} == {
        "invariance": "pass", "repeatability": "pass", "fidelity": "pass", "drift": "pass",
        "negative_control": "pass", "prefill_decode": "vacuous", "prefix_cache": "vacuous"}
    assert [(d.check, d.trial_id) for d in records] == [("drift", 1)]


def test_a_mode_that_never_ran_leaves_its_checks_out() -> None:
    """Production's engine failed to start: the checks that need it are not judged, never passed."""
    results, _ = judge(_everything(None))
    assert [r.name for r in results] == ["invariance", "repeatability", "negative_control", "prefill_decode",
                                         "prefix_cache"]
    assert next(r for r in results if r.name == "negative_control").verdict == "vacuous"


def test_checks_turned_off_are_neither_judged_nor_run() -> None:
    config = _config(repeatability="off", fidelity="off", drift="off", negative_control="off",
                     prefill_decode="off", prefix_cache="off")
    assert modes_read(config) == ["invariant"]
    results, _ = judge(_runs(_mode("invariant", trials=_batched()), None, config))
    assert [(r.name, r.verdict) for r in results] == [("invariance", "pass")]
    assert modes_read(_config()) == ["invariant", "production"]
    assert modes_read(_config(invariance="off", repeatability="off", fidelity="off", prefill_decode="off",
                              prefix_cache="off")) == ["production"]


def test_one_server_for_both_modes_makes_the_mode_comparisons_vacuous() -> None:
    config = parse_config({"model": "unused", "prompts": {"random": {"count": 2}},
                           "engine": {"kind": "openai", "options": {"base_url": "http://localhost:1"}}})
    prod = _mode("production", trials=_batched({1: {"step": 0, "ulps": 1}}))
    runs = _runs(_mode("invariant", trials=_batched()), prod, config)
    verdicts = {r.name: r.verdict for r in judge(runs)[0]}
    assert verdicts["fidelity"] == verdicts["drift"] == verdicts["negative_control"] == "vacuous"
    assert verdicts["invariance"] == "pass"


def test_coverage_counts_what_the_invariant_trials_hit() -> None:
    trials = dict(TRIALS)
    trials[1] = replace(TRIALS[1], position=0, target_arrival_step=1)
    cov = coverage(_runs(_mode("invariant", trials=_batched({2: {"cached": 2}})), trials=trials))
    assert cov["trials run"] == 3 and cov["target shared a pass"] == 3
    assert cov["target last in batch"] == 2 and cov["target first in batch"] == 1
    assert cov["staggered arrival"] == 1 and cov["target prompt hit the prefix cache"] == 1
    assert cov["mixed prefill+decode pass"] == 0 and cov["target prompt chunked"] == 0
    assert coverage(_runs(None, _mode("production", trials=_batched()))) == {}


def test_nan_never_counts_as_within() -> None:
    from oracle.checks.base import within

    assert not any(within(v, math.inf) for v in (math.nan, math.inf, None))
    assert within(0.25, 0.25) and not within(0.25, 0.25, strict=True)
