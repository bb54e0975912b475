"""Shards: `run --shard i/N` on each slice, then `merge`, equals the unsharded run with the same seed;
shards that are not the whole of one run are refused (exit 2) naming the folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from oracle.cli import main
from oracle.config import parse_config
from oracle.errors import ConfigError
from oracle.prompts import Target
from oracle.render.files import write_formats
from oracle.report_sections import ShardSlice
from oracle.runner import run
from oracle.schedule import Filler, Trial
from oracle.shards.assign import assign, parse_shard, trial_cost
from oracle.shards.merge import merge
from oracle.shards.results import RESULTS_FILE

SUPPORT = Path(__file__).parents[1] / "support"
# What a merged report must share with the unsharded one (timings, environment and the shard record differ).
EQUAL = ("checks", "divergences", "coverage", "schedule", "seed", "config_digest", "exit_code", "complete")


def _config(model: Path, report_dir: Path, **options: Any) -> dict[str, Any]:
    return {
        "model": str(model),
        "engine": {"kind": "fake_engine:FakeEngine", "options": options},
        "prompts": {"random": {"count": 3, "min_len": 2, "max_len": 5}},
        "sampling": {"max_tokens": 4},
        "schedule": {"trials": 20, "seed": 7, "batch_size": [1, 12], "repeat_trials": 3},
        "checks": {"prefill_decode": "warn", "prefix_cache": "warn"},
        "report_dir": str(report_dir),
    }


def _json(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "report.json").read_text())  # type: ignore[no-any-return]


def _shards(data: dict[str, Any], tmp_path: Path, n: int) -> list[Path]:
    folders = []
    for i in range(n):
        folder = tmp_path / f"shard-{i}"
        report = run(parse_config(data), report_dir=folder, shard=(i, n))
        assert isinstance(report.shard, ShardSlice) and report.shard.index == i and report.exit_code() == 0  # a whole shard exits 0: merge gives the verdict
        folders.append(folder)
    return folders


def _assert_equal(tmp_path: Path, data: dict[str, Any], n: int) -> dict[str, Any]:
    whole = tmp_path / "whole"
    run(parse_config(data), report_dir=whole)
    folders = _shards(data, tmp_path, n)
    merged = merge(list(reversed(folders)), tmp_path / "merged", trusted=True, views=[write_formats])  # any order
    a, b = _json(whole), _json(tmp_path / "merged")
    for key in EQUAL:
        assert a[key] == b[key], key
    assert merged.exit_code() == a["exit_code"]
    assert (tmp_path / "merged" / "summary.md").is_file()
    return b


@pytest.mark.parametrize("n", [1, 2])
def test_merged_shards_equal_the_unsharded_run_with_a_failure(fake_model: Path, tmp_path: Path, n: int) -> None:
    data = _config(fake_model, tmp_path / "r", diverge_from_batch=5, diverge_step=2)
    merged = _assert_equal(tmp_path, data, n)
    inv = next(c for c in merged["checks"] if c["name"] == "invariance")
    assert inv["verdict"] == "fail" and merged["exit_code"] == 1
    assert "shrink" in inv["evidence"]  # shrunk once, in the merge, as the unsharded run shrank it
    assert merged["timings"]["merge_shrink_s"] >= 0 and merged["shard"]["count"] == n


def test_merge_rechecks_a_failure_it_neither_shrinks_nor_localizes(fake_model: Path, tmp_path: Path) -> None:
    data = _config(fake_model, tmp_path / "r", diverge_from_batch=5, diverge_step=2)
    data["schedule"]["shrink"] = False
    data["checks"]["invariance"] = {"requirement": "required", "localize": "off"}
    merged = _assert_equal(tmp_path, data, 2)
    inv = next(c for c in merged["checks"] if c["name"] == "invariance")
    assert inv["evidence"]["recheck"]["reproduced"] and "shrink" not in inv["evidence"]


@pytest.mark.slow
@pytest.mark.parametrize("n", [3, 7])
def test_merged_shards_equal_the_unsharded_run_many(fake_model: Path, tmp_path: Path, n: int) -> None:
    data = _config(fake_model, tmp_path / "r", diverge_from_batch=5, diverge_step=2)
    _assert_equal(tmp_path, data, n)


def test_merge_that_would_run_a_custom_engine_needs_trust(fake_model: Path, tmp_path: Path) -> None:
    folders = _shards(_config(fake_model, tmp_path / "r", diverge_from_batch=5, diverge_step=2), tmp_path, 2)
    assert "--trust-report" in _merge_error(folders, tmp_path / "m")


def test_merged_shards_equal_a_passing_run(fake_model: Path, tmp_path: Path) -> None:
    merged = _assert_equal(tmp_path, _config(fake_model, tmp_path / "r"), 3)
    assert merged["exit_code"] == 0 and not any(k.startswith("merge_shrink") for k in merged["timings"])


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_tiny_config_merged_equals_unsharded(tmp_path: Path, n: int) -> None:
    from oracle.config import load_config

    config = load_config(Path(__file__).parents[2] / "configs" / "tiny.yaml",
                         {"schedule.trials": 12, "schedule.repeat_trials": 3})
    whole = tmp_path / "whole"
    run(config, seed=11, report_dir=whole)
    folders = []
    for i in range(n):
        folders.append(tmp_path / f"s{i}")
        run(config, seed=11, report_dir=folders[-1], shard=(i, n))
    merge(folders, tmp_path / "merged")
    a, b = _json(whole), _json(tmp_path / "merged")
    for key in EQUAL:
        assert a[key] == b[key], key


def test_shard_spec_is_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a refused command line writes its exit-2 report where the run would have
    assert parse_shard("2/7") == (2, 7) and parse_shard("0/1") == (0, 1)
    for bad in ("7/7", "1", "a/b", "-1/3", "0/0"):
        with pytest.raises(ConfigError, match="--shard"):
            parse_shard(bad)
    with pytest.raises(SystemExit) as e:
        main(["run", "x.yaml", "--shard", "3/3"])
    assert e.value.code == 2


def _trial(tid: int, fillers: int, length: int) -> Trial:
    return Trial(tid, 0, 0, 0, tuple(Filler(tid * 10 + j, length, 2, 0) for j in range(fillers)))


def test_assign_deals_every_trial_once_balanced_by_cost() -> None:
    targets = (Target("t", (1, 2, 3)),)
    trials = [_trial(i, i % 5, 1 + (i * 7) % 13) for i in range(40)]
    for n in (1, 2, 3, 7, 50):
        parts = assign(trials, targets, 4, 5, n)
        ids = sorted(i for p in parts for i in p)
        assert ids == list(range(40)) and len(parts) == n
        loads = [sum(trial_cost(trials[i], targets, 4, i < 5) for i in p) for p in parts]
        biggest = max(trial_cost(t, targets, 4, t.trial_id < 5) for t in trials)
        assert max(loads) - min(loads) <= biggest
    assert assign(trials, targets, 4, 5, 3) == assign(list(trials), targets, 4, 5, 3)  # a function of the schedule


def test_repeated_trial_costs_twice() -> None:
    targets = (Target("t", (1, 2, 3)),)
    t = _trial(0, 2, 5)
    assert trial_cost(t, targets, 4, True) == 2 * trial_cost(t, targets, 4, False) == 2 * (3 + 4 + 2 * (5 + 2))


@pytest.fixture
def three(fake_model: Path, tmp_path: Path) -> list[Path]:
    return _shards(_config(fake_model, tmp_path / "r"), tmp_path, 3)


def _merge_error(folders: list[Path], out: Path) -> str:
    with pytest.raises(ConfigError) as e:
        merge(folders, out)
    return str(e.value)


def test_missing_shard_is_named(three: list[Path], tmp_path: Path) -> None:
    assert "shard 1/3 missing" in _merge_error([three[0], three[2]], tmp_path / "m")
    assert main(["merge", str(three[0]), str(three[2]), "--report-dir", str(tmp_path / "m")]) == 2


def test_duplicate_shard_is_named(three: list[Path], tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(three[1], copy)
    msg = _merge_error([*three, copy], tmp_path / "m")
    assert "both shard 1/3" in msg and str(copy) in msg


def test_shard_of_another_seed_is_named(fake_model: Path, three: list[Path], tmp_path: Path) -> None:
    data = _config(fake_model, tmp_path / "r")
    data["schedule"]["seed"] = 8
    other = tmp_path / "other"
    run(parse_config(data), report_dir=other, shard=(2, 3))
    msg = _merge_error([three[0], three[1], other], tmp_path / "m")
    assert str(other) in msg and "seed" in msg


def test_shard_of_another_config_is_named(fake_model: Path, three: list[Path], tmp_path: Path) -> None:
    data = _config(fake_model, tmp_path / "r")
    data["sampling"]["max_tokens"] = 5
    other = tmp_path / "other"
    run(parse_config(data), report_dir=other, shard=(2, 3))
    assert "config digest" in _merge_error([three[0], three[1], other], tmp_path / "m")


def test_shard_of_another_version_is_named(three: list[Path], tmp_path: Path) -> None:
    path = three[2] / "report.json"
    data = json.loads(path.read_text())
    data["oracle_version"] = "0.0.0-other"
    path.write_text(json.dumps(data))
    msg = _merge_error(three, tmp_path / "m")
    assert "oracle version" in msg and str(three[2]) in msg


def test_partial_shard_is_named(three: list[Path], tmp_path: Path) -> None:
    path = three[1] / "report.json"
    data = json.loads(path.read_text())
    data.update(complete=False, error="engine raised RuntimeError: boom", exit_code=3)
    path.write_text(json.dumps(data))
    msg = _merge_error(three, tmp_path / "m")
    assert "partial" in msg and str(path) in msg


def test_damaged_results_are_named(three: list[Path], tmp_path: Path) -> None:
    results = three[2] / RESULTS_FILE
    results.write_bytes(results.read_bytes()[: results.stat().st_size // 2])
    assert str(results) in _merge_error(three, tmp_path / "m")
    results.unlink()
    assert "missing" in _merge_error(three, tmp_path / "m")


def test_shard_short_of_trials_is_partial(three: list[Path], tmp_path: Path) -> None:
    import numpy as np

    results = three[0] / RESULTS_FILE
    with np.load(results, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    meta = json.loads(arrays["meta"].tobytes())
    meta["modes"]["invariant"]["trials"] = meta["modes"]["invariant"]["trials"][:-1]
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(results, **arrays)
    assert "is partial" in _merge_error(three, tmp_path / "m")


def test_references_that_disagree_are_named(three: list[Path], tmp_path: Path) -> None:
    import numpy as np

    results = three[1] / RESULTS_FILE
    with np.load(results, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    meta = json.loads(arrays["meta"].tobytes())
    solo = meta["modes"]["invariant"]["solo"][0][1]
    solo["logprobs"][0] = float(np.nextafter(np.float32(solo["logprobs"][0]), np.float32(0)))
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(results, **arrays)
    msg = _merge_error(three, tmp_path / "m")
    assert "engines that disagree" in msg and str(three[1]) in msg


def test_merge_into_a_shard_folder_is_refused(three: list[Path]) -> None:
    assert "shard's folder" in _merge_error(three, three[0])


def test_not_a_shard_report_is_named(fake_model: Path, three: list[Path], tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    run(parse_config(_config(fake_model, tmp_path / "r")), report_dir=plain)
    assert "not a shard's report" in _merge_error([*three, plain], tmp_path / "m")


def test_search_cannot_be_sharded(fake_model: Path, tmp_path: Path) -> None:
    data = _config(fake_model, tmp_path / "r")
    data["schedule"]["search"] = {"trials": 4}
    with pytest.raises(ConfigError, match="schedule.search"):
        run(parse_config(data), report_dir=tmp_path / "s", shard=(0, 2))


@pytest.mark.slow
def test_supervised_cli_passes_shard_to_the_child(fake_model: Path, tmp_path: Path) -> None:
    import yaml

    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(_config(fake_model, tmp_path / "r")))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")])}
    for i in range(2):
        done = subprocess.run([sys.executable, "-c", "from oracle.cli import entry; entry()", "run", str(config),
                               "--shard", f"{i}/2", "--report-dir", str(tmp_path / f"s{i}")],
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert _json(tmp_path / f"s{i}")["shard"]["index"] == i
    done = subprocess.run([sys.executable, "-m", "oracle", "merge", str(tmp_path / "s0"), str(tmp_path / "s1"),
                           "--report-dir", str(tmp_path / "m")], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert _json(tmp_path / "m")["shard"]["count"] == 2


def _config_without_a_seed(fake_model: Path, tmp_path: Path) -> Path:
    import yaml

    data = _config(fake_model, tmp_path / "r")
    del data["schedule"]["seed"]
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(data))
    return config


def test_a_shard_without_a_shared_seed_is_refused(fake_model: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Each shard draws the whole schedule from the seed: a seed drawn per process would slice N schedules."""
    config = _config_without_a_seed(fake_model, tmp_path)
    assert main(["run", str(config), "--shard", "0/2", "--report-dir", str(tmp_path / "s0")]) == 2
    err = capsys.readouterr().err
    assert "--shard: give every shard the same --seed S (or set schedule.seed in the config)" in err
    assert not (tmp_path / "s0").exists()


def test_a_shard_says_it_is_a_shard_not_the_runs_verdict(fake_model: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    config = _config_without_a_seed(fake_model, tmp_path)
    assert main(["run", str(config), "--seed", "5", "--shard", "1/2", "--report-dir", str(tmp_path / "s1")]) == 0
    said = "shard 1/2 of seed 5 ran (exit 0): merge the shards to judge"
    out = capsys.readouterr().out
    assert said in out and "passed" not in out.split(said)[0].splitlines()[-1]
    for view in ("summary.md", "report.html"):
        assert said in (tmp_path / "s1" / view).read_text(), view
