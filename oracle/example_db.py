"""The example database: failing trials of earlier runs, replayed first (`oracle run --db PATH`).

As pytest's `--lf` and hypothesis' example database do: the trials that failed invariance last time
run before the schedule, and a trial that passes again is forgotten. The store is hypothesis'
`DirectoryBasedExampleDatabase` (a folder CI can cache; any hypothesis `ExampleDatabase` works, the
GitHub artifact database included), holding each trial as canonical JSON (without its id) under a
key of the run: the config's digest with the fields that only say how many trials to run and where
to write left out (schedule.trials, seed, repeat_trials, shrink budget, search, report_dir), and the
digest of the engine's kind and options (its posture, as far as the config says). Nothing is written
unless a path is given.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from oracle.config import Config
from oracle.errors import ConfigError
from oracle.schedule import Trial

# Schedule fields that say how many trials to run, not what a trial is: left out of the key.
_COUNT_FIELDS = ("trials", "seed", "repeat_trials", "shrink", "max_shrink_runs", "search")
# Failing trials saved per run at most (the smallest first).
MAX_SAVED = 16


def engine_digest(config: Config) -> str:
    """sha256 of the engine's kind and options: the posture as far as the config says."""
    return hashlib.sha256(json.dumps(config.engine.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()


def db_key(config: Config) -> str:
    data = config.model_dump(mode="json")
    data.pop("report_dir", None)
    for name in _COUNT_FIELDS:
        data["schedule"].pop(name, None)
    core = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
    return hashlib.sha256(f"oracle.example_db/1/{core}/{engine_digest(config)}".encode()).hexdigest()


def _encode(trial: Trial) -> bytes:
    data = trial.to_json()
    for name in ("trial_id", "origin", "parent"):
        data.pop(name)
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def _decode(blob: bytes) -> Trial | None:
    try:
        data = json.loads(blob)
        return Trial.from_json({**data, "trial_id": 0})
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def _size(t: Trial) -> tuple[int, ...]:
    return (t.batch_size, sum(f.length for f in t.fillers), sum(f.max_tokens for f in t.fillers))


@dataclass
class ExampleDB:
    """Failing trials under one run's key, in a hypothesis example database at `path`."""

    path: Path
    key: str

    @staticmethod
    def open(path: Path, config: Config) -> ExampleDB:
        if path.exists() and not path.is_dir():
            raise ConfigError(f"--db {path}: not a folder (the example database is a folder)")
        return ExampleDB(path, db_key(config))

    def _db(self) -> Any:
        from hypothesis.database import DirectoryBasedExampleDatabase

        return DirectoryBasedExampleDatabase(str(self.path))

    def stored(self, n_targets: int) -> list[Trial]:
        """The stored trials that fit this run (a target index it has), smallest first; unreadable ones
        are deleted."""
        if not self.path.is_dir():
            return []
        db, key = self._db(), self.key.encode()
        out: dict[bytes, Trial] = {}
        for blob in list(db.fetch(key)):
            trial = _decode(blob)
            if trial is None or not 0 <= trial.target < n_targets or not 0 <= trial.position <= len(trial.fillers):
                db.delete(key, blob)
                continue
            out[blob] = trial
        return [out[b] for b in sorted(out, key=lambda b: (_size(out[b]), b))]

    def replayed(self, n_targets: int, first_id: int) -> tuple[Trial, ...]:
        """The stored trials as this run's, ids from `first_id`, origin `database`."""
        return tuple(replace(t, trial_id=first_id + i, origin="database", parent=None)
                     for i, t in enumerate(self.stored(n_targets)))

    def update(self, failing: Sequence[Trial], passing: Iterable[Trial]) -> dict[str, int]:
        """Save `failing` (the smallest MAX_SAVED), forget `passing`; what was done, counted."""
        db, key = self._db(), self.key.encode()
        saved = sorted({_encode(t): t for t in failing}.items(), key=lambda kv: (_size(kv[1]), kv[0]))[:MAX_SAVED]
        keep = {blob for blob, _ in saved}
        deleted = 0
        for t in passing:
            blob = _encode(t)
            if blob not in keep:
                db.delete(key, blob)
                deleted += 1
        for blob, _ in saved:
            db.save(key, blob)
        return {"saved": len(saved), "deleted": deleted}
