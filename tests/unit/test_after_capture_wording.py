"""An `after_capture` localization (every captured op agreed, the outputs still differ) reads as what it is in
every view: the difference came after the model, and lm_head is the last op that agreed, never the culprit."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from hand_report import LOCALIZED, divergence, hand_report
from rich.console import Console

from oracle.localized_op import LocalizedOp
from oracle.pytest_plugin.failure import describe_failure
from oracle.render.console import print_summary
from oracle.render.github import workflow_commands
from oracle.render.html import render_html
from oracle.render.junit import render_junit
from oracle.render.markdown import render_markdown
from oracle.report import Report

AFTER = {**LOCALIZED, "module": "lm_head", "op": "aten.mm.default", "layer": None, "status": "after_capture",
         "op_class": "other"}


def _report() -> Report:
    r = hand_report()
    r.divergences = [divergence("invariance", "random-0", 7, localized=AFTER)]
    return r


def _console(r: Report) -> str:
    buf = io.StringIO()
    print_summary(Console(file=buf, width=140, markup=False, highlight=False, color_system=None), r, "r/report.json")
    return buf.getvalue()


VIEWS = {
    "console": _console,
    "markdown": render_markdown,
    "junit": lambda r: render_junit(r, "r/report.json"),
    "html": render_html,
    "github": lambda r: "\n".join(workflow_commands(r, Path("r/report.json"), 1)),
    "pytest": lambda r: describe_failure(r, Path("r/report.json")),
}


@pytest.mark.parametrize("view", VIEWS)
def test_every_view_says_the_difference_came_after_the_model(view: str) -> None:
    text = " ".join(VIEWS[view](_report()).split())  # the words, however a view folds its lines
    assert "every captured op agreed" in text and "after the model" in text, text[-2000:]
    assert "the last op that agreed: lm_head" in text
    assert "first diverging op: lm_head" not in text and "first diverging op: after" not in text


def test_the_localize_command_and_summary_say_so() -> None:
    op = LocalizedOp.from_json(AFTER)
    for line in (op.describe(), op.summary(), op.finding()):
        assert line.startswith("every captured op agreed; the difference came after the model (post-processing, "
                               "sampling, a logits processor); the last op that agreed: lm_head"), line
    localized = LocalizedOp.from_json({**AFTER, "module": "model.layers.1.mlp.down_proj", "status": "localized"})
    assert localized.finding().startswith("first diverging op: model.layers.1.mlp.down_proj")
