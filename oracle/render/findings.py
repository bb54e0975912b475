"""Findings every format shows in words: the first diverging operator of a divergence, what a golden
check found changed, a divergence's ULP distance and the command that replays it. A golden check's
evidence is open JSON (read defensively: each line shows up once its data exists)."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping

from oracle.localized_op import AFTER_MODEL
from oracle.render.verdict import minimal_first
from oracle.report import CheckResult, DivergenceRecord, Report

LOCALIZED_FIELDS = ("module", "op", "layer", "forward_pass", "engine_step", "ulp", "max_abs_diff", "eager",
                    "still_diverged")
TOKEN_CHANGED = "token changed"
LOGITS_ONLY = "logits differ"  # same token, logprob bitwise equal (a ULP distance of 0 would read as "no difference")


def localized_line(d: DivergenceRecord) -> str | None:
    """`first diverging op: MODULE (OP), layer L, pass P` for a divergence, or None when not localized."""
    lo = d.localized_op
    if lo is None:
        return None
    head = AFTER_MODEL if lo.status == "after_capture" else "first diverging op: "
    text = f"{head}{lo.module} ({lo.op})"
    if lo.layer is not None:
        text += f", layer {lo.layer}"
    if lo.rank is not None:
        text += f", rank {lo.rank}"
    text += f", pass {lo.forward_pass}"
    if not lo.still_diverged:
        text += " (the divergence did not reproduce there)"
    return text


def localized_cells(d: DivergenceRecord) -> dict[str, str]:
    """The localized op's fields as table cells (empty strings when absent)."""
    lo = d.localized_op
    return {k: _cell(None if lo is None else getattr(lo, k)) for k in LOCALIZED_FIELDS}


def _cell(v: object) -> str:
    if v is None:
        return ""
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _pair(v: object) -> tuple[object, object] | None:
    """A golden value and the run's, from `{"golden": G, "now": N}` (or `"run"`) or `[G, N]`."""
    if isinstance(v, Mapping):
        return v.get("golden"), v.get("now", v.get("run"))
    if isinstance(v, (list, tuple)) and len(v) == 2:
        return v[0], v[1]
    return None


def _short(v: object) -> str:
    s = str(v)
    return s[:12] if len(s) == 64 and all(ch in "0123456789abcdef" for ch in s) else s


def golden_lines(c: CheckResult) -> list[str]:
    """For a golden check: one line per differing target (step, tokens) and one naming what changed."""
    ev = c.evidence
    lines: list[str] = []
    for diff in ev.get("differing", []):
        target = diff.get("target", "?")
        if "problem" in diff:
            lines.append(f"golden: target {target}: {diff['problem']}")
            continue
        exp, act = diff.get("expected_token"), diff.get("actual_token")
        if diff.get("tokens_differ"):
            what = f"token {exp} -> {act}"
        else:
            what = f"same token {exp}, logprob or logits bits differ"
        lines.append(f"golden: target {target}: step {diff.get('step')}: {what}")
    if lines or ev.get("environment_changes") or "config_digest" in ev:
        lines.append("golden: changed since the golden file: " + changes_text(ev))
    return lines


def changes_text(ev: Mapping[str, object]) -> str:
    """`torch: 2.11 -> 2.13; config digest: abc -> def` from a golden check's evidence."""
    parts = []
    changes = ev.get("environment_changes") or {}
    for key, value in (changes.items() if isinstance(changes, Mapping) else ()):
        pair = _pair(value)
        parts.append(f"{key}: {pair[0]} -> {pair[1]}" if pair else f"{key}: {value}")
    digest = _pair(ev.get("config_digest"))
    if digest is not None:
        parts.append(f"config digest: {_short(digest[0])} -> {_short(digest[1])}" if digest[0] != digest[1]
                     else f"config digest unchanged ({_short(digest[0])})")
    return "; ".join(parts) or "nothing recorded in the environment"


def ulp_text(d: DivergenceRecord) -> str:
    """A divergence's ULP distance as views show it: only between logprobs of the same token; a changed
    token says so (an older report may still hold a ULP computed across two tokens: not shown)."""
    if d.kind == "token":
        return TOKEN_CHANGED
    if d.kind == "logits":
        return LOGITS_ONLY
    return "" if d.ulp is None else str(d.ulp)


def replay_line(report: Report, report_path: str, d: DivergenceRecord) -> str | None:
    """The command that reruns `d`'s trial of this report as the run did, ready to paste into a shell: the
    path quoted, `--trust-report` where the config loads code (oracle.trust). None for a divergence that is
    not a trial's (a re-prefill or warm-cache comparison)."""
    if d.trial_id is None:
        return None
    from oracle.trust import replay_command

    return replay_command(shlex.quote(report_path), d.trial_id, report.config)


def replay_lines(report: Report, report_path: str, checks: Iterable[str] | None = None) -> list[tuple[str, str]]:
    """(check, command) for each check with a divergence in a trial: its first one as every view orders
    them (the shrunk minimal trial first), so each view gives the same command for a check."""
    found = []
    for name in dict.fromkeys(checks if checks is not None else (d.check for d in report.divergences)):
        first = next((d for d in minimal_first(report.divergences) if d.check == name and d.trial_id is not None),
                     None)
        command = None if first is None else replay_line(report, report_path, first)
        if command is not None:
            found.append((name, command))
    return found
