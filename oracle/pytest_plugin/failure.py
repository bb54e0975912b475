"""Failure text for the pytest plugin: which checks block, and where the first divergence starts.

Plain functions over a `Report`; no torch, no engine. Which checks block, the words and the divergence
shown first are oracle.render.verdict's rules, as in every other format.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from oracle.render.findings import ulp_text
from oracle.render.verdict import error_label, first_divergence, shown_verdict
from oracle.report import CheckResult, DivergenceRecord, Report
from oracle.trust import replay_command


def describe_divergence(d: DivergenceRecord, report_path: Path, config: Mapping[str, Any]) -> list[str]:
    near = "" if d.near_tie is None else f" (near tie: {'yes' if d.near_tie else 'no'})"
    lines = [
        f"first divergence: check {d.check} ({d.mode} mode), target {d.target}, trial {d.trial_id}, "
        f"request {d.request_id}",
        f"  step {d.step} ({d.kind}): expected token {d.expected_token}, actual token {d.actual_token}",
        f"  logprob {d.expected_logprob!r} -> {d.actual_logprob!r}, " + (
            "bitwise equal; the logits row differs" if d.kind == "logits" else f"ULP distance {ulp_text(d) or None}"),
        f"  top-2 margin {_fmt(d.reference_margin)}{near}, max |logit diff| {_fmt(d.max_abs_logits_diff)}",
    ]
    if "num_seqs" in d.evidence:
        lines.append(f"  that forward pass held {d.evidence['num_seqs']} sequences, "
                     f"{d.evidence.get('num_tokens', '?')} tokens")
    if d.cause != "batch":
        lines.append(f"  cause: {d.cause}")
    if d.localized_op is not None:
        lines.append(f"  {d.localized_op.finding()}")
    if d.trial_id is not None:
        lines.append(f"replay: {replay_command(shlex.quote(str(report_path)), d.trial_id, config)}")
    return lines


def describe_failure(report: Report, report_path: Path, checks: Iterable[CheckResult] | None = None) -> str:
    """A readable account of why a run (or the given checks of it) failed."""
    shown = list(checks) if checks is not None else [c for c in report.checks if c.blocks]
    head = ", ".join(f"{c.name} {shown_verdict(c)}" for c in shown) or "no blocking check"
    lines = [f"oracle: {head} (seed {report.seed}, exit {report.exit_code()})"]
    lines += [f"  {c.name} [{c.requirement}]: {shown_verdict(c)}: {c.message}" for c in shown]
    if report.error:
        lines.append(f"  {error_label(report.exit_code())}: {report.error}")
    d = first_divergence(report, (c.name for c in shown))
    if d is not None:
        lines += describe_divergence(d, report_path, report.config)
    lines.append(f"report: {report_path}")
    return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.6g}"
