"""The example database: failing trials of a run are replayed first by the next (`--db`, `--oracle-db`),
forgotten once they pass, keyed by what the trials mean (config and engine), never written unasked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from oracle.cli import main as oracle_main
from oracle.config import parse_config
from oracle.example_db import ExampleDB, db_key
from oracle.runner import run
from oracle.schedule import Filler, Trial

pytest_plugins = ["pytester"]

SUPPORT = Path(__file__).resolve().parents[1] / "support"
SEED = 12  # the schedule alone misses the planted band; the search finds it (tests/unit/test_search.py)


def band_config(model: Path, log: Path, search: int = 0, band: tuple[int, int] = (301, 306)) -> dict[str, Any]:
    return {
        "model": str(model),
        "engine": {"kind": "band_engine:BandEngine",
                   "options": {"band_lo": band[0], "band_hi": band[1], "log": str(log)}},
        "prompts": {"random": {"count": 4, "min_len": 4, "max_len": 24}},
        "sampling": {"max_tokens": 2},
        "schedule": {"trials": 50, "batch_size": [1, 17], "filler_len": [1, 40], "repeat_trials": 0,
                     "search": {"trials": search}},
        "checks": {"prefill_decode": "off", "prefix_cache": "off", "negative_control": "off", "fidelity": "off",
                   "repeatability": "off"},
    }


def invariant_calls(log: Path) -> list[str]:
    return [line.split()[1] for line in log.read_text().splitlines() if line.startswith("invariant ")]


def test_failing_trials_are_replayed_first_by_the_next_run(fake_model: Path, tmp_path: Path) -> None:
    db, log = tmp_path / "db", tmp_path / "calls.log"
    first = run(parse_config(band_config(fake_model, log, search=200)), seed=SEED, report_dir=tmp_path / "r1",
                example_db=db)
    assert first.exit_code() == 1
    failing = {d.trial_id for d in first.divergences if d.check == "invariance"}
    assert first.example_db is not None
    assert first.example_db.saved == len(failing) and first.example_db.replayed == []
    assert first.example_db.key == db_key(parse_config(band_config(fake_model, log)))

    # The schedule alone passes with this seed (test_search); the saved trials fail it, and run first.
    log.unlink()
    again = run(parse_config(band_config(fake_model, log)), seed=SEED, report_dir=tmp_path / "r2", example_db=db)
    assert again.exit_code() == 1
    replayed = [t for t in again.schedule if t.origin == "database"]
    assert len(replayed) == len(failing) and again.example_db is not None and again.example_db.replayed == [t.trial_id for t in replayed]
    assert [t.trial_id for t in replayed] == list(range(50, 50 + len(replayed)))  # ids after the schedule's
    calls = [c for c in invariant_calls(log) if not c.startswith("solo-")]
    # Right after the solo references, before any trial of the schedule.
    assert [c.split("-")[0] for c in calls[:len(replayed)]] == [f"trial{t.trial_id}" for t in replayed]
    bad = {d.trial_id for d in again.divergences if d.check == "invariance" and not d.shrunk}
    assert {t.trial_id for t in replayed} <= bad
    assert next(c for c in again.checks if c.name == "invariance").evidence["shrink"]["start_trial"] == 50
    assert again.coverage["trials replayed from the example database"] == len(replayed)


def test_a_replayed_trial_that_passes_is_forgotten(fake_model: Path, tmp_path: Path) -> None:
    db, log = tmp_path / "db", tmp_path / "calls.log"
    config = parse_config(band_config(fake_model, log))
    store = ExampleDB.open(db, config)
    passing = Trial(0, 1, 0, 0, (Filler(seed=5, length=3, max_tokens=2, arrival_step=0),))
    store.update([passing], [])
    assert store.stored(4) == [passing]
    report = run(config, seed=SEED, report_dir=tmp_path / "r", example_db=db)
    assert report.exit_code() == 0
    assert report.example_db is not None
    assert report.example_db.replayed == [50] and report.example_db.deleted == 1
    assert report.example_db.saved == 0 and store.stored(4) == []


def test_the_key_leaves_out_how_many_trials_and_where_but_not_what_they_mean(fake_model: Path, tmp_path: Path) -> None:
    base = band_config(fake_model, tmp_path / "log")
    key = db_key(parse_config(base))
    for path, value in [(("schedule", "trials"), 7), (("schedule", "seed"), 3), (("schedule", "search"), {"trials": 9}),
                        (("report_dir",), "elsewhere"), (("schedule", "max_shrink_runs"), 5)]:
        data = json.loads(json.dumps(base))
        (data if len(path) == 1 else data[path[0]])[path[-1]] = value
        assert db_key(parse_config(data)) == key, path
    for path, value in [(("engine", "options"), {"band_lo": 1, "band_hi": 2}), (("sampling", "max_tokens"), 3),
                        (("schedule", "filler_len"), [1, 8])]:
        data = json.loads(json.dumps(base))
        data[path[0]][path[1]] = value
        assert db_key(parse_config(data)) != key, path


def test_unreadable_or_foreign_entries_are_dropped(fake_model: Path, tmp_path: Path) -> None:
    config = parse_config(band_config(fake_model, tmp_path / "log"))
    store = ExampleDB.open(tmp_path / "db", config)
    db = store._db()
    db.save(store.key.encode(), b"not json")
    store.update([Trial(0, 9, 0, 0, ())], [])  # target 9: this run has 4
    assert store.stored(4) == []
    assert list(db.fetch(store.key.encode())) == []


def test_a_db_path_that_is_a_file_is_a_config_error(fake_model: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(band_config(fake_model, tmp_path / "log")))
    (tmp_path / "file").write_text("")
    assert oracle_main(["run", str(cfg), "--db", str(tmp_path / "file"), "--report-dir", str(tmp_path / "r")]) == 2


def test_cli_db_option_and_nothing_written_without_it(fake_model: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    cfg = work / "c.yaml"
    cfg.write_text(yaml.safe_dump(band_config(fake_model, tmp_path / "log", search=200)))
    assert oracle_main(["run", str(cfg), "--seed", str(SEED), "--report-dir", str(tmp_path / "r0")]) == 1
    assert sorted(p.name for p in work.iterdir()) == ["c.yaml"]  # no .hypothesis/, no database
    assert json.loads((tmp_path / "r0" / "report.json").read_text())["example_db"] == {}
    assert oracle_main(["run", str(cfg), "--seed", str(SEED), "--db", "db", "--report-dir", str(tmp_path / "r1")]) == 1
    report = json.loads((tmp_path / "r1" / "report.json").read_text())
    assert report["example_db"]["path"] == "db" and report["example_db"]["saved"] > 0
    assert (work / "db").is_dir() and not (work / ".hypothesis").exists()


# The database's replay and update run fast above (runner and CLI); this is the plugin's option end to end, two
# pytest sessions of 50 trials and a 200-trial search.
@pytest.mark.slow
def test_pytest_plugin_honours_oracle_db(pytester: pytest.Pytester, fake_model: Path, tmp_path: Path) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makeconftest(f"import sys\nsys.path.insert(0, {str(SUPPORT)!r})\n")
    cfg = band_config(fake_model, tmp_path / "log", search=200)
    cfg["schedule"]["seed"] = SEED
    pytester.makefile(".yaml", **{"oracle-band": yaml.safe_dump(cfg)})
    root, db = pytester.path / "reports", tmp_path / "db"
    pytester.runpytest_subprocess("--oracle-report-dir", str(root), "--oracle-db", str(db), "-p", "no:cacheprovider")
    (report,) = [json.loads(p.read_text()) for p in root.rglob("report.json")]
    assert report["example_db"]["path"] == str(db) and report["example_db"]["saved"] > 0
    cfg["schedule"]["search"] = {"trials": 0}
    pytester.makefile(".yaml", **{"oracle-band": yaml.safe_dump(cfg)})
    pytester.runpytest_subprocess("--oracle-report-dir", str(root), "--oracle-db", str(db), "-p", "no:cacheprovider")
    (report,) = [json.loads(p.read_text()) for p in root.rglob("report.json")]
    assert report["example_db"]["replayed"] and any(t["origin"] == "database" for t in report["schedule"])
