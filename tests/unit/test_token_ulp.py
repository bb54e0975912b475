"""A ULP distance is a distance between two logprobs of the same token: a changed token has none, and
every view says "token changed" instead of a number (nor files it in the HTML ULP plot)."""

from __future__ import annotations

import io
from pathlib import Path

from hand_report import divergence, hand_report
from rich.console import Console

from oracle.compare import first_divergence
from oracle.engines.contract import Completion
from oracle.render.console import print_summary
from oracle.render.html import render_html, ulp_histogram
from oracle.render.junit import render_junit
from oracle.render.markdown import render_markdown


def test_a_changed_token_has_no_ulp() -> None:
    expected = Completion("r", [1, 2], [-1.0, -0.5], top2=[(1.0, 0.9)] * 2)
    actual = Completion("r", [1, 7], [-1.0, -3.75], top2=[(1.0, 0.9)] * 2)
    d = first_divergence(expected, actual)
    assert d is not None and d.kind == "token" and d.ulp is None


def test_a_same_token_logprob_keeps_its_ulp() -> None:
    expected = Completion("r", [1, 2], [-1.0, -0.5], top2=[(1.0, 0.9)] * 2)
    actual = Completion("r", [1, 2], [-1.0, -0.5000001], top2=[(1.0, 0.9)] * 2)
    d = first_divergence(expected, actual)
    assert d is not None and d.kind == "logprob" and d.ulp is not None and d.ulp > 0


def _token_report() -> object:
    r = hand_report()
    # As an older report could hold it: a token change with a ULP computed across the two tokens.
    changed = divergence("invariance", "changed-target", 3, ulp=31_616_160).model_copy(
        update={"kind": "token", "expected_token": 5, "actual_token": 9})
    return r.model_copy(update={"divergences": [changed]})


def test_views_say_token_changed_not_a_ulp() -> None:
    r = _token_report()
    buf = io.StringIO()
    print_summary(Console(file=buf, width=200, markup=False, color_system=None), r, "r/report.json")  # type: ignore[arg-type]
    views = {"console": buf.getvalue(), "markdown": render_markdown(r),  # type: ignore[arg-type]
             "html": render_html(r), "junit": render_junit(r)}  # type: ignore[arg-type]
    for name, text in views.items():
        assert "31616160" not in text and "31,616,160" not in text, name
    for name in ("console", "markdown", "html"):
        assert "token changed" in views[name], name
    assert ulp_histogram(r.divergences) == []  # type: ignore[attr-defined]


def test_a_logits_only_divergence_never_reads_as_ulp_0() -> None:
    """Same token, logprob bitwise equal, the logits row differs: every view says so, never "ULP 0"."""
    from oracle.pytest_plugin.failure import describe_divergence

    expected = Completion("r", [1, 2], [-1.0, -0.5], logits=[[0.1, 0.2], [0.3, 0.4]])
    actual = Completion("r", [1, 2], [-1.0, -0.5], logits=[[0.1, 0.2], [0.3, 0.40000004]])
    d = first_divergence(expected, actual)
    assert d is not None and d.kind == "logits" and d.ulp == 0
    r = hand_report()
    logits = divergence("invariance", "logits-target", 3, ulp=0).model_copy(update={"kind": "logits"})
    r = r.model_copy(update={"divergences": [logits]})
    buf = io.StringIO()
    print_summary(Console(file=buf, width=200, markup=False, color_system=None), r, "r/report.json")
    views = {"console": buf.getvalue(), "markdown": render_markdown(r), "html": render_html(r),
             "junit": render_junit(r), "pytest": "\n".join(describe_divergence(logits, Path("r/report.json"), {}))}
    for name, text in views.items():
        assert "ulp 0" not in text.lower() and "ULP distance 0" not in text, name
        assert "logits differ" in text or "the logits row differs" in text, name
