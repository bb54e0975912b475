"""Every view that reports a failure (console, summary.md, report.html, junit.xml, the GitHub annotation
and so the job summary) gives the same replay command: the real report.json (no placeholder), quoted for a
shell (the folder has a space), with --trust-report where the config loads code (a custom engine here);
and the command, pasted, replays the divergence."""

from __future__ import annotations

import html
import io
import re
import shlex
from pathlib import Path

import pytest
from conftest import write_fake_checkpoint
from rich.console import Console

from oracle.cli import main
from oracle.config import parse_config
from oracle.render.console import print_summary
from oracle.render.files import write_formats
from oracle.report import Report
from oracle.runner import run


@pytest.fixture(scope="module")
def failing(tmp_path_factory: pytest.TempPathFactory) -> tuple[Report, Path]:
    tmp = tmp_path_factory.mktemp("replay-lines")
    out = tmp / "my reports" / "run1"
    cfg = {
        "model": str(write_fake_checkpoint(tmp / "m")),
        "engine": {"kind": "fake_engine:FakeEngine", "options": {"diverge_from_batch": 4}},
        "prompts": {"random": {"count": 3, "min_len": 2, "max_len": 5}},
        "sampling": {"max_tokens": 4},
        "schedule": {"trials": 12, "seed": 3, "batch_size": [1, 9], "repeat_trials": 1, "max_shrink_runs": 10},
        "checks": {"prefill_decode": "off", "prefix_cache": "off"},
    }
    report = run(parse_config(cfg), report_dir=out, views=[write_formats])
    assert report.exit_code() == 1
    return report, out


def test_summary_md_names_the_real_report(failing: tuple[Report, Path]) -> None:
    _, out = failing
    md = (out / "summary.md").read_text()
    assert "REPORT_DIR" not in md and "REPORT.json" not in md
    assert f"oracle replay {shlex.quote(str(out / 'report.json'))} --trial " in md
    assert "--trust-report" in md  # the config names a custom engine


def test_console_names_the_real_report(failing: tuple[Report, Path]) -> None:
    report, out = failing
    buf = io.StringIO()
    console = Console(file=buf, width=400, markup=False, highlight=False, color_system=None)
    print_summary(console, report, str(out / "report.json"))
    text = buf.getvalue()
    assert "REPORT.json" not in text
    assert f"replay: oracle replay {shlex.quote(str(out / 'report.json'))} --trial " in text
    assert "--trust-report" in text


def _commands(failing: tuple[Report, Path]) -> dict[str, set[str]]:
    """The replay commands each view gives, by view."""
    from oracle.render.github import workflow_commands

    report, out = failing
    buf = io.StringIO()
    print_summary(Console(file=buf, width=400, markup=False, highlight=False, color_system=None), report,
                  str(out / "report.json"))
    found = {
        "console": re.findall(r"replay: (oracle replay .*)", buf.getvalue()),
        "summary.md": re.findall(r"Replay: `(.*?)`", (out / "summary.md").read_text()),
        "report.html": [html.unescape(c) for c in re.findall(r"<code>(oracle replay .*?)</code>",
                                                             (out / "report.html").read_text())],
        "junit.xml": [html.unescape(c) for c in re.findall(r"replay: (oracle replay [^<\n]*)", (out / "junit.xml").read_text())],
        "annotation": [c.replace("%0A", "\n").split("\n")[0] for line in
                       workflow_commands(report, out / "report.json", report.exit_code())
                       for c in re.findall(r"replay: (oracle replay .*)", line)],
    }
    return {view: {c.strip() for c in commands} for view, commands in found.items()}


def test_every_failure_view_gives_the_same_replay_command(failing: tuple[Report, Path]) -> None:
    commands = _commands(failing)
    assert all(commands.values()), commands  # no view without one
    invariance = {view: {c for c in cs if "--trial" in c} for view, cs in commands.items()}
    first = next(iter(invariance["summary.md"]))
    for view, cs in invariance.items():
        assert first in cs, (view, cs)
    assert "--trust-report" in first and shlex.quote(str(failing[1] / "report.json")) in first


def test_the_replay_command_pasted_replays_the_divergence(failing: tuple[Report, Path],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    (command,) = {c for c in _commands(failing)["annotation"]}
    argv = shlex.split(command)
    assert argv[0] == "oracle"
    assert main(argv[1:]) == 1  # the divergence again (0 would be a pass; 2 a refused or broken command)
    assert "divergence at step" in capsys.readouterr().out


@pytest.mark.parametrize("width", [80, 140, 200])
def test_the_consoles_replay_commands_are_whole_on_one_line_at_any_width(failing: tuple[Report, Path],
                                                                        width: int) -> None:
    """A CI log is 140 columns wide: a command folded there pastes without its last words (`--trust-report`)."""
    report, out = failing
    buf = io.StringIO()
    console = Console(file=buf, width=width, markup=False, highlight=False, color_system=None)
    print_summary(console, report, str(out / "report.json"))
    lines = [line for line in buf.getvalue().splitlines() if "oracle replay" in line]
    assert lines, buf.getvalue()
    for line in lines:
        command = line[line.index("oracle replay"):].strip()
        assert re.fullmatch(r"oracle replay .+/report\.json'? --trial \d+ --trust-report", command), line
    assert max(len(line) for line in lines) > width or width == 200  # long enough that folding would have cut it


def test_the_console_names_the_report_folders_other_files(failing: tuple[Report, Path]) -> None:
    report, out = failing
    buf = io.StringIO()
    print_summary(Console(file=buf, width=140, markup=False, highlight=False, color_system=None), report,
                  str(out / "report.json"))
    also = next(line for line in buf.getvalue().splitlines() if line.startswith("also in "))
    for name in ("summary.md", "junit.xml", "report.html"):
        assert name in also, also
