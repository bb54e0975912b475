"""A self-contained HTML report: summary, divergence table and plots drawn as inline SVG.

Plots, per check that has divergences: divergence rate by batch size (batch size on a numeric
axis, the count `diverged/run` on each bar), first-divergence step histogram, and the ULP
distances of the first divergent logprob in log2 buckets (empty buckets shown). Every plot
labels both axes. No script, no external asset: it opens offline. Every user string is escaped.
"""

from __future__ import annotations

import html
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from oracle.localized_op import AFTER_MODEL
from oracle.render.escape import terminal_text
from oracle.render.findings import golden_lines, localized_cells, replay_lines, ulp_text
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

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
.pass{color:#161}.fail,.error{color:#b00;font-weight:bold}.vacuous,.reported,.warning{color:#a60}
.blocking{color:#b00;font-weight:bold}
tr.minimal{background:#fff3c4;font-weight:bold}
table.nested{margin:0}table.nested th{font-weight:normal;color:#555}
figure{display:inline-block;margin:1em 2em 1em 0;vertical-align:top}figcaption{font-weight:bold}
svg text{font:11px sans-serif}svg .axis-label{font:12px sans-serif;fill:#333}
"""
_MINIMAL = ' class="minimal"'
_W, _H, _LEFT, _BOTTOM, _TOP, _RIGHT = 420, 180, 50, 42, 18, 12


def e(x: object) -> str:
    """Escaped for HTML text or an attribute, without control bytes."""
    return html.escape(terminal_text(x))


@dataclass(frozen=True)
class Bar:
    x: float  # position on the x axis (a batch size, a step, a bucket index)
    value: float  # bar height in the y unit
    label: str  # text on top of the bar
    tick: str  # tick label under the bar
    tip: str  # hover text


@dataclass(frozen=True)
class _Frame:
    """Where a plot's bars go: x from `lo` at `slot` px a unit, y down from `y0` over `plot_h` px."""

    width: int
    lo: float
    slot: float
    top_pad: int
    plot_h: int
    upright: bool  # counts written upright above the bars; vertical in narrower slots

    @property
    def y0(self) -> int:
        return self.top_pad + self.plot_h

    def at(self, x: float) -> float:
        return _LEFT + (x - self.lo) * self.slot


def _frame(bars: list[Bar], numeric_x: bool) -> _Frame:
    lo = min(b.x for b in bars) - 0.5 if numeric_x else -0.5
    hi = max(b.x for b in bars) + 0.5 if numeric_x else len(bars) - 0.5
    # Wider for many slots (up to 1200 px), so each bar and its count stay readable.
    width = min(1200, max(_W, _LEFT + _RIGHT + int(14 * (hi - lo))))
    slot = (width - _LEFT - _RIGHT) / (hi - lo)
    upright = slot >= 26  # narrower slots write their counts vertically, with headroom above the bars
    top_pad = _TOP if upright else max(_TOP, 7 * max(len(b.label) for b in bars) + 8)
    return _Frame(width, lo, slot, top_pad, _H - top_pad - _BOTTOM, upright)


def _axes(f: _Frame, title: str, top: float, x_label: str, y_label: str) -> list[str]:
    """The svg element's opening, both axes, the y axis's ends and both axis labels."""
    y0, mid = f.y0, f.top_pad + f.plot_h / 2
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{f.width}" height="{_H}" role="img" aria-label="{e(title)}">',
            f'<line class="x-axis" x1="{_LEFT}" y1="{y0}" x2="{f.width - _RIGHT}" y2="{y0}" stroke="#444"/>',
            f'<line class="y-axis" x1="{_LEFT}" y1="{f.top_pad}" x2="{_LEFT}" y2="{y0}" stroke="#444"/>',
            f'<text x="{_LEFT - 4}" y="{f.top_pad + 4}" text-anchor="end">{e(_num(top))}</text>',
            f'<text x="{_LEFT - 4}" y="{y0}" text-anchor="end">0</text>',
            f'<text class="axis-label" x="{_LEFT + (f.width - _LEFT - _RIGHT) / 2:.1f}" y="{_H - 4}" '
            f'text-anchor="middle">{e(x_label)}</text>',
            f'<text class="axis-label" x="12" y="{mid:.1f}" text-anchor="middle" '
            f'transform="rotate(-90 12 {mid:.1f})">{e(y_label)}</text>']


def _bar(f: _Frame, b: Bar, cx: float, top: float) -> list[str]:
    """One bar at `cx`, its hover text, and its count above it."""
    bw = max(2.0, min(f.slot * 0.8, 40.0))
    bh = f.plot_h * b.value / top
    ty = f.y0 - bh - 3
    rect = (f'<rect class="bar" x="{cx - bw / 2:.1f}" y="{f.y0 - bh:.1f}" width="{bw:.1f}" height="{bh:.1f}" '
            f'fill="#3a6ea5"><title>{e(b.tip)}</title></rect>')
    if f.upright:
        return [rect, f'<text class="count" x="{cx:.1f}" y="{ty:.1f}" text-anchor="middle">{e(b.label)}</text>']
    return [rect, f'<text class="count" x="{cx + 4:.1f}" y="{ty:.1f}" transform="rotate(-90 {cx + 4:.1f} {ty:.1f})">'
                  f'{e(b.label)}</text>']


def _plot(title: str, bars: list[Bar], x_label: str, y_label: str, numeric_x: bool) -> str:
    """A bar chart as an SVG figure with labelled axes. `numeric_x`: bars sit at their x on a linear
    axis with ticks (gaps where no bar is); otherwise one slot per bar in order."""
    if not bars:
        return f'<figure class="plot"><figcaption>{e(title)}</figcaption><p>no data</p></figure>'
    top = max(b.value for b in bars) or 1.0
    f = _frame(bars, numeric_x)
    parts = _axes(f, title, top, x_label, y_label)
    for i, b in enumerate(bars):
        parts += _bar(f, b, f.at(b.x if numeric_x else i), top)
    for x, tick in _ticks(bars, numeric_x):
        parts.append(f'<text class="tick" x="{f.at(x):.1f}" y="{f.y0 + 14}" text-anchor="middle">{e(tick)}</text>')
    parts.append("</svg>")
    return f'<figure class="plot"><figcaption>{e(title)}</figcaption>{"".join(parts)}</figure>'


def _ticks(bars: list[Bar], numeric_x: bool) -> list[tuple[float, str]]:
    if not numeric_x:
        step = max(1, math.ceil(len(bars) / 20))
        return [(float(i), b.tick) for i, b in enumerate(bars) if i % step == 0]
    return _numeric_ticks(int(min(b.x for b in bars)), int(max(b.x for b in bars)))


def _numeric_ticks(lo: int, hi: int) -> list[tuple[float, str]]:
    """At most about ten ticks on [lo, hi], at multiples of a round step."""
    span = max(1, hi - lo)
    step = next(s for s in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10**9) if span / s <= 10)
    first = lo if lo % step == 0 else lo + step - lo % step
    ticks = [(float(x), str(x)) for x in range(first, hi + 1, step)]
    return ticks if ticks else [(float(lo), str(lo))]


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.3g}"


def rate_by_batch(report: Report, check: str) -> list[Bar]:
    """Per scheduled batch size: the percentage of its trials in which `check` found a divergence."""
    sizes = {t.trial_id: len(t.fillers) + 1 for t in report.schedule if t.origin == "schedule"}
    diverged = {d.trial_id for d in report.divergences if d.check == check and not d.shrunk}
    total: Counter[int] = Counter(sizes.values())
    bad: Counter[int] = Counter(sizes[t] for t in diverged if t in sizes)
    return [Bar(b, 100.0 * bad[b] / total[b], f"{bad[b]}/{total[b]}", str(b),
                f"batch {b}: {bad[b]} of {total[b]} trials diverged") for b in sorted(total)]


def step_histogram(divs: Sequence[DivergenceRecord]) -> list[Bar]:
    """Divergences per first-divergence step, every step between the first and the last shown (in
    bins of several steps when there are more than 40)."""
    steps: Counter[int] = Counter(d.step for d in divs)
    if not steps:
        return []
    lo, hi = min(steps), max(steps)
    width = max(1, math.ceil((hi - lo + 1) / 40))
    bars = []
    for start in range(lo, hi + 1, width):
        n = sum(steps[s] for s in range(start, start + width))
        name = str(start) if width == 1 else f"{start}-{start + width - 1}"
        bars.append(Bar(start, float(n), str(n), name, f"step {name}: {n} divergences"))
    return bars


def ulp_histogram(divs: Sequence[DivergenceRecord]) -> list[Bar]:
    """log2 buckets of the ULP distance from the smallest to the largest seen, empty ones included;
    bucket `0` holds divergences with equal logprobs (the logits or tokens differ)."""
    ulps = [d.ulp for d in divs if d.ulp is not None and d.kind != "token"]  # same-token logprobs only
    if not ulps:
        return []
    buckets: Counter[int] = Counter(-1 if u == 0 else int(math.log2(u)) for u in ulps)
    out = []
    for k in range(min(buckets), max(buckets) + 1):
        name = "0" if k < 0 else f"2^{k}"
        out.append(Bar(k, float(buckets[k]), str(buckets[k]), name, f"ULP bucket {name}: {buckets[k]}"))
    return out


def _check_plots(report: Report, check: str, divs: list[DivergenceRecord]) -> str:
    """One check's figures: the rate by batch size (trial divergences of a scheduled run), the step and ULP histograms."""
    figs = []
    if any(d.trial_id is not None for d in divs) and report.schedule:
        figs.append(_plot(f"{check}: divergence rate by batch size", rate_by_batch(report, check),
                          "batch size (requests in the trial)", "trials diverged (%)", numeric_x=True))
    figs.append(_plot(f"{check}: first-divergence step", step_histogram(divs), "generated step",
                      "divergences", numeric_x=False))
    figs.append(_plot(f"{check}: ULP distance of the first divergent logprob", ulp_histogram(divs),
                      "ULP distance (log2 bucket)", "divergences", numeric_x=False))
    return f'<section class="check-plots" id="plots-{e(check)}"><h3>{e(check)}</h3>{"".join(figs)}</section>'


def _plots(report: Report) -> str:
    checks = [c.name for c in report.checks]
    checks += sorted({d.check for d in report.divergences} - set(checks))
    figures = [_check_plots(report, check, divs) for check in checks
               if (divs := [d for d in report.divergences if d.check == check])]
    return "".join(figures) or "<p>no divergences to plot</p>"


def _verdict_cell(c: CheckResult) -> str:
    """Classed by the shown word (`warning` for a warning), plus `blocking` (red) where the check fails the run:
    a required vacuous check too, as the console shows it."""
    cls: str = "warning" if is_warning(c) else shown_verdict(c)
    if tone(c) == "blocking":
        cls += " blocking"
    return f'<td class="{e(cls)}">{e(verdict_label(c))}</td>'


def _env_cell(v: object, depth: int = 0) -> str:
    """An environment value as a reader wants it: a mapping (the engines per mode, the posture) as a nested
    table, a list of scalars comma-separated, a list of mappings one table each; never a Python repr."""
    if depth < 6 and isinstance(v, Mapping):
        rows = "".join(f"<tr><th>{e(k)}</th><td>{_env_cell(x, depth + 1)}</td></tr>" for k, x in v.items())
        return f'<table class="nested">{rows}</table>' if rows else ""
    if depth < 6 and isinstance(v, (list, tuple)):
        return _env_list(v, depth)
    return e("" if v is None else v)


def _env_list(v: Sequence[object], depth: int) -> str:
    if all(not isinstance(x, (Mapping, list, tuple)) for x in v):
        return e(", ".join(str(x) for x in v))
    return "".join(_env_cell(x, depth + 1) for x in v)


def _check_rows(report: Report) -> str:
    return "".join(
        f"<tr><td>{e(c.name)}</td><td>{e(c.requirement)}</td>{_verdict_cell(c)}"
        f"<td>{c.trials}</td><td>{c.divergent}</td><td>{e(c.message)}</td></tr>" for c in report.checks)


def _op_cells(d: DivergenceRecord) -> str:
    """The first diverging op's cells of a divergence row (empty where it names none)."""
    cells = localized_cells(d)
    op = f"{cells['module']} ({cells['op']})" if cells["op"] else cells["module"]
    if d.localized_op is not None and d.localized_op.status == "after_capture":
        op = AFTER_MODEL + op  # every op agreed: the one named is the last that did, not a culprit
    return f"<td>{e(op)}</td><td>{e(cells['layer'])}</td><td>{e(cells['forward_pass'])}</td>"


def _float_cell(x: float | None) -> str:
    return f"<td>{'' if x is None else f'{x:.3g}'}</td>"


def _divergence_row(d: DivergenceRecord, with_op: bool) -> str:
    return (f"<tr{_MINIMAL if d.shrunk else ''}><td>{e(d.check)}</td><td>{e(d.target)}</td>"
            f"<td>{'' if d.trial_id is None else e(d.trial_id)}{' (minimal, shrunk)' if d.shrunk else ''}</td>"
            f"<td>{d.step}</td><td>{e(d.kind)}</td><td>{e(d.expected_token)} → {e(d.actual_token)}</td>"
            f"<td>{e(ulp_text(d))}</td>{_float_cell(d.max_abs_logits_diff)}{_float_cell(d.reference_margin)}"
            f"<td>{e(d.evidence.get('num_seqs', ''))}</td>{_op_cells(d) if with_op else ''}</tr>")


def _after_divergences(report: Report, divs: Sequence[DivergenceRecord], report_path: str) -> str:
    """What follows the divergence table: how many it leaves out, and the replay commands."""
    more = f"<p>... and {len(divs) - 200} more in report.json</p>" if len(divs) > 200 else ""
    replays = "".join(f"<li>{e(check)}: <code>{e(command)}</code></li>" for check, command in
                      replay_lines(report, report_path))
    return more + (f'<h3>Replay</h3><ul class="replay">{replays}</ul>' if replays else "")


def _golden(report: Report) -> str:
    golden = "".join(f"<li>{e(x)}</li>" for c in report.checks if c.name == "golden" and c.verdict != "pass"
                     for x in golden_lines(c))
    return f"<h2>Golden: what differs</h2><ul>{golden}</ul>" if golden else ""


def _variance_map(report: Report) -> str:
    if report.variance_map is None:
        return ""
    from oracle.variance_map import MAP_HEAD, map_rows, map_title

    return (f"<h2>{e(map_title(report.variance_map))}</h2><table><tr>"
            + "".join(f"<th>{e(h)}</th>" for h in MAP_HEAD) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{e(x)}</td>" for x in row) + "</tr>"
                      for row in map_rows(report.variance_map)) + "</table>")


def _hazards(report: Report) -> str:
    """Each matched hazard's evidence class and what it rests on (`environment.posture.hazards`)."""
    hazards = report.posture.hazards if report.posture is not None else []
    if not hazards:
        return ""
    return ("<h2>Known hazards</h2><table><tr><th>hazard</th><th>evidence</th><th>why</th></tr>"
            + "".join(f"<tr><td>{e(h.id)}</td><td>{e(h.evidence)}</td><td>{e(h.why)}</td></tr>" for h in hazards)
            + "</table>")


def _coverage(report: Report) -> str:
    cov = report.coverage
    if not cov:
        return ""
    return ("<h2>Coverage</h2><table><tr><th>condition</th><th>trials</th></tr>"
            + "".join(f"<tr><td>{e(k)}</td><td>{e(v)}</td></tr>" for k, v in cov.items()) + "</table>")


def render_html(report: Report, report_path: str = "report.json") -> str:
    """`report_path`: where report.json is, for the replay commands."""
    divs = minimal_first(report.divergences)
    with_op = any(d.localized_op is not None for d in divs)
    loc_head = "<th>first diverging op</th><th>layer</th><th>pass</th>" if with_op else ""
    div_rows = "".join(_divergence_row(d, with_op) for d in divs[:200])
    environment = report.to_dict()["environment"]  # as written: the typed sections (posture, hazards) as JSON
    env_rows = "".join(f"<tr><td>{e(k)}</td><td>{_env_cell(v)}</td></tr>" for k, v in environment.items()
                       if k != "target_names")
    err = f'<p class="error">{error_label(report.exit_code())}: {e(report.error)}</p>' if report.error else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>oracle report</title><style>{_CSS}</style></head>
<body>
<h1>oracle report: {e(headline(report))}</h1>
<p>seed {e(report.seed)} · config {e(str(report.config_digest)[:12])} · {e(report.timings.get('total_s', 0))} s</p>{err}
<h2>Checks</h2>
<table><tr><th>check</th><th>requirement</th><th>verdict</th><th>trials</th><th>divergent</th><th>detail</th></tr>
{_check_rows(report)}</table>
{_golden(report)}{_hazards(report)}{_variance_map(report)}{_coverage(report)}
<h2>Plots</h2>
{_plots(report)}
<h2>Divergences ({len(divs)})</h2>
<table><tr><th>check</th><th>target</th><th>trial</th><th>step</th><th>kind</th><th>token</th><th>ULP</th>
<th>max abs Δlogit</th><th>margin</th><th>seqs</th>{loc_head}</tr>{div_rows}</table>{_after_divergences(report, divs, report_path)}
<h2>Environment</h2><table>{env_rows}</table>
</body></html>
"""
