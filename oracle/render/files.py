"""The report's other formats, written beside report.json: JUnit XML, Markdown, HTML."""

from __future__ import annotations

import os
from pathlib import Path

from oracle.render.html import render_html
from oracle.render.junit import render_junit
from oracle.render.markdown import render_markdown
from oracle.report import Report


def write_formats(report: Report, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "junit": (out_dir / "junit.xml", render_junit(report)),
        "markdown": (out_dir / "summary.md", render_markdown(report)),
        "html": (out_dir / "report.html", render_html(report)),
    }
    for path, text in files.values():
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return {k: p for k, (p, _) in files.items()}
