"""A Markdown summary, ready to append to $GITHUB_STEP_SUMMARY.

Every user string (target names, messages, engine errors) goes through `markdown_text`: HTML,
backticks and cell breaks are escaped, so model text is never read as markup.
"""

from __future__ import annotations

from oracle.posture import coverage_line, hazard_summary_lines, summary_line
from oracle.posture.evidence import evidence_lines
from oracle.render.escape import markdown_text, terminal_text
from oracle.render.findings import golden_lines, localized_line, replay_lines, ulp_text
from oracle.render.timings import timing_line
from oracle.render.verdict import (
    error_label,
    headline,
    is_warning,
    minimal_first,
    shown_verdict,
    tone,
    verdict_label,
)
from oracle.report import CheckResult, DivergenceRecord, Report

_DIVERGENCE_HEAD = ("| target | trial | step | kind | token exp → act | ULP | max abs Δlogit | margin | seqs in pass |",
                    "| --- | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: |")


def _verdict_cell(c: CheckResult) -> str:
    """Bold capitals where the check fails the run, italics for warnings and other notices."""
    if is_warning(c):
        return f"*{verdict_label(c)}*"
    shown = shown_verdict(c)
    return {"blocking": f"**{shown.upper()}**", "notice": f"*{shown}*"}.get(tone(c), shown)


def render_markdown(report: Report, max_rows: int = 10, report_path: str = "report.json") -> str:
    """The summary; `report_path`: where report.json is, for the replay command."""
    lines = _head(report) + _golden(report)
    replays = dict(replay_lines(report, report_path))
    from oracle.judge import sections  # each check's row names its section

    for check in (name for _, names in sections() for name in names):
        rows = minimal_first(d for d in report.divergences if d.check == check)
        if rows:
            lines += _divergence_section(check, rows, max_rows)
            if check in replays:  # a code span: shown literally
                lines += ["", f"Replay: `{terminal_text(replays[check]).replace('`', '')}`"]
    lines += _variance_map(report) + _coverage(report)
    return "\n".join(lines) + "\n"


def _golden(report: Report) -> list[str]:
    lines: list[str] = []
    for c in report.checks:
        found = golden_lines(c) if c.name == "golden" and c.verdict != "pass" else []
        if found:
            lines += ["", "### golden: what differs", ""] + [f"- {markdown_text(x)}" for x in found]
    return lines


def _variance_map(report: Report) -> list[str]:
    if report.variance_map is None:
        return []
    from oracle.variance_map import MAP_HEAD, map_rows, map_title

    return ["", f"### {markdown_text(map_title(report.variance_map))}", "", "| " + " | ".join(MAP_HEAD) + " |",
            "| " + " | ".join("---" for _ in MAP_HEAD) + " |",
            *("| " + " | ".join(markdown_text(x) for x in row) + " |" for row in map_rows(report.variance_map))]


def _coverage(report: Report) -> list[str]:
    if not report.coverage:
        return []
    return ["", "### coverage", "", "| condition | trials |", "| --- | ---: |",
            *(f"| {markdown_text(k)} | {markdown_text(v)} |" for k, v in report.coverage.items())]


def _head(report: Report) -> list[str]:
    """The headline, the run's facts, the checks table, the engine error, time, posture and hazards."""
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
        lines += ["", f"**{error_label(report.exit_code())}:** {markdown_text(report.error)}"]
    spent = timing_line(report.timings)
    if spent:
        lines += ["", markdown_text(spent)]
    posture = summary_line(report.posture)
    if posture:
        lines += ["", markdown_text(posture)]
    covered = coverage_line(report.posture)
    if covered:
        lines += ["", markdown_text(covered)]
    lines += [f"- **{markdown_text(x)}**" for x in hazard_summary_lines(report.hazards)]
    lines += [f"- {markdown_text(x)}" for x in evidence_lines(report.posture)]
    return lines


def _divergence_section(check: str, rows: list[DivergenceRecord], max_rows: int) -> list[str]:
    """A check's first divergences (the shrunk minimal trial first), with the op column where one is localized."""
    localized = any(d.localized_op is not None for d in rows)
    lines = ["", f"### {check}: first divergences ({len(rows)} in all)", "",
             _DIVERGENCE_HEAD[0] + (" first diverging op |" if localized else ""),
             _DIVERGENCE_HEAD[1] + (" --- |" if localized else "")]
    for d in rows[:max_rows]:
        trial = "" if d.trial_id is None else str(d.trial_id)
        trial = f"**{trial} (minimal, shrunk)**" if d.shrunk else trial
        row = (f"| {markdown_text(d.target)} | {trial} | {d.step} | {markdown_text(d.kind)} | {d.expected_token} → "
               f"{d.actual_token} | {ulp_text(d)} | {_fmt(d.max_abs_logits_diff)} | {_fmt(d.reference_margin)} | "
               f"{markdown_text(d.evidence.get('num_seqs', ''))} |")
        if localized:
            where = localized_line(d) or ""
            row += f" {markdown_text(where.removeprefix('first diverging op: '))} |"
        lines.append(row)
    if len(rows) > max_rows:
        lines += ["", f"... and {len(rows) - max_rows} more in report.json"]
    return lines


def _fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.3g}"
