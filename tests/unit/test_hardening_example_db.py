"""The example database as untrusted input (a CI cache restored from elsewhere): entries asking absurd
token counts, FIFOs and devices in its folder are dropped with a warning; a folder that cannot be written
warns, and the report never claims a trial saved that is not on disk."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from oracle.config import parse_config
from oracle.example_db import ExampleDB, _encode
from oracle.runner import run
from oracle.schedule import Filler, Trial


def _config(model: Path, tmp_path: Path) -> dict[str, Any]:
    return {"model": str(model), "engine": {"kind": "fake_engine:FakeEngine",
                                            "options": {"diverge_from_batch": 3, "diverge_step": 1}},
            "prompts": {"random": {"count": 2, "min_len": 2, "max_len": 4}}, "sampling": {"max_tokens": 3},
            "schedule": {"trials": 6, "seed": 3, "batch_size": [1, 6], "repeat_trials": 0},
            "report_dir": str(tmp_path / "r")}


@pytest.mark.parametrize(("filler", "field"), [(Filler(1, 2_000_000_000, 2, 0), "filler length 2,000,000,000"),
                                               (Filler(1, 4, 1_000_000_000, 0), "filler max_tokens 1,000,000,000")])
def test_a_stored_trial_with_absurd_token_counts_is_dropped(fake_model: Path, tmp_path: Path, filler: Filler,
                                                            field: str) -> None:
    config = parse_config(_config(fake_model, tmp_path))
    store = ExampleDB.open(tmp_path / "db", config)
    store._db().save(store.key.encode(), _encode(Trial(0, 0, 0, 0, (filler,))))
    report = run(config, report_dir=tmp_path / "r", example_db=tmp_path / "db")
    assert report.example_db is not None and report.example_db.replayed == []
    assert any(field in w and "dropped" in w for w in report.example_db.warnings or ()), report.example_db
    assert not [t for t in report.schedule if t.origin == "database"]


def test_a_fifo_or_device_in_the_folder_is_dropped_not_read(fake_model: Path, tmp_path: Path) -> None:
    config = parse_config(_config(fake_model, tmp_path))
    store = ExampleDB.open(tmp_path / "db", config)
    db = store._db()
    good = Trial(0, 0, 0, 0, (Filler(1, 3, 2, 0),))
    db.save(store.key.encode(), _encode(good))
    folder = db._key_path(store.key.encode())
    os.mkfifo(folder / "fifo")
    (folder / "zero").symlink_to("/dev/zero")
    assert store.stored(2) == [good]
    assert sum("FIFO" in w or "character device" in w for w in store.warnings) == 2


def _unwritable(store: ExampleDB) -> None:
    """The key's folder cannot be made: as root a chmod is no obstacle, a file in its place is."""
    folder = store._db()._key_path(store.key.encode())
    if os.geteuid() != 0:
        store.path.mkdir(parents=True)
        store.path.chmod(0o555)
    else:
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.write_text("in the way")


def test_a_folder_that_cannot_be_written_warns_and_claims_nothing_saved(fake_model: Path, tmp_path: Path) -> None:
    config = parse_config(_config(fake_model, tmp_path))
    store = ExampleDB.open(tmp_path / "db", config)
    _unwritable(store)
    try:
        report = run(config, report_dir=tmp_path / "r", example_db=tmp_path / "db")
    finally:
        store.path.chmod(0o755)
    failing = [d for d in report.divergences if d.check == "invariance"]
    assert failing, "the fake engine diverges from batch 3: trials to save"
    assert report.example_db is not None and report.example_db.saved == 0
    assert any("could not be saved" in w for w in report.example_db.warnings or ()), report.example_db
