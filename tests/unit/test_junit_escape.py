"""Every view stays well-formed whatever bytes an engine's error, a target name or a message holds
(issue 17, class 8): junit.xml parses, and no format carries a control byte, a terminal escape or a
lone surrogate."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
import yaml

from oracle.cli import main
from oracle.render.files import render_formats, write_formats
from oracle.render.github import main as action_main
from oracle.report import CheckResult, Report

NASTY = "boom\x00\x01\x08\x0b\x0c\x1b[31mred\x1b[0m\x7f\x85\x9b\u202e\ud800 <tag> & \"q\" | `code` ]]> \r\n2nd line"
# What none of junit.xml, summary.md or report.html may hold: C0/C1 controls (tab and newline aside),
# bidirectional overrides, lone surrogates.
FORBIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def partial_report(error: str) -> Report:
    report = Report(oracle_version="0", seed=1, config={"model": "m"}, config_digest="0" * 64,
                    checks=[CheckResult(name="invariance", requirement="required", verdict="error",
                                        message=f"engine failed: {error}")])
    report.environment["target_names"] = [f"target {error}"]
    report.set_error(f"engine raised RuntimeError: {error}")
    return report


def check_views(texts: dict[str, str]) -> None:
    root = ET.fromstring(texts["junit"].encode("utf-8"))  # raises on malformed XML
    assert root.tag == "testsuites"
    assert any(case.get("name") == "complete" for case in root.iter("testcase"))  # the partial-report marker
    HTMLParser().feed(texts["html"])
    for name, text in texts.items():
        # CR LF aside (the writer's own line ends are LF): nothing a parser, a terminal or a browser misreads.
        assert not FORBIDDEN.search(text.replace("\r", "")), (name, FORBIDDEN.search(text.replace("\r", "")))
        assert "\x1b" not in text


def test_partial_report_with_control_bytes_renders_well_formed() -> None:
    check_views(render_formats(partial_report(NASTY)))


@pytest.mark.parametrize("char", [chr(c) for c in (*range(0, 9), 11, 12, *range(14, 32), 0x7f, 0xfffe, 0xffff,
                                                     0xd800, 0xdfff)],
                         ids=lambda c: f"U+{ord(c):04X}")
def test_each_forbidden_character_in_the_partial_marker(char: str) -> None:
    texts = render_formats(partial_report(f"a{char}b"))
    ET.fromstring(texts["junit"].encode("utf-8"))
    assert char not in texts["junit"] and char not in texts["markdown"] and char not in texts["html"]


def test_written_files_are_utf8_and_parse(tmp_path: Path) -> None:
    paths = write_formats(partial_report(NASTY), tmp_path)
    texts = {key: path.read_bytes().decode("utf-8") for key, path in paths.items()}
    check_views(texts)


ENGINE = '''
from fake_engine import FakeEngine


class NastyEngine(FakeEngine):
    def generate(self, requests, max_num_batched_tokens=None):
        raise RuntimeError(%r)
'''


def test_engine_error_with_control_bytes_end_to_end(tmp_path: Path, fake_model: Path,
                                                    capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "nasty_engine.py").write_text(ENGINE % NASTY)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"model": str(fake_model), "engine": {"kind": "nasty_engine:NastyEngine"},
                                      "prompts": {"random": {"count": 2}}, "schedule": {"trials": 2}}))
    assert main(["run", str(config), "--report-dir", str(tmp_path / "r")]) == 3
    out = capsys.readouterr()
    assert "\x1b" not in out.out + out.err  # the console and the error line too
    texts = {key: (tmp_path / "r" / name).read_text(encoding="utf-8")
             for key, name in (("junit", "junit.xml"), ("markdown", "summary.md"), ("html", "report.html"))}
    check_views(texts)
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["exit_code"] == 3 and "\x1b" in report["error"]  # report.json keeps the text, JSON-escaped

    monkeypatch.setenv("GITHUB_OUTPUT", str(tmp_path / "outputs"))
    assert action_main(["annotate", str(tmp_path / "r")]) == 0
    annotations = capsys.readouterr().out
    assert "\x1b" not in annotations and "\x00" not in annotations
    assert "::error title=oracle engine::engine error: " in annotations
