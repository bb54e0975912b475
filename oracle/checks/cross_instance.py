"""cross_instance: two separately started engine instances of one mode give bitwise the same outputs on the
same trials.

Its runs, once the mode's own engine has closed: the mode's engine started again, every reference and the
schedule's first `checks.cross_instance.trials` trials run on it."""

from __future__ import annotations

from typing import Any

from oracle.checks.base import INVARIANT_SECTION, Check, CheckContext, CheckRun, Judged, Runs, record
from oracle.compare import first_divergence
from oracle.config import Config
from oracle.engines.contract import Completion, Mode
from oracle.mode_result import InstanceRun, ModeResult
from oracle.report import CheckResult
from oracle.schedule import Trial


def _run(context: CheckContext) -> None:
    """Start the mode's engine again, separately, and run every reference and the first trials on it."""
    # The schedule's first trials, also in a shard (whose `trials` are its slice), as unsharded.
    schedule = context.schedule
    n = min(context.plan.config.checks.cross_instance.trials, len(schedule))
    context.run_again(f"{context.mode} (second instance)", context.build_second, schedule[:n], context.keep)


def _wanted(context: CheckContext) -> bool:
    return context.mode == context.plan.config.checks.cross_instance.mode and context.per_target


RUNS = CheckRun(InstanceRun, _run, _wanted, after_close=True, timed_as="second_instance")


def _instance_pairs(runs: Runs, first: ModeResult,
                    second: InstanceRun) -> list[tuple[Trial | None, int, Completion, Completion]]:
    """(trial or None for a reference, target, the first instance's completion, the second's) for every run
    both instances completed: the references first, then the trials."""
    pairs: list[tuple[Trial | None, int, Completion, Completion]] = [
        (None, t, first.solo[t], c) for t, c in second.solo.items() if t in first.solo]
    pairs += [(runs.trials[i], runs.trials[i].target, first.trials[i], c) for i, c in second.trials.items()
              if i in first.trials and i in runs.trials]
    return pairs


def cross_instance(runs: Runs, requirement: str) -> Judged:
    """A second, separately started engine of the mode: every reference and the trials it ran == the first
    instance's, bitwise."""
    mode = runs.config.checks.cross_instance.mode
    first = runs.mode(mode)
    name = "cross_instance"
    second: InstanceRun | None = first.checks.get(name) if first is not None else None
    if first is None or second is None:
        return Judged(CheckResult.vacuous(name, requirement, message=f"no second {mode} instance ran"))
    ev: dict[str, Any] = {"mode": mode, "references": len(second.solo), "trials": len(second.trials)}
    if "base_url" in first.engine and first.engine.get("base_url") == second.engine.get("base_url"):
        ev["same_server"] = first.engine["base_url"]
        return Judged(CheckResult.vacuous(name, requirement, evidence=ev,
                                  message=f"both instances are the server at {first.engine['base_url']}; give the "
                                          f"mode a list of URLs (engine.options.base_url.{mode}: [URL, URL]) or "
                                          "a command that starts one"))
    pairs = _instance_pairs(runs, first, second)
    recs = [record(runs, name, mode, trial, t, b, d, "instance", reference=trial is None)
            for trial, t, a, b in pairs if (d := first_divergence(a, b)) is not None]
    n = len(pairs)
    if n == 0:
        return Judged(CheckResult.vacuous(name, requirement, evidence=ev,
                                  message=second.note or "the second instance completed nothing"))
    if recs:
        return Judged(CheckResult.failed(name, requirement, trials=n, divergent=len(recs),
                                  evidence=ev, message=f"{len(recs)} of {n} runs differ between two {mode} "
                                                       "instances"), tuple(recs))
    return Judged(CheckResult.passed(name, requirement, trials=n, evidence=ev,
                              message=f"{n} runs bitwise equal on two separately started {mode} instances"))


def _reads(config: Config) -> tuple[Mode, ...]:
    return (config.checks.cross_instance.mode,)


ROW = Check("cross_instance", cross_instance, (), (), RUNS, section=INVARIANT_SECTION, reads_also=_reads)
