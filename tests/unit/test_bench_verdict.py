"""`oracle bench verdict`: whole `oracle run`s of configs, timed, each row read from the run's own report.

Real runs of the tiny config (a few seconds each); the figures are not asserted, only what each row says: the
checks' verdicts and timings from the report, a run past its limit stopped and read from its interrupted report.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oracle.bench_verdict import parse_targets, start_parts
from oracle.cli import main
from oracle.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny.yaml"


def test_targets_take_a_seed_after_at() -> None:
    one, two = parse_targets([str(TINY), f"{TINY}@7"])
    assert (one.seed, two.seed, two.config, two.name) == (None, 7, TINY, "tiny@7")


@pytest.mark.parametrize(("spec", "message"), [("nope.yaml", "no such config file"),
                                               (f"{TINY}@x", "whole number")])
def test_a_bad_target_is_a_config_error(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_targets([spec])
    assert main(["bench", "verdict", spec]) == 2


def test_a_bench_that_takes_no_further_arguments_refuses_them() -> None:
    assert main(["bench", "kernels", "extra"]) == 2


def test_start_parts_name_each_part_not_the_whole() -> None:
    timings = {"invariant_engine_start_s": 9.0, "invariant_engine_start_import_vllm_s": 3.8,
               "production_engine_start_vllm_engine_s": 4.9, "invariant_trials_s": 2.0}
    assert start_parts(timings) == "invariant: import_vllm 3.8s; production: vllm_engine 4.9s"
    timings = {"invariant_localize_s": 9.0, "invariant_localize_capture_s": 2.0, "invariant_localize_eager_twin_start_s": 6.0}
    assert start_parts(timings, "localize") == "invariant: capture 2.0s, eager_twin_start 6.0s"


def test_a_config_whose_path_holds_an_at_is_a_config_not_a_seed(tmp_path: Path) -> None:
    path = tmp_path / "ci@2.yaml"
    path.write_text(TINY.read_text())
    (target,) = parse_targets([str(path)])
    assert (target.config, target.seed) == (path, None)
    with pytest.raises(ConfigError, match="whole number"):
        parse_targets([f"{TINY}@\u00b2"])  # a digit to str.isdigit, not to int()


def test_a_kept_folders_earlier_report_is_not_read_as_this_runs(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that ends before it writes a report (here `false` stands in for the interpreter) leaves no verdict
    behind: the kept folder's earlier passing report is gone, not quoted as this run's."""
    import shutil

    from oracle import bench_verdict

    report_dir = tmp_path / "1-tiny-run1"
    report_dir.mkdir()
    (report_dir / "report.json").write_text('{"complete": true, "exit_code": 0, "checks": [], "timings": {}}')
    false = shutil.which("false")
    assert false is not None
    monkeypatch.setattr(bench_verdict.sys, "executable", false)
    row = bench_verdict.run_once(bench_verdict.Target(TINY, None), report_dir, [], 30)
    assert row["exit_code"] != 0 and not row.get("complete") and row["report"].startswith("unreadable")
    assert not (report_dir / "report.json").exists()


def test_a_limit_of_zero_is_refused() -> None:
    assert main(["bench", "verdict", str(TINY), "--run-timeout", "0"]) == 2


@pytest.mark.slow
def test_each_run_is_read_from_its_report(model_cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "verdict.json"
    code = main(["bench", "verdict", f"{TINY}@1", "--runs", "1", "--json", str(out), "--keep", str(tmp_path / "runs")])
    assert code == 0
    data = json.loads(out.read_text())
    (row,) = data["rows"]
    assert (row["seed"], row["exit_code"], row["stopped_at_limit"], row["complete"]) == (1, 0, False, True)
    assert row["checks"]["invariance"] == "pass" and row["timings"]["invariant_trials_s"] > 0
    report = json.loads((Path(row["report_dir"]) / "report.json").read_text())
    assert report["seed"] == 1 and report["timings"] == row["timings"]
    printed = capsys.readouterr().out
    assert printed.startswith("machine: ") and "tiny@1 run 1:" in printed and "where the time went:" in printed


@pytest.mark.slow
def test_a_run_past_its_limit_is_stopped_and_read_from_its_interrupted_report(model_cache: Path,
                                                                              tmp_path: Path) -> None:
    out = tmp_path / "verdict.json"
    # 10,000 trials (about 3 minutes here) do not end within the limit, and 20 s leave the run time to write the
    # report it starts with, on a loaded machine too; --set reaches every run.
    code = main(["bench", "verdict", str(TINY), "--runs", "1", "--run-timeout", "20", "--set", "schedule.trials=10000",
                 "--json", str(out), "--keep", str(tmp_path / "runs")])
    assert code == 1
    (row,) = json.loads(out.read_text())["rows"]
    assert row["stopped_at_limit"] and row["exit_code"] != 0
    assert row.get("complete") is False, row.get("log_tail")  # the report the run wrote as it stopped, not a verdict
    assert json.loads((Path(row["report_dir"]) / "report.json").read_text())["complete"] is False
