"""The one rich Console of the CLI: progress while running, a summary table after.

Markup and highlighting are off and user strings lose their control bytes (model text must never
be read as markup or terminal escapes). Under CI (the `CI` variable set) or when stdout is not a
terminal there are no live bars, only plain lines, with a heartbeat line every N engine runs or
seconds so a CI log shows that a long phase is moving. Tables fit 80 columns: at that width the
detail column moves below the table, and cut rows are counted ("N more").
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn
from rich.table import Table

from oracle.observer import Observer
from oracle.posture import coverage_line, hazard_summary_lines, summary_line
from oracle.posture.evidence import evidence_line
from oracle.render.escape import terminal_text
from oracle.render.findings import golden_lines, localized_line, replay_lines, ulp_text
from oracle.render.timings import timing_line
from oracle.render.verdict import Tone, error_label, headline, minimal_first, shown_verdict, tone
from oracle.report import CheckResult, DivergenceRecord, Report
from oracle.report_sections import MergedShards, ShardSlice

if TYPE_CHECKING:
    from oracle.models.presets import ModelPreset

NARROW = 100  # below this many columns the checks table leaves its detail column out
HEARTBEAT_S = 30.0


def make_console(stderr: bool = False) -> Console:
    ci = bool(os.environ.get("CI"))
    stream = sys.stderr if stderr else sys.stdout
    # A log (CI, a pipe) has no width of its own: 140 columns keep the tables from wrapping.
    width = None if stream.isatty() and not ci else 140
    return Console(markup=False, highlight=False, emoji=False, stderr=stderr, width=width,
                   no_color=ci or bool(os.environ.get("NO_COLOR")), force_interactive=False if ci else None)


class ConsoleObserver(Observer):
    """Shows the seed and a progress bar per mode (trials done of total, divergences so far).

    Without a live terminal (CI, a pipe) it prints a heartbeat line every `heartbeat_every` engine
    runs (default: a tenth of the phase) or every `heartbeat_s` seconds, whichever comes first.
    """

    def __init__(self, console: Console, heartbeat_every: int | None = None,
                 heartbeat_s: float | None = HEARTBEAT_S) -> None:
        self.console = console
        self.live = console.is_terminal and not os.environ.get("CI")
        self.progress: Progress | None = None
        self.task = TaskID(0)
        self.name = ""
        self.total = 0
        self.count = 0
        self.divergences = 0
        self.heartbeat_every = heartbeat_every
        self.heartbeat_s = heartbeat_s
        self._every = 1
        self._last = 0.0
        self._outer: list[tuple[str, int, int, int, TaskID]] = []  # phases a running phase interrupted
        self._outcome: str | None = None  # what the running phase came to, said by `done` (localize)

    def seed(self, seed: int) -> None:
        self.console.print(f"schedule seed: {seed} (replay this schedule with --seed {seed})")

    def warn(self, message: str) -> None:
        self.console.print(terminal_text(message), style="yellow")

    def phase(self, name: str, total: int) -> None:
        if self.name:  # a phase inside the one running (the search inside a mode): that one resumes after it
            self._outer.append((self.name, self.total, self.count, self.divergences, self.task))
        self.name, self.total, self.count, self.divergences = name, total, 0, 0
        self._every = self.heartbeat_every or max(1, total // 10)
        self._last = time.monotonic()
        if self.live and self.progress is not None:  # one live display at a time: a second bar in it
            self.task = self.progress.add_task(f"{name:>10}", total=total, div=0)
        elif self.live:
            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("divergent: {task.fields[div]}"), TimeRemainingColumn(),
                                     console=self.console, transient=False)
            self.progress.start()
            self.task = self.progress.add_task(f"{name:>10}", total=total, div=0)
        else:
            self.console.print(f"{name}: {total} engine runs")

    def advance(self, divergences: int) -> None:
        self.count += 1
        self.divergences = divergences
        if self.progress is not None:
            self.progress.update(self.task, advance=1, div=divergences)
            return
        now = time.monotonic()
        due = self.count % self._every == 0 or (self.heartbeat_s is not None and now - self._last >= self.heartbeat_s)
        if due and self.count < self.total:
            self._last = now
            self.console.print(f"{self.name}: {self.count}/{self.total} engine runs, {divergences} divergent")

    def outcome(self, message: str) -> None:
        self._outcome = message

    def done(self) -> None:
        if self.progress is not None:
            if not self._outer:
                self.progress.stop()
                self.progress = None
            if self._outcome is not None:
                self.console.print(f"{self.name}: {terminal_text(self._outcome)}", soft_wrap=True)
        elif self._outcome is not None:
            self.console.print(f"{self.name}: {terminal_text(self._outcome)}", soft_wrap=True)
        else:
            self.console.print(f"{self.name}: done {self.count}/{self.total}")
        self._outcome = None
        if self._outer:  # back to the phase this one ran inside, its own count and total
            self.name, self.total, self.count, self.divergences, self.task = self._outer.pop()
            self._every = self.heartbeat_every or max(1, self.total // 10)
        else:
            self.name = ""


_STYLE: dict[Tone, str] = {"blocking": "red", "notice": "yellow", "pass": "green", "skipped": "dim"}
def style(c: CheckResult) -> str:
    """A check's row style: red only where it blocks, yellow for warnings and report-only findings."""
    return _STYLE[tone(c)]


