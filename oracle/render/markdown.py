"""A Markdown summary, ready to append to $GITHUB_STEP_SUMMARY."""

from __future__ import annotations

from oracle.report import Report

_ICON = {"pass": "pass", "fail": "**FAIL**", "vacuous": "*vacuous*", "error": "**ERROR**", "skipped": "skipped"}


def _cell(x: object) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def render_markdown(report: Report, max_rows: int = 10) -> str:
    code = report.exit_code()
    env = report.environment
    lines = [
        f"## oracle: {'passed' if code == 0 else 'failed'} (exit {code})",
        "",
        f"seed `{report.seed}` · torch {env.get('torch')} · {env.get('gpu') or 'CPU'} · "
        f"{env.get('trials', 0)} trials over {env.get('targets', 0)} targets · {report.timings.get('total_s', 0)} s",
        "",
        "| check | requirement | verdict | trials | divergent | detail |",
        "| --- | --- | --- | ---: | ---: | --- |",
    ]
    for c in report.checks:
        lines.append(f"| {c.name} | {c.requirement} | {_ICON.get(c.verdict, c.verdict)} | {c.trials} | "
                     f"{c.divergent} | {_cell(c.message)} |")
    if report.error:
        lines += ["", f"**engine error:** {_cell(report.error)}"]
    for check in ("invariance", "repeatability", "prefill_decode", "drift"):
        rows = [d for d in report.divergences if d.check == check]
        if not rows:
            continue
        lines += ["", f"### {check}: first divergences ({len(rows)} in all)", "",
                  "| target | trial | step | kind | token exp → act | ULP | max abs Δlogit | margin | seqs in pass |",
                  "| --- | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: |"]
        for d in rows[:max_rows]:
            lines.append(
                f"| {_cell(d.target)} | {d.trial_id} | {d.step} | {d.kind} | {d.expected_token} → {d.actual_token} | "
                f"{d.ulp} | {_fmt(d.max_abs_logits_diff)} | {_fmt(d.reference_margin)} | "
                f"{d.evidence.get('num_seqs', '')} |")
    replay = next((d for d in report.divergences if d.check == "invariance" and d.trial_id is not None), None)
    if replay:
        lines += ["", f"Replay: `oracle replay REPORT_DIR/report.json --trial {replay.trial_id}`"]
    return "\n".join(lines) + "\n"


def _fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.3g}"
