"""A Report built by hand for renderer tests: every verdict, every requirement, hostile strings."""

from __future__ import annotations

from typing import Any

from oracle.report import CheckResult, DivergenceRecord, Report

# Control bytes, a terminal escape, HTML, backticks, a Markdown cell break and a lone surrogate.
HOSTILE = "evil\x1b[31mRED\x07\x00<b>bold</b>`code`|cell\ud800\x0c&amp;"

LOCALIZED = {"module": "model.layers.1.mlp.down_proj", "op": "aten::mm", "layer": 1, "forward_pass": 3,
             "engine_step": 4, "positions": [5, 6], "shape": [8, 64], "ulp": 2, "max_abs_diff": 1.5e-7,
             "inputs_equal": True, "eager": True, "still_diverged": True}

COVERAGE = {"batched": 12, "chunked_prefill": 5, "prefix_cache_hit": 0}


def trial(trial_id: int, batch: int, position: int = 0) -> dict[str, Any]:
    fillers = [{"length": 1, "max_tokens": 1, "seed": i, "arrival_step": 0} for i in range(batch - 1)]
    return {"trial_id": trial_id, "target": 0, "position": position, "target_arrival_step": 0,
            "fillers": fillers, "max_num_batched_tokens": None}


def divergence(check: str, target: str, trial_id: int | None, *, mode: str = "invariant", step: int = 1,
               ulp: int | None = 3, batch: int = 4, shrunk: bool = False,
               localized: dict[str, Any] | None = None) -> DivergenceRecord:
    ev: dict[str, Any] = {"num_seqs": batch}
    if shrunk:
        ev["shrunk"] = True
        ev["minimal"] = True
    return DivergenceRecord(
        check=check, mode=mode, target=target, trial_id=trial_id,
        trial=trial(trial_id, batch) if trial_id is not None else None, request_id=f"r{trial_id}", step=step,
        kind="logprob", expected_token=5, actual_token=5, expected_logprob=-1.25, actual_logprob=-1.2500001,
        ulp=ulp, max_abs_logits_diff=2e-7, reference_margin=0.5, near_tie=False, first_token_step=None,
        evidence=ev, localized_op=localized,  # type: ignore[arg-type]
    )


def hand_report(*, error: str | None = None, with_extras: bool = True) -> Report:
    """invariance (required) fails on two targets, one of them by a hostile name; repeatability passes;
    prefill_decode (warn) fails on one target; drift (report) finds divergences but passes; golden
    (required) fails on one target with what changed."""
    targets = ["random-0", "random-1", HOSTILE]
    checks = [
        CheckResult(name="invariance", requirement="required", verdict="fail", trials=10, divergent=3,
                    evidence={}, message=f"3 of 10 trials diverged; target {HOSTILE}"),
        CheckResult(name="repeatability", requirement="required", verdict="pass", trials=4, divergent=0,
                    evidence={}, message="4 repeated trials bitwise equal"),
        CheckResult(name="fidelity", requirement="required", verdict="pass", trials=3, divergent=0,
                    evidence={}, message="invariant within 1e-07 logprob of production"),
        CheckResult(name="drift", requirement="report", verdict="pass", trials=10, divergent=2,
                    evidence={}, message="2 of 10 production trials diverged from production solo"),
        CheckResult(name="negative_control", requirement="warn", verdict="pass", trials=10, divergent=2,
                    evidence={}, message="production diverged"),
        CheckResult(name="prefill_decode", requirement="warn", verdict="fail", trials=8, divergent=1,
                    evidence={}, message="1 of 8 re-prefilled steps differ from decode"),
        CheckResult(name="golden", requirement="required", verdict="fail", trials=3, divergent=1,
                    evidence={"targets": 3,
                              "differing": [{"target": "random-1", "step": 2, "tokens_differ": True,
                                             "expected_token": 7, "actual_token": 9}],
                              "environment_changes": {"torch": ["2.11.0", "2.13.0"]},
                              "config_digest": ["a" * 64, "b" * 64]},
                    message="1 of 3 targets differ from the golden file; changed: torch: 2.11.0 -> 2.13.0"),
    ]
    divs = [
        divergence("invariance", "random-0", 1, batch=3, localized=LOCALIZED if with_extras else None),
        divergence("invariance", HOSTILE, 2, batch=9, ulp=1),
        divergence("invariance", "random-0", 7, batch=2, shrunk=True),
        divergence("prefill_decode", "random-1", None, ulp=0),
        divergence("drift", "random-0", 1, mode="production", batch=3, ulp=40),
        divergence("drift", "random-1", 2, mode="production", batch=9, ulp=1000),
    ]
    kwargs: dict[str, Any] = dict(
        oracle_version="0.1.0", seed=7, config={"model": "m"}, config_digest="b" * 64,
        environment={"python": "3.11", "torch": "2.13.0", "platform": "linux", "env": {},
                     "target_names": targets, "targets": 3, "trials": 10},
        checks=checks, divergences=divs, timings={"total_s": 1.5, "invariant_s": 0.7, "production_s": 0.6},
        schedule=[trial(i, b) for i, b in enumerate([3, 9, 1, 3, 5, 9], start=1)], error=error,
        complete=error is None,
    )
    if with_extras:
        kwargs["coverage"] = COVERAGE
    return Report(**kwargs)


def check_with(c: CheckResult, **changes: Any) -> CheckResult:
    """A copy of `c` with some fields changed (built anew, whatever kind of model CheckResult is)."""
    fields: dict[str, Any] = {"name": c.name, "requirement": c.requirement, "verdict": c.verdict, "trials": c.trials,
                              "divergent": c.divergent, "evidence": c.evidence, "message": c.message}
    return CheckResult(**{**fields, **changes})
