"""A refused `oracle merge` (exit 2, one line) creates nothing: no empty report folder is left behind."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from oracle.cli import main
from oracle.config import parse_config
from oracle.runner import run
from oracle.shards.results import RESULTS_FILE


def _config(model: Path, seed: int = 7) -> dict[str, Any]:
    return {
        "model": str(model), "engine": {"kind": "fake_engine:FakeEngine"},
        "prompts": {"random": {"count": 2, "min_len": 2, "max_len": 4}}, "sampling": {"max_tokens": 3},
        "schedule": {"trials": 6, "seed": seed, "batch_size": [1, 6], "repeat_trials": 1},
        "checks": {"prefill_decode": "off", "prefix_cache": "off"},
    }


@pytest.fixture
def two(fake_model: Path, tmp_path: Path) -> list[Path]:
    folders = []
    for i in range(2):
        folder = tmp_path / f"shard-{i}"
        run(parse_config(_config(fake_model)), report_dir=folder, shard=(i, 2))
        folders.append(folder)
    return folders


def _refused(argv: list[str], out: Path, capsys: pytest.CaptureFixture[str], *words: str) -> None:
    capsys.readouterr()
    try:
        code = main(["merge", *argv, "--report-dir", str(out)])
    except SystemExit as e:  # argparse's usage error
        code = int(e.code or 0)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    for word in words:
        assert word in err[0], err
    assert not out.exists() and not out.is_symlink(), f"{out} was created by a refused merge"


def test_a_duplicate_shard_creates_nothing(two: list[Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(two[1], tmp_path / "copy")
    _refused([*map(str, two), str(tmp_path / "copy")], tmp_path / "out" / "merged", capsys, "both shard 1/2")


def test_shards_of_different_runs_create_nothing(fake_model: Path, two: list[Path], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other"
    run(parse_config(_config(fake_model, seed=8)), report_dir=other, shard=(1, 2))
    _refused([str(two[0]), str(other)], tmp_path / "merged", capsys, "different runs")


def test_a_damaged_results_file_creates_nothing(two: list[Path], tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    results = two[1] / RESULTS_FILE
    results.write_bytes(results.read_bytes()[: results.stat().st_size // 2])
    _refused(list(map(str, two)), tmp_path / "merged", capsys, str(results))


@pytest.mark.parametrize("name", [RESULTS_FILE, "report.json"])
def test_a_symlink_in_a_shard_folder_creates_nothing(two: list[Path], tmp_path: Path, name: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A link that leads nowhere, and one to a FIFO (a read would wait forever); a link to a regular file is
    read as the file."""
    target = two[1] / name
    target.unlink()
    target.symlink_to(tmp_path / "nowhere")
    _refused(list(map(str, two)), tmp_path / "merged", capsys, name)
    os.mkfifo(tmp_path / "fifo")
    target.unlink()
    target.symlink_to(tmp_path / "fifo")
    _refused(list(map(str, two)), tmp_path / "merged", capsys, name)


@pytest.mark.parametrize("name", [RESULTS_FILE, "report.json"])
def test_a_fifo_in_a_shard_folder_creates_nothing(two: list[Path], tmp_path: Path, name: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    target = two[0] / name
    target.unlink()
    os.mkfifo(target)
    _refused(list(map(str, two)), tmp_path / "merged", capsys, name)


def test_an_empty_folder_name_creates_nothing(two: list[Path], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    _refused([str(two[0]), "", str(two[1])], tmp_path / "merged", capsys, "empty folder name")


def test_a_shard_prints_the_merge_that_comes_next_and_the_merge_its_time(
        fake_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(_config(fake_model)))
    for i in range(2):
        capsys.readouterr()
        assert main(["run", str(config), "--shard", f"{i}/2", "--report-dir", str(tmp_path / f"shard-{i}")]) == 0
        out = capsys.readouterr().out
        assert (f"next: once all 2 shards ran: oracle merge {tmp_path / 'shard-0'} {tmp_path / 'shard-1'} "
                "--report-dir oracle-report") in out, out
    assert main(["merge", str(tmp_path / "shard-0"), str(tmp_path / "shard-1"), "--report-dir",
                 str(tmp_path / "merged")]) == 0
    out = capsys.readouterr().out
    footer = " ".join(out[out.index("report: "):].split())  # folded at the console's width: joined
    assert re.search(r"time: [\d.]+s to merge \(the 2 shards ran invariant [\d.]+s, production [\d.]+s, summed\)",
                     footer), footer
    assert "next:" not in out  # a merged report is the run's verdict


def test_localize_says_what_it_came_to_not_a_count(capsys: pytest.CaptureFixture[str]) -> None:
    from rich.console import Console

    from oracle.render.console import ConsoleObserver

    observer = ConsoleObserver(Console(markup=False, highlight=False, color_system=None, width=80))
    for outcome in ("trial 3: not localized (the engine declares no capture)", None):
        observer.phase("localize", 1)
        if outcome is not None:
            observer.outcome(outcome)
        observer.done()
    lines = capsys.readouterr().out.splitlines()
    assert "localize: trial 3: not localized (the engine declares no capture)" in lines
    assert lines.count("localize: done 0/1") == 1  # only where nothing was said
