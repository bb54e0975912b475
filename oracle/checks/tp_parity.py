"""The tp_parity check: the same prompts at two tensor-parallel sizes, and how far apart they are.

Batch invariance promises one answer per prompt at one layout of the model. A different number of
ranks splits every row-parallel matmul's reduction (and adds an all-reduce), so the answers at TP 1
and at TP N may differ by design: this check reports by how much (targets that differ, first step,
ULP, largest logprob difference, tokens that flipped). Off by default, and reported rather than
required unless the config says `required`.

Its runs (`RUNS`): invariant mode's engine is started again at `checks.tp_parity.tensor_parallel_size`
(the engine's config from `parity_config`) after the run's own engine closed, and runs every target's solo
reference; the check compares those with the run's own references (`tp_parity`). Where one differs (and
`checks.tp_parity.localize` is `first`), the first differing target alone is captured in every rank there, then
the run's engine is started once more and captures it too: the first op where the sizes part is the check's
localized op (`oracle.localize_sizes`), with `repro-tp_parity/` in the report folder where it was confirmed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from oracle.checks.base import INV, Check, CheckContext, CheckRun, Judged, Runs, invariant_per_target
from oracle.compare import first_divergence
from oracle.config import EngineConfig
from oracle.engines.contract import Completion, Engine, RunSpec
from oracle.lifecycle.watchdog import start_engine
from oracle.localized_op import LocalizedOp
from oracle.mode_result import InstanceRun
from oracle.plan import solo_request
from oracle.report import CheckResult

FIELD = "tensor_parallel_size"


def run_size(cfg: EngineConfig) -> int:
    """The tensor-parallel size the run's engine is started with (1 where the options leave it out)."""
    size = cfg.options.get(FIELD, 1)
    return size if isinstance(size, int) and not isinstance(size, bool) else 1


def parity_config(cfg: EngineConfig, size: int) -> EngineConfig:
    """The engine's config with `size` ranks, everything else as the run's."""
    return cfg.model_copy(update={"options": {**cfg.options, FIELD: size}})


def _max_logprob_diff(a: Completion, b: Completion) -> float:
    """Largest |logprob difference| over the steps both sampled the same token up to the first flip."""
    worst = 0.0
    for i in range(min(len(a.token_ids), len(b.token_ids))):
        if a.token_ids[i] != b.token_ids[i]:
            break
        diff = abs(a.logprobs[i] - b.logprobs[i])
        if not math.isfinite(diff):
            return math.inf
        worst = max(worst, diff)
    return worst


def compare(own: Mapping[int, Completion], other: Mapping[int, Completion],
            names: list[str]) -> dict[str, Any]:
    """Per target, where the run's references and the other size's first differ, and the sizes of it."""
    differing: list[dict[str, Any]] = []
    compared = 0
    worst_lp = 0.0
    for t, b in other.items():
        if t not in own:
            continue
        compared += 1
        a = own[t]
        worst_lp = max(worst_lp, _max_logprob_diff(a, b))
        d = first_divergence(a, b)
        if d is not None:
            differing.append({"target": names[t], "step": d.step, "kind": d.kind, "ulp": d.ulp,
                              "first_token_step": d.first_token_step,
                              "max_abs_logits_diff": d.max_abs_logits_diff})
    ulps = [d["ulp"] for d in differing if d["ulp"] is not None]
    return {"targets": compared, "differing": differing, "max_ulp": max(ulps) if ulps else None,
            "max_abs_logprob_diff": worst_lp,
            "token_flips": sum(d["first_token_step"] is not None for d in differing)}


def same_size_note(cfg: EngineConfig, size: int) -> str | None:
    """Why no second engine is started: the run itself is at `size` ranks (None when it is not)."""
    own = run_size(cfg)
    if size != own:
        return None
    return (f"the run itself is at {FIELD} {own}: set checks.tp_parity.{FIELD} to another size, or "
            f"engine.options.{FIELD}")


