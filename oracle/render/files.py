"""The report's files: report.json and, beside it, JUnit XML, Markdown and HTML.

Every file is written to a temporary name and renamed over the old one, so a reader sees either
the previous file or the new one, never half of one. A report that is not complete says so in
every format: report.json has `complete: false`, the others say "partial report". A run starts by
replacing all four with a "started" report (`complete: false`), so a folder never shows a previous
run's report as if it were this run's, even when the process is killed outright.
"""

from __future__ import annotations

import html
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from oracle.errors import ConfigError
from oracle.render.escape import markdown_text, terminal_text, xml_text
from oracle.render.html import render_html
from oracle.render.junit import render_junit
from oracle.render.markdown import render_markdown
from oracle.report import Report, write_atomic

FILES = {"json": "report.json", "junit": "junit.xml", "markdown": "summary.md", "html": "report.html"}
STARTED = "the run started but did not finish writing its report (it was killed or is still running)"


def report_dir_problem(path: Path) -> str | None:
    """Why the report folder cannot be made or written, or None (it then exists)."""
    if path.exists() and not path.is_dir():
        return f"the report folder {path} is a file, not a folder"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"cannot create the report folder {path} ({e.strerror or e})"
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".oracle-write-test-"):
            pass
    except OSError as e:
        return f"cannot write in the report folder {path} ({e.strerror or e})"
    return None


def check_report_dir(path: Path, blame: str = "report_dir") -> None:
    """ConfigError (exit 2) `blame: problem` when the report folder cannot be made or written."""
    problem = report_dir_problem(path)
    if problem is not None:
        raise ConfigError(f"{blame}: {problem}")


def _partial_line(report: Report) -> str:
    return f"partial report: the run did not complete ({report.error or 'no reason recorded'})"


def _mark_markdown(text: str, report: Report) -> str:
    head, _, rest = text.partition("\n")
    return f"{head}\n\n**{markdown_text(_partial_line(report))}**\n{rest}"


def _mark_html(text: str, report: Report) -> str:
    banner = f'<p class="partial"><strong>{html.escape(terminal_text(_partial_line(report)))}</strong></p>'
    at = text.find("</h1>")
    if at < 0:
        at = text.find("<body>")
        end = at + len("<body>") if at >= 0 else 0
    else:
        end = at + len("</h1>")
    return text[:end] + "\n" + banner + text[end:]


def _mark_junit(text: str, report: Report) -> str:
    """An errored `oracle.run/complete` test case, so CI lists the run as not finished."""
    root = ET.fromstring(text.encode("utf-8"))
    suite = ET.SubElement(root, "testsuite", name="oracle.run", tests="1", failures="0", errors="1", skipped="0")
    case = ET.SubElement(suite, "testcase", classname="oracle.run", name="complete")
    line = xml_text(_partial_line(report))  # an engine's error text may hold any byte
    ET.SubElement(case, "error", message=line).text = line
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def render_formats(report: Report, report_path: str = "report.json") -> dict[str, str]:
    """The text of junit.xml, summary.md and report.html, marked partial when the report is; of the
    report's public copy (secrets redacted, see `Report.public`). `report_path`: for replay commands."""
    report = report.public()
    texts = {"junit": render_junit(report, report_path), "markdown": render_markdown(report, report_path=report_path),
             "html": render_html(report, report_path)}
    if report.partial:
        texts = {"junit": _mark_junit(texts["junit"], report), "markdown": _mark_markdown(texts["markdown"], report),
                 "html": _mark_html(texts["html"], report)}
    return texts


def write_formats(report: Report, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for key, text in render_formats(report, str(out_dir / FILES["json"])).items():
        paths[key] = out_dir / FILES[key]
        write_atomic(paths[key], text)
    return paths


def write_report(report: Report, out_dir: Path, *, final: bool = True) -> Path:
    """report.json and every other format (see `Report.write`); a run's own writes go through its
    `ReportWriter`."""
    return report.write(out_dir, [write_formats], final=final)


def write_started(report: Report, out_dir: Path) -> Path:
    """Replace whatever report the folder holds with this run's "started" one (`complete: false`)."""
    return ReportWriter(out_dir).started(report)


def report_is(out_dir: Path, stamp: tuple[int, int] | None) -> bool:
    """True when report.json is still the file with `stamp` (see `stamp_of`): nothing rewrote it."""
    return stamp is not None and stamp_of(out_dir) == stamp


def stamp_of(out_dir: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(out_dir / FILES["json"])
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


View = Callable[[Report, Path], Any]


class ReportWriter:
    """The one owner of a run's report folder: report.json and the formats beside it, for every state the
    run can be in (started, stopped with an error or a signal, complete or partial, merged), each state
    written once, each file atomically (`Report.write`).

    Shared by the parent of `oracle run` and its child (the parent writes "started"; the child adopts
    that file rather than writing it again), the runner, `oracle merge`, the supervisor and the pytest
    plugin. It writes only `out_dir`, the run's own folder. `stopped` writes only while no final report
    was written: none by this writer, and the folder still holds the report it last wrote or adopted
    (the child's final report, written by another process, stands too)."""

    def __init__(self, out_dir: Path, views: Sequence[View] = (write_formats,)) -> None:
        self.out_dir = out_dir
        self.views = tuple(views)
        self.stamp: tuple[int, int] | None = None  # report.json as this writer last left it
        self.done = False  # the run's final report (complete, partial or merged) is written

    @property
    def path(self) -> Path:
        return self.out_dir / FILES["json"]

    def started(self, report: Report) -> Path:
        """Replace whatever report the folder holds with this run's "started" one (`complete: false`), so a
        run killed outright never leaves an earlier run's pass."""
        if report.error is None:
            report.set_error(STARTED)
        path = report.write(self.out_dir, self.views, final=False)
        self.stamp = stamp_of(self.out_dir)
        return path

    def adopt(self, report: Report) -> None:
        """The run's child: the parent wrote the started report already; take it as this writer's own
        (written here only when it is missing)."""
        self.stamp = stamp_of(self.out_dir)
        if self.stamp is None:
            self.started(report)

    def untouched(self) -> bool:
        """report.json is still the file this writer last wrote or adopted: no final report replaced it."""
        return report_is(self.out_dir, self.stamp)

    def stopped(self, report: Report, e: BaseException) -> bool:
        """The run ended with `e` before it wrote its own report: `report` says so (the exit code the
        process ends with). False, and nothing written, when a final report is already there (before this
        writer wrote anything, e.g. a signal during the started report, it writes)."""
        if self.done or (self.stamp is not None and not self.untouched()):
            return False
        report.mark_stopped(e)
        self.final(report)
        return True

    def ended(self, report: Report, message: str, exit_code: int) -> Path:
        """The supervisor: the run's process ended without its report; `report` (the started one) says how."""
        report.set_error(message, exit_code)
        return self.final(report)

    def final(self, report: Report, views: Sequence[View] | None = None) -> Path:
        """The run is over (done, partial, merged): the formats, then report.json, signals held meanwhile."""
        path = report.write(self.out_dir, self.views if views is None else views)
        self.stamp = stamp_of(self.out_dir)
        self.done = True
        return path
