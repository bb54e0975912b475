"""A self-contained HTML report: summary, divergence table and three plots drawn as inline SVG.

Plots: divergence rate by batch size (per check), first-divergence step histogram, and the
distribution of ULP distances (log2 buckets). No script, no external asset: it opens offline.
"""

from __future__ import annotations

import html
import math
from collections import Counter, defaultdict

from oracle.report import Report

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
.pass{color:#161}.fail,.error{color:#b00;font-weight:bold}.vacuous{color:#a60}
figure{display:inline-block;margin:1em 2em 1em 0}figcaption{font-weight:bold}
svg text{font:11px sans-serif}
"""


def _bars(title: str, data: list[tuple[str, float]], unit: str = "", fmt: str = "{:.0f}") -> str:
    """A bar chart as an SVG figure; `data` is (label, value) in display order."""
    e = html.escape
    if not data:
        return f'<figure class="plot"><figcaption>{e(title)}</figcaption><p>no data</p></figure>'
    w, h, pad = max(240, 28 * len(data) + 60), 200, 40
    top = max(v for _, v in data) or 1.0
    bw = (w - pad - 10) / len(data)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h + 40}" role="img" '
             f'aria-label="{e(title)}">',
             f'<line x1="{pad}" y1="{h}" x2="{w - 5}" y2="{h}" stroke="#444"/>']
    for i, (label, v) in enumerate(data):
        bh = (h - 20) * v / top
        x = pad + i * bw
        parts.append(f'<rect class="bar" x="{x + 2:.1f}" y="{h - bh:.1f}" width="{bw - 4:.1f}" height="{bh:.1f}" '
                     f'fill="#3a6ea5"><title>{e(label)}: {e(fmt.format(v))}{e(unit)}</title></rect>')
        parts.append(f'<text x="{x + bw / 2:.1f}" y="{h + 14}" text-anchor="middle">{e(label)}</text>')
        parts.append(f'<text x="{x + bw / 2:.1f}" y="{h - bh - 3:.1f}" text-anchor="middle">{e(fmt.format(v))}</text>')
    parts.append("</svg>")
    return f'<figure class="plot"><figcaption>{e(title)}</figcaption>{"".join(parts)}</figure>'


def _rate_by_batch(report: Report, check: str) -> list[tuple[str, float]]:
    sizes = {t.trial_id: len(t.fillers) + 1 for t in report.schedule if t.origin == "schedule"}
    diverged = {d.trial_id for d in report.divergences if d.check == check and not d.evidence.get("shrunk")}
    total: Counter[int] = Counter(sizes.values())
    bad: Counter[int] = Counter(sizes[t] for t in diverged if t in sizes)
    return [(str(b), 100.0 * bad[b] / total[b]) for b in sorted(total)]


def render_html(report: Report) -> str:
    e = html.escape
    code = report.exit_code()
    rows = "".join(
        f'<tr><td>{e(c.name)}</td><td>{e(c.requirement)}</td><td class="{e(c.verdict)}">{e(c.verdict)}</td>'
        f"<td>{c.trials}</td><td>{c.divergent}</td><td>{e(c.message)}</td></tr>" for c in report.checks)
    steps: dict[str, Counter[int]] = defaultdict(Counter)
    ulps: Counter[int] = Counter()
    for d in report.divergences:
        steps[d.check][d.step] += 1
        if d.ulp:
            ulps[int(math.log2(d.ulp))] += 1
    plots = [
        _bars("invariant-mode divergence rate by batch size (%)", _rate_by_batch(report, "invariance"), "%", "{:.0f}"),
        _bars("production-mode divergence rate by batch size (%)", _rate_by_batch(report, "drift"), "%", "{:.0f}"),
        _bars("first-divergence step (all checks)",
              [(str(k), float(v)) for k, v in sorted(sum(steps.values(), Counter()).items())]),
        _bars("ULP distance of the first divergent logprob (log2 bucket)",
              [(f"2^{k}", float(v)) for k, v in sorted(ulps.items())]),
    ]
    div_rows = "".join(
        f"<tr><td>{e(d.check)}</td><td>{e(d.target)}</td><td>{d.trial_id}</td><td>{d.step}</td><td>{e(d.kind)}</td>"
        f"<td>{d.expected_token} → {d.actual_token}</td><td>{d.ulp}</td>"
        f"<td>{'' if d.max_abs_logits_diff is None else f'{d.max_abs_logits_diff:.3g}'}</td>"
        f"<td>{'' if d.reference_margin is None else f'{d.reference_margin:.3g}'}</td>"
        f"<td>{e(str(d.evidence.get('num_seqs', '')))}</td></tr>" for d in report.divergences[:200])
    env = report.environment
    env_rows = "".join(f"<tr><td>{e(k)}</td><td>{e(str(v))}</td></tr>" for k, v in env.items() if k != "target_names")
    err = f'<p class="error">engine error: {e(report.error)}</p>' if report.error else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>oracle report</title><style>{_CSS}</style></head>
<body>
<h1>oracle report: {'passed' if code == 0 else 'failed'} (exit {code})</h1>
<p>seed {report.seed} · config {e(report.config_digest[:12])} · {report.timings.get('total_s', 0)} s</p>{err}
<h2>Checks</h2>
<table><tr><th>check</th><th>requirement</th><th>verdict</th><th>trials</th><th>divergent</th><th>detail</th></tr>
{rows}</table>
<h2>Plots</h2>
{''.join(plots)}
<h2>Divergences ({len(report.divergences)})</h2>
<table><tr><th>check</th><th>target</th><th>trial</th><th>step</th><th>kind</th><th>token</th><th>ULP</th>
<th>max abs Δlogit</th><th>margin</th><th>seqs</th></tr>{div_rows}</table>
<h2>Environment</h2><table>{env_rows}</table>
</body></html>
"""
