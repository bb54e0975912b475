"""Every exit of `oracle run` leaves this run's report in the folder it would write, or none: never an earlier
run's pass (a CI step that uploads or reads the folder afterwards would publish a run that never happened)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from oracle.cli import main


def _config(tmp_path: Path, model: Path, **extra: object) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({
        "model": str(model), "engine": {"kind": "fake_engine:FakeEngine"},
        "prompts": {"random": {"count": 2, "min_len": 2, "max_len": 4}}, "sampling": {"max_tokens": 3},
        "schedule": {"trials": 3, "seed": 1, "batch_size": [1, 4]}, **extra,
    }))
    return path


@pytest.fixture
def passing(tmp_path: Path, fake_model: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A real passing run's folder, `oracle-report/` of the working directory (the default every case writes)."""
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(_config(tmp_path, fake_model))]) == 0
    folder = tmp_path / "oracle-report"
    assert json.loads((folder / "report.json").read_text())["exit_code"] == 0
    return folder


def _exit(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's usage error
        return int(e.code or 0)


def _says_this_run(folder: Path, *words: str) -> dict[str, object]:
    report = json.loads((folder / "report.json").read_text())
    assert report["exit_code"] == 2 and report["complete"] is False, report
    for word in words:
        assert word in str(report["error"]), report["error"]
    summary = (folder / "summary.md").read_text()
    assert "config/usage error" in summary and "engine error" not in summary, summary
    assert "passed" not in summary.splitlines()[0], summary
    return report


def test_a_malformed_yaml_replaces_an_earlier_pass(passing: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    assert _exit(["run", str(bad)]) == 2
    _says_this_run(passing, "bad.yaml")
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_a_malformed_yaml_that_names_its_folder_replaces_that_folders_pass(passing: Path, tmp_path: Path) -> None:
    shutil.copytree(passing, tmp_path / "mine")
    bad = tmp_path / "bad.yaml"
    bad.write_text("report_dir: mine   # its own\nmodel: [unclosed\n")
    assert _exit(["run", str(bad)]) == 2
    _says_this_run(tmp_path / "mine", "bad.yaml")


def test_a_missing_config_file_replaces_an_earlier_pass(passing: Path, tmp_path: Path) -> None:
    assert _exit(["run", str(tmp_path / "missing.yaml")]) == 2
    _says_this_run(passing, "missing.yaml")


@pytest.mark.parametrize("flags", [["--trials", "0"], ["--seed", "-1"], ["--shard", "3/3"], ["--bogus"],
                                   ["--set", "not a field"]])
def test_a_bad_flag_replaces_an_earlier_pass(passing: Path, tmp_path: Path, flags: list[str],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert _exit(["run", str(tmp_path / "c.yaml"), *flags]) == 2
    report = _says_this_run(passing, "oracle run:")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(("oracle run: error: ", "oracle: error: ")), err
    assert str(report["error"]).removeprefix("oracle run: ") in err[0]


def test_a_bad_flag_replaces_the_pass_in_the_report_dir_it_names(passing: Path, tmp_path: Path) -> None:
    shutil.copytree(passing, tmp_path / "other")
    shutil.rmtree(passing)
    assert _exit(["run", "--report-dir", str(tmp_path / "other"), str(tmp_path / "c.yaml"), "--trials", "0"]) == 2
    _says_this_run(tmp_path / "other", "--trials")
    assert not passing.exists()  # nothing is created for a run that never started


def test_a_run_with_no_argument_is_one_line_and_replaces_the_default_folders_pass(
        passing: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert _exit(["run"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == ("oracle run: error: the following arguments are required: config "
                                    "(see oracle run --help)")
    _says_this_run(passing, "required")


@pytest.mark.parametrize("setting", ["schedule.trials=0", "model=3", "bogus.field=1"])
def test_a_bad_config_value_replaces_an_earlier_pass(passing: Path, tmp_path: Path, setting: str) -> None:
    assert _exit(["run", str(tmp_path / "c.yaml"), "--set", setting]) == 2
    _says_this_run(passing)


def test_replay_of_a_partial_report_says_it_has_no_trials(passing: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit(["run", str(tmp_path / "c.yaml"), "--trials", "0"]) == 2
    capsys.readouterr()
    for command in ("replay", "localize"):
        assert main([command, str(passing / "report.json"), "--trial", "0"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert "a partial report" in err[0] and "no trials to replay" in err[0] and "--trials" in err[0], err
