"""prefill_decode: the logprob of a generated token equals the logprob of the same token when the prompt and
the tokens before it are prefilled again (invariant mode).

Its runs, on invariant mode's engine once the trials are done: per target, `checks.prefill_decode.steps` of
its decode steps prefilled again, the first that differs localized."""

from __future__ import annotations

from collections.abc import Mapping

from oracle.checks.base import (
    INV,
    INVARIANT_SECTION,
    Check,
    CheckContext,
    CheckRun,
    Judged,
    Runs,
    invariant_per_target,
    record,
)
from oracle.compare import Divergence, first_divergence, step_of
from oracle.engines.contract import Completion, Request, RunSpec
from oracle.plan import Plan, solo_request, target_sampling
from oracle.report import CheckResult, DivergenceRecord


def _prefill_request(plan: Plan, t: int, ref: Completion, i: int) -> Request:
    """Target t's prompt plus its first i generated tokens, one token asked: step i of decode, prefilled."""
    target = plan.targets[t]
    return Request(f"prefill-{target.name}-{i}", target.token_ids + tuple(ref.token_ids[:i]),
                   target_sampling(plan.config, 1))


def _prefill_steps(n: int, steps: int) -> list[int]:
    """`steps` decode steps spread over n generated tokens, the first and the last among them."""
    return sorted({round(k * (n - 1) / max(1, steps - 1)) for k in range(steps)})[:steps]


def _run(context: CheckContext) -> None:
    """Per target, `checks.prefill_decode.steps` of its decode steps prefilled again; the first that differs
    from decode is localized. Kept: (target, step) -> the re-prefilled step."""
    plan, solo = context.plan, context.solo
    prefill: dict[tuple[int, int], Completion] = {}
    context.keep(prefill)  # filled as it runs: an engine that dies keeps what completed
    if plan.model.layout.prefill_decode_differs() is not None:
        return  # not applicable: the check says why (oracle.models.layers)
    for t in range(len(plan.targets)):
        ref = solo[t]
        for i in _prefill_steps(len(ref.token_ids), plan.config.checks.prefill_decode.steps):
            prefill[(t, i)] = context.fresh([_prefill_request(plan, t, ref, i)])[0]
            context.advance()
    bad = [(t, i) for (t, i), again in prefill.items() if first_divergence(step_of(solo[t], i), again) is not None]
    for t, i in bad[:1]:
        context.localize(("prefill", t, i), RunSpec((solo_request(plan, t),), 0),
                         RunSpec((_prefill_request(plan, t, solo[t], i),), 0))


def _units(context: CheckContext) -> int:
    return len(context.plan.targets) * context.plan.config.checks.prefill_decode.steps


RUNS = CheckRun(Mapping[tuple[int, int], Completion], _run, invariant_per_target, phase="prefill/decode check",
                units=_units)


def prefill_decode(runs: Runs, requirement: str) -> Judged:
    """Step i's output in decode == the output of prefilling the prompt plus tokens[:i], bitwise."""
    inv = runs.inv
    assert inv is not None
    if why := runs.environment.get("prefill_decode_not_applicable"):
        return Judged(CheckResult.skipped("prefill_decode", requirement, message=f"not applicable: {why}"))
    prefill: Mapping[tuple[int, int], Completion] = inv.checks.get("prefill_decode", {})
    recs: list[DivergenceRecord] = []
    for (t, step), again in prefill.items():
        d = first_divergence(step_of(inv.solo[t], step), again)
        if d is not None:
            d = Divergence(step, d.kind, d.expected_token, d.actual_token, d.expected_logprob,
                           d.actual_logprob, d.ulp, d.max_abs_logits_diff, d.reference_margin,
                           None if d.first_token_step is None else step)
            recs.append(record(runs, "prefill_decode", "invariant", None, t, again, d, "prefill",
                               inv.localized.get(("prefill", t, step))))
    n = len(prefill)
    if n == 0:
        return Judged(CheckResult.vacuous("prefill_decode", requirement, message="nothing re-prefilled"))
    if recs:
        return Judged(CheckResult.failed("prefill_decode", requirement, trials=n,
                                  divergent=len(recs), message=f"{len(recs)} of {n} re-prefilled steps differ "
                                                               "from decode"), tuple(recs))
    return Judged(CheckResult.passed("prefill_decode", requirement, trials=n,
                              message=f"{n} generated steps bitwise equal when their prefix is prefilled again"))


ROW = Check("prefill_decode", prefill_decode, INV, INV, RUNS, section=INVARIANT_SECTION)