def tp_parity(runs: Runs, requirement: str) -> Judged:
    """Invariant mode's references at the run's tensor-parallel size (`own`) against those of invariant mode
    started at the check's size (`other`; with a note when it did not run): reported with the size of their
    difference."""
    inv = runs.inv
    other: InstanceRun | None = inv.checks.get("tp_parity") if inv is not None else None
    run_tp, other_tp = run_size(runs.config.engine), runs.config.checks.tp_parity.tensor_parallel_size
    ev: dict[str, Any] = {"tensor_parallel_size": run_tp, "compared_with": other_tp}
    if inv is None or other is None or other.note:
        note = (other.note if other is not None else "") or "invariant mode did not run at a second tensor-parallel size"
        return Judged(CheckResult.vacuous("tp_parity", requirement, evidence=ev, message=note))
    ev.update(compare(inv.solo, other.solo, [t.name for t in runs.targets]))
    n, differing = ev["targets"], ev["differing"]
    sizes = f"TP {run_tp} and TP {other_tp}"
    if n == 0:
        return Judged(CheckResult.vacuous("tp_parity", requirement, evidence=ev,
                                          message=f"no target completed at both {sizes}"))
    if not differing:
        return Judged(CheckResult.passed("tp_parity", requirement, trials=n, evidence=ev,
                                         message=f"{n} targets bitwise equal at {sizes}"))
    message = _difference(ev, n, sizes)
    if other.localized is not None:
        op = LocalizedOp.from_json(other.localized)
        ev["localized_op"] = op.to_json()
        message += f"; {op.finding()}" + (f" (repro: {op.repro})" if op.repro else "")
    elif other.localize_note:
        ev["localize_note"] = other.localize_note
        message += f"; not localized: {other.localize_note}"
    return Judged(CheckResult.failed("tp_parity", requirement, trials=n, divergent=len(differing), evidence=ev,
                                     message=message))


def _difference(ev: dict[str, Any], n: int, sizes: str) -> str:
    """How many targets differ between the sizes, where the first does, and by how much."""
    differing = ev["differing"]
    first = differing[0]
    ulp = f", {ev['max_ulp']} ULP at most" if ev["max_ulp"] is not None else ""
    flips = f"; tokens differ in {ev['token_flips']}" if ev["token_flips"] else "; every token the same"
    return (f"{len(differing)} of {n} targets differ between {sizes} (outside what batch invariance "
            f"promises): {first['target']} first at step {first['step']}{ulp}; max |dlogprob| "
            f"{ev['max_abs_logprob_diff']:.3g}{flips}")


def _run(context: CheckContext) -> None:
    """Start invariant mode's engine again at the check's size and run every reference on it; where a target
    differs, localize it (`_localize`)."""
    plan, mode = context.plan, context.mode
    cfg, size = plan.config.engine, plan.config.checks.tp_parity.tensor_parallel_size
    note = same_size_note(cfg, size)
    if note is not None:
        context.keep(InstanceRun(note=note))
        return
    kept: list[InstanceRun] = []
    first: list[Any] = []  # (the target's solo RunSpec, its capture at the check's size), or a note

    def keep(run: InstanceRun) -> None:
        kept.append(replace(run, engine={**run.engine, FIELD: size}))
        context.keep(kept[-1])

    def then(engine: Engine, run: InstanceRun) -> InstanceRun:
        if plan.config.checks.tp_parity.localize == "off":
            return run
        spec = _first_differing(context, run)
        if spec is not None:
            try:
                from oracle.localize_sizes import capture_size  # torch: only where a localization runs

                first.append((spec, capture_size(engine, spec, size)))
            except Exception as err:  # noqa: BLE001 - the check's verdict stands without the op
                first.append(f"not captured at {FIELD} {size}: {type(err).__name__}: {err}")
        return run

    context.run_again(f"{mode} ({FIELD} {size})", lambda: start_engine(parity_config(cfg, size), plan.model_dir, mode, plan.engine),
                      (), keep, then)
    if first and kept:
        context.keep(replace(kept[-1], **_localize(context, first[0])))


def _first_differing(context: CheckContext, run: InstanceRun) -> RunSpec | None:
    """The first target whose reference differs between the sizes, alone (None: none differs)."""
    for t in sorted(run.solo):
        if t in context.solo and first_divergence(context.solo[t], run.solo[t]) is not None:
            return RunSpec((solo_request(context.plan, t),), 0)
    return None


def _localize(context: CheckContext, first: Any) -> dict[str, Any]:
    """The run's engine started once more, the target captured there against its capture at the check's size,
    the op where they part named (and confirmed where the run's size is the larger): InstanceRun's fields."""
    if isinstance(first, str):
        return {"localize_note": first}
    spec, captured = first
    plan, mode = context.plan, context.mode
    own = run_size(plan.config.engine)
    try:
        engine = start_engine(plan.config.engine, plan.model_dir, mode, plan.engine)
        try:
            from oracle.localize_sizes import localize_between

            op = localize_between(captured, engine, own, spec, context.repro_dir("tp_parity"))
        finally:
            engine.close()
    except Exception as err:  # noqa: BLE001 - the check's verdict stands without the op
        return {"localize_note": f"not localized at {FIELD} {own}: {type(err).__name__}: {err}"}
    if op is None:
        return {"localize_note": f"no op held whole at both sizes differed for {spec.requests[0].request_id}"}
    return {"localized": op.to_json()}


RUNS = CheckRun(InstanceRun, _run, invariant_per_target, after_close=True)
ROW = Check("tp_parity", tp_parity, INV, INV, RUNS)
