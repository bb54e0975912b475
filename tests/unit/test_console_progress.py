"""The console's progress lines when a phase runs inside another (the guided search inside a mode's trials)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from oracle.render.console import ConsoleObserver


def test_a_phase_inside_another_counts_its_own_runs_and_the_outer_resumes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    buf = io.StringIO()
    obs = ConsoleObserver(Console(file=buf, width=80), heartbeat_every=100, heartbeat_s=None)
    obs.phase("invariant", 6)  # 2 references, 2 trials, then 2 repeats after the search
    for _ in range(4):
        obs.advance(0)
    obs.phase("search", 3)
    for _ in range(3):
        obs.advance(1)
    obs.done()
    obs.advance(1)
    obs.advance(1)
    obs.done()
    lines = buf.getvalue().splitlines()
    assert lines == ["invariant: 6 engine runs", "search: 3 engine runs", "search: done 3/3", "invariant: done 6/6"]
