"""The one rich Console of the CLI: progress while running, a summary table after.

Markup and highlighting are off (model text must never be read as markup); under CI (the
`CI` variable set) or when stdout is not a terminal there are no live bars, only plain lines.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from oracle.observer import Observer
from oracle.report import Report

_STYLE = {"pass": "green", "fail": "red", "vacuous": "yellow", "error": "red", "skipped": "dim"}


def make_console(stderr: bool = False) -> Console:
    ci = bool(os.environ.get("CI"))
    stream = sys.stderr if stderr else sys.stdout
    # A log (CI, a pipe) has no width of its own: 140 columns keep the tables from wrapping.
    width = None if stream.isatty() and not ci else 140
    return Console(markup=False, highlight=False, emoji=False, stderr=stderr, width=width,
                   no_color=ci or bool(os.environ.get("NO_COLOR")), force_interactive=False if ci else None)


class ConsoleObserver(Observer):
    """Shows the seed and a progress bar per mode (trials done of total, divergences so far)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live = console.is_terminal and not os.environ.get("CI")
        self.progress: Progress | None = None
        self.task: Any = None
        self.name = ""
        self.total = 0
        self.count = 0

    def seed(self, seed: int) -> None:
        self.console.print(f"schedule seed: {seed} (replay this schedule with --seed {seed})")

    def phase(self, name: str, total: int) -> None:
        self.name, self.total, self.count = name, total, 0
        if self.live:
            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("divergent: {task.fields[div]}"), TimeRemainingColumn(),
                                     console=self.console, transient=False)
            self.progress.start()
            self.task = self.progress.add_task(f"{name:>10}", total=total, div=0)
        else:
            self.console.print(f"{name}: {total} engine runs")

    def advance(self, divergences: int) -> None:
        self.count += 1
        if self.progress is not None:
            self.progress.update(self.task, advance=1, div=divergences)

    def done(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
        else:
            self.console.print(f"{self.name}: done {self.count}/{self.total}")


def print_summary(console: Console, report: Report, report_path: str) -> None:
    table = Table(title="oracle checks", title_justify="left")
    for col in ("check", "requirement", "verdict", "trials", "divergent", "detail"):
        table.add_column(col)
    for c in report.checks:
        table.add_row(c.name, c.requirement, c.verdict, str(c.trials), str(c.divergent), c.message,
                      style=_STYLE.get(c.verdict))
    console.print(table)
    shown = [d for d in report.divergences if d.check in ("invariance", "repeatability")][:5]
    drift = [d for d in report.divergences if d.check == "drift"][:5]
    for title, rows in (("invariant-mode divergences", shown), ("production-mode divergences (drift)", drift)):
        if not rows:
            continue
        t = Table(title=title, title_justify="left")
        for col in ("target", "trial", "step", "kind", "token exp/act", "ulp", "max |dlogit|", "margin", "seqs"):
            t.add_column(col)
        for d in rows:
            t.add_row(d.target, str(d.trial_id), str(d.step), d.kind, f"{d.expected_token}/{d.actual_token}",
                      str(d.ulp), _fmt(d.max_abs_logits_diff), _fmt(d.reference_margin),
                      str(d.evidence.get("num_seqs", "")))
        console.print(t)
    if report.error:
        console.print(f"engine error: {report.error}", style="red")
    tm = report.timings
    console.print(f"report: {report_path}   time: {tm.get('total_s', 0):.1f}s "
                  f"(invariant {tm.get('invariant_s', 0):.1f}s, production {tm.get('production_s', 0):.1f}s)"
                  f"   exit {report.exit_code()}")


def _fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.3g}"


def error_line(message: str) -> None:
    print(f"oracle: error: {message}", file=sys.stderr)
