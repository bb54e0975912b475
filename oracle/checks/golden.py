"""golden: invariant mode's references against a golden file recorded earlier (another torch, engine version
or GPU), with what changed in the environment, and production's variance map against a pinned one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from oracle.checks.base import INV, Check, Judged, Runs
from oracle.report import CheckResult
from oracle.report_sections import PostureRecord, environment_json

# Environment fields a golden file does not pin: where the model sits, the schedule's size, production's side.
_GOLDEN_UNPINNED = ("model_dir", "trials", "targets", "target_names", "engines.production",
                    "posture.modes.production", "posture.digests.production", "posture.digest")


def _golden_environment_changes(runs: Runs, pinned: Mapping[str, Any]) -> dict[str, Any]:
    """What changed in the environment since the golden file was written, in the fields it pins."""
    from oracle.golden import environment_changes

    changed = environment_changes(pinned.get("environment", {}), environment_json(runs.environment))
    return {k: v for k, v in changed.items() if not k.startswith(_GOLDEN_UNPINNED)}


def _golden_diff_message(differing: int, n: int, changed: Mapping[str, Any], map_note: str) -> str:
    """How many targets left the golden file, and the first environment changes that might say why."""
    what = ", ".join(f"{k}: {v[0]} -> {v[1]}" for k, v in list(changed.items())[:4]) or "nothing recorded"
    return (f"{differing} of {n} targets differ from the golden file; "
            f"changed: {what}" + (f"; variance map: {map_note}" if map_note else ""))


def golden(runs: Runs, requirement: str) -> Judged:
    from oracle.golden import compare_golden

    assert runs.inv is not None and runs.golden is not None
    refs = {runs.targets[i].name: c for i, c in runs.inv.solo.items()}
    prompts = {t.name: t.token_ids for t in runs.targets}
    diffs = compare_golden(dict(runs.golden), refs, prompts)
    changed = _golden_environment_changes(runs, runs.golden)
    posture = runs.environment.get("posture")
    ev = {"targets": len(refs), "differing": diffs, "environment_changes": changed,
          "config_digest": {"golden": runs.golden.get("config_digest"), "now": runs.config.digest()},
          "posture_digest": {"golden": runs.golden.get("posture_digest"),
                             "now": None if posture is None else
                             PostureRecord.model_validate(posture).digests.get("invariant")}}
    if not refs:
        return Judged(CheckResult.vacuous("golden", requirement, evidence=ev,
                                  message="no reference completed"))
    map_note = _golden_map(runs, ev)
    if map_note and not diffs:
        return Judged(CheckResult.failed("golden", requirement, trials=len(refs),
                                  evidence=ev, message=f"{len(refs)} targets bitwise equal to the golden file, but "
                                                       f"production's variance map changed: {map_note}"))
    if diffs:
        return Judged(CheckResult.failed("golden", requirement, trials=len(refs),
                                  divergent=len(diffs), evidence=ev,
                                  message=_golden_diff_message(len(diffs), len(refs), changed, map_note)))
    return Judged(CheckResult.passed("golden", requirement, trials=len(refs), evidence=ev,
                              message=f"{len(refs)} targets bitwise equal to the golden file"))


def _golden_map(runs: Runs, ev: dict[str, Any]) -> str:
    """The golden file's pinned variance map (`oracle pin-map`) against this run's: the named changes, "" for
    none; evidence says when a pinned map could not be compared (drift not localized here)."""
    from oracle.variance_map import map_changes, variance_map

    pinned = runs.golden.get("variance_map") if runs.golden is not None else None
    if not isinstance(pinned, dict):
        return ""
    now = variance_map(runs)
    if now is None:
        ev["variance_map"] = "pinned in the golden file, not compared: this run did not localize drift " \
                             "(checks.drift.localize)"
        return ""
    added, unseen = map_changes(pinned.get("ops") or {}, now)
    ev["variance_map_changes"] = added
    if unseen:
        ev["variance_map_unseen"] = unseen
    return "; ".join(added)


ROW = Check("golden", golden, INV, INV, applies=lambda runs: runs.golden is not None)
