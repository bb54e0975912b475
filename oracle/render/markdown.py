"""A Markdown summary, ready to append to $GITHUB_STEP_SUMMARY.

Every user string (target names, messages, engine errors) goes through `markdown_text`: HTML,
backticks and cell breaks are escaped, so model text is never read as markup.
"""

from __future__ import annotations

from typing import Any

from oracle.posture import hazard_summary_lines, summary_line
from oracle.render.escape import markdown_text, terminal_text
from oracle.render.findings import coverage, golden_lines, is_minimal, localized_line, minimal_first, ulp_text
from oracle.render.timings import timing_line
from oracle.render.verdict import headline, is_warning, shown_verdict
from oracle.report import Report

_ICON = {"pass": "pass", "fail": "**FAIL**", "vacuous": "*vacuous*", "error": "**ERROR**", "skipped": "skipped",
         "reported": "*reported*"}
_CHECKS = ("invariance", "repeatability", "prefill_decode", "prefix_cache", "seeded_sampling", "cross_instance", "drift")


def _verdict_cell(c: Any) -> str:
    shown = shown_verdict(c)
    if is_warning(c):
        return f"*warning: {shown}*"
    return _ICON.get(shown, markdown_text(shown))


def render_markdown(report: Report, max_rows: int = 10, report_path: str = "report.json") -> str:
    """The summary; `report_path`: where report.json is, for the replay command."""
    env = report.environment
    lines = [
        f"## oracle: {headline(report)}",
        "",
        f"seed `{report.seed}` · torch {markdown_text(env.get('torch'))} · {markdown_text(env.get('gpu') or 'CPU')} · "
        f"{markdown_text(env.get('trials', 0))} trials over {markdown_text(env.get('targets', 0))} targets · "
        f"{report.timings.get('total_s', 0)} s · "
        f"config `{str(report.config_digest)[:12]}`",
        "",
        "| check | requirement | verdict | trials | divergent | detail |",
        "| --- | --- | --- | ---: | ---: | --- |",
    ]
    for c in report.checks:
        lines.append(f"| {markdown_text(c.name)} | {markdown_text(c.requirement)} | {_verdict_cell(c)} | {c.trials} | "
                     f"{c.divergent} | {markdown_text(c.message)} |")
    if report.error:
        lines += ["", f"**engine error:** {markdown_text(report.error)}"]
    spent = timing_line(report.timings)
    if spent:
        lines += ["", markdown_text(spent)]
    posture = summary_line(env)
    if posture:
        lines += ["", markdown_text(posture)]
    lines += [f"- **{markdown_text(x)}**" for x in hazard_summary_lines(env)]
    for c in report.checks:
        if c.name == "golden" and c.verdict != "pass":
            found = golden_lines(c)
            if found:
                lines += ["", "### golden: what differs", ""] + [f"- {markdown_text(x)}" for x in found]
    for check in _CHECKS:
        rows = minimal_first([d for d in report.divergences if d.check == check])
        if not rows:
            continue
        localized = any(getattr(d, "localized_op", None) for d in rows)
        lines += ["", f"### {check}: first divergences ({len(rows)} in all)", "",
                  "| target | trial | step | kind | token exp → act | ULP | max abs Δlogit | margin | seqs in pass |"
                  + (" first diverging op |" if localized else ""),
                  "| --- | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: |" + (" --- |" if localized else "")]
        for d in rows[:max_rows]:
            trial = "" if d.trial_id is None else str(d.trial_id)
            trial = f"**{trial} (minimal, shrunk)**" if is_minimal(d) else trial
            row = (f"| {markdown_text(d.target)} | {trial} | {d.step} | {markdown_text(d.kind)} | {d.expected_token} → "
                   f"{d.actual_token} | {ulp_text(d)} | {_fmt(d.max_abs_logits_diff)} | {_fmt(d.reference_margin)} | "
                   f"{markdown_text(d.evidence.get('num_seqs', ''))} |")
            if localized:
                where = localized_line(d) or ""
                row += f" {markdown_text(where.removeprefix('first diverging op: '))} |"
            lines.append(row)
        if len(rows) > max_rows:
            lines += ["", f"... and {len(rows) - max_rows} more in report.json"]
    cov = coverage(report)
    if cov:
        lines += ["", "### coverage", "", "| condition | trials |", "| --- | ---: |"]
        lines += [f"| {markdown_text(k)} | {markdown_text(v)} |" for k, v in cov.items()]
    replay = next((d for d in minimal_first(report.divergences) if d.check == "invariance" and d.trial_id is not None),
                  None)
    if replay:
        from oracle.trust import replay_command

        command = replay_command(report_path, int(replay.trial_id), report.config)
        lines += ["", f"Replay: `{terminal_text(command).replace('`', '')}`"]  # a code span: shown literally
    return "\n".join(lines) + "\n"


def _fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.3g}"