def print_summary(console: Console, report: Report, report_path: str, max_rows: int = 5) -> None:
    """The checks table, what a failing golden check found, the divergence tables and the run's footer."""
    report = report.public()  # secrets redacted, as in the files
    narrow = console.width < NARROW
    _checks_table(console, report, narrow)
    for c in report.checks:
        if c.name == "golden" and c.verdict != "pass":
            for line in golden_lines(c):
                console.print(terminal_text(line), style=style(c))
    from oracle.judge import sections  # the divergence tables: each check's row names its section

    for title, checks in sections():
        rows = minimal_first(d for d in report.divergences if d.check in checks)
        if rows:
            _divergence_table(console, title, rows, max_rows, narrow, replay_of(report, report_path))
            _replay_lines(console, report, report_path, checks, rows)
    if report.variance_map is not None:
        _variance_map_table(console, report)
    _footer(console, report, report_path)


def _variance_map_table(console: Console, report: Report) -> None:
    from oracle.variance_map import MAP_HEAD, map_rows, map_title

    assert report.variance_map is not None
    t = Table(title=map_title(report.variance_map), title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in MAP_HEAD:
        t.add_column(col, overflow="fold")
    for row in map_rows(report.variance_map):
        t.add_row(*(terminal_text(x) for x in row))
    console.print(t)


def _checks_table(console: Console, report: Report, narrow: bool) -> None:
    """One row per check; below NARROW columns each check's detail goes under the table."""
    table = Table(title=f"oracle checks: {headline(report)}", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False)
    for col in ("check", "requirement", "verdict", "trials", "divergent"):
        table.add_column(col, no_wrap=True, justify="right" if col in ("trials", "divergent") else "left")
    if not narrow:
        table.add_column("detail", ratio=1)
    for c in report.checks:
        cells = [c.name, c.requirement, shown_verdict(c), str(c.trials), str(c.divergent)]
        table.add_row(*cells, *([] if narrow else [terminal_text(c.message)]), style=style(c))
    console.print(table)
    if narrow:
        for c in report.checks:
            console.print(f"  {c.name}: {terminal_text(c.message)}", style=style(c))


_EVIDENCE_STYLE = {"verified": "green", "failed": "red", "not verified": "yellow"}


def _footer(console: Console, report: Report, report_path: str) -> None:
    """The engine error, the run's posture and hazards, where the report is, the time and the exit code."""
    if report.error:
        console.print(f"{error_label(report.exit_code())}: {terminal_text(report.error)}", style="red")
    posture = summary_line(report.posture)
    if posture:
        console.print(terminal_text(posture))
    covered = coverage_line(report.posture)
    if covered:
        console.print(terminal_text(covered))
    for line in hazard_summary_lines(report.hazards):
        console.print(terminal_text(line), style="yellow")
    for h in report.posture.hazards if report.posture is not None else ():
        console.print(terminal_text(evidence_line(h)), style=_EVIDENCE_STYLE[h.evidence])
    console.print(f"report: {terminal_text(report_path)}   time: {time_text(report)}   exit {report.exit_code()}")
    beside = other_files(Path(report_path).parent)
    if beside:
        console.print(f"also in {terminal_text(str(Path(report_path).parent))}: {', '.join(beside)}", soft_wrap=True)
    spent = timing_line(report.timings)
    if spent:
        console.print(terminal_text(spent), style="dim")
    command = merge_command(report, report_path)
    if command:
        console.print(f"next: {terminal_text(command)}", soft_wrap=True)


def time_text(report: Report) -> str:
    """`1.2s (invariant 0.8s, production 0.4s)`; for a merge, its own time and the shards' mode times apart (they
    ran on other machines, summed, so they may exceed it)."""
    tm = report.timings
    modes = f"invariant {tm.get('invariant_s', 0):.1f}s, production {tm.get('production_s', 0):.1f}s"
    if isinstance(report.shard, MergedShards):
        return f"{tm.get('total_s', 0):.1f}s to merge (the {report.shard.count} shards ran {modes}, summed)"
    return f"{tm.get('total_s', 0):.1f}s ({modes})"


def other_files(folder: Path) -> list[str]:
    """The report folder's files beside report.json that this run wrote (summary.md, junit.xml, ...)."""
    from oracle.render.files import FILES

    names = [name for name in FILES.values() if name != "report.json" and (folder / name).is_file()]
    return names + [f"{name}/" for name in ("repro",) if (folder / name).is_dir()]


def merge_command(report: Report, report_path: str) -> str | None:
    """For a shard that ran whole: the `oracle merge` that joins it with the others (their folders named after
    this one's where its name holds its index, e.g. shard-0 -> shard-1, ...)."""
    shard = report.shard
    if not isinstance(shard, ShardSlice) or not report.complete or report.error is not None:
        return None
    folder = Path(report_path).parent
    index, count = str(shard.index), shard.count
    if folder.name.count(index) == 1:
        head, _, tail = folder.name.partition(index)
        folders = " ".join(shlex.quote(str(folder.with_name(f"{head}{i}{tail}"))) for i in range(count))
    else:
        folders = shlex.quote(str(folder)) + (f" <the other {count - 1} shards' folders>" if count > 1 else "")
    return f"once all {count} shards ran: oracle merge {folders} --report-dir oracle-report"


def replay_of(report: Report, report_path: str) -> Callable[[int], str]:
    """trial id -> the replay command for this report's real path, quoted for a shell (with --trust-report
    where its config loads code)."""
    from oracle.trust import replay_command

    return lambda trial_id: replay_command(shlex.quote(report_path), trial_id, report.config)


def _replay_lines(console: Console, report: Report, report_path: str, checks: Sequence[str],
                  rows: list[DivergenceRecord]) -> None:
    """Each check's replay command (as every view gives it), where the shrunk trial's line did not already."""
    shrunk = {d.check for d in rows if d.shrunk and d.trial_id is not None}
    for check, command in replay_lines(report, report_path, checks):
        if check not in shrunk:
            # soft_wrap: never folded at the console's width, so the command pastes whole from a CI log
            console.print(f"{check}: replay: {terminal_text(command)}", soft_wrap=True)


def _caption(rows: list[DivergenceRecord], shown: list[DivergenceRecord]) -> str | None:
    notes = []
    if any(d.shrunk for d in shown):
        notes.append("* the shrunk minimal trial")
    if len(rows) > len(shown):
        notes.append(f"... and {len(rows) - len(shown)} more in report.json")
    return "; ".join(notes) or None


def _divergence_cells(d: DivergenceRecord, narrow: bool) -> list[str]:
    trial = "" if d.trial_id is None else str(d.trial_id)
    cells = [terminal_text(d.target), trial + ("*" if d.shrunk else ""), str(d.step), d.kind,
             f"{d.expected_token}->{d.actual_token}", ulp_text(d), _fmt(d.max_abs_logits_diff)]
    if not narrow:
        cells += [_fmt(d.reference_margin), terminal_text(d.evidence.get("num_seqs", ""))]
    return cells


def _shrunk_line(d: DivergenceRecord, replay: Callable[[int], str]) -> str | None:
    """The shrunk trial's size, batch, position and replay command; None for a divergence that is not one."""
    if not d.shrunk or d.trial_id is None:
        return None
    size = "minimal" if d.evidence.get("minimal") else "smallest found"
    batch = len(d.trial.fillers) + 1 if d.trial else "?"
    position = d.trial.position if d.trial else "?"
    return (f"{size} failing trial (shrunk): trial {d.trial_id}, batch {batch}, target "
            f"{terminal_text(d.target)} at position {position}; replay: {terminal_text(replay(d.trial_id))}")


def _divergence_table(console: Console, title: str, rows: list[DivergenceRecord], max_rows: int, narrow: bool,
                      replay: Callable[[int], str]) -> None:
    shown = rows[:max_rows]
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
              caption=_caption(rows, shown), caption_justify="left")
    t.add_column("target", min_width=8, max_width=24 if narrow else 48, overflow="ellipsis", no_wrap=True)
    cols = ["trial", "step", "kind", "tokens", "ulp", "|dlogit|"] + ([] if narrow else ["margin", "seqs"])
    for col in cols:
        t.add_column(col, no_wrap=True, justify="right" if col not in ("kind", "tokens") else "left")
    for d in shown:
        t.add_row(*_divergence_cells(d, narrow), style="bold" if d.shrunk else None)
    console.print(t)
    for d in shown:
        shrunk = _shrunk_line(d, replay)
        if shrunk:
            console.print(shrunk, style="bold", soft_wrap=True)
        where = localized_line(d)
        if where:
            console.print(f"  trial {d.trial_id} {terminal_text(d.target)}: {terminal_text(where)}")


def print_presets(console: Console, presets: Mapping[str, ModelPreset]) -> None:
    """The model presets as a table: shape, size on disk and what each is for."""
    table = Table(title="model presets (oracle model make PRESET DIR, or model: preset:NAME)", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("preset", "arch", "layers", "hidden", "heads", "params", "size", "dtype", "use"):
        table.add_column(col, no_wrap=col != "use", ratio=1 if col == "use" else None,
                         justify="right" if col in ("layers", "hidden", "heads", "params", "size") else "left")
    for name, p in presets.items():
        table.add_row(name, p.architecture, str(p.num_hidden_layers), str(p.hidden_size),
                      f"{p.num_attention_heads}/{p.num_key_value_heads}", _si(p.num_parameters), _bytes(p.num_bytes),
                      p.torch_dtype, p.description)
    console.print(table)


def _si(n: int) -> str:
    for unit, scale in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def _bytes(n: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def _fmt(x: float | int | None) -> str:
    if x is None:
        return ""
    return str(x) if isinstance(x, int) else f"{x:.3g}"
