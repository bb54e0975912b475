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
from dataclasses import dataclass, field, replace
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


# A stored trial is a trial; its JSON is a few hundred bytes per filler. An entry larger than this is
# not one oracle wrote (and is not read: a FIFO or /dev/zero in the folder is refused the same way).
MAX_ENTRY_BYTES = 4 << 20


def _latest_arrival(schedule: Sequence[Trial]) -> int:
    """The latest step any target or filler of the schedule arrives at (0 for none)."""
    return max([0, *(f.arrival_step for t in schedule for f in t.fillers),
                *(t.target_arrival_step for t in schedule)])


@dataclass(frozen=True)
class Limits:
    """The most a trial of this run can ask: the config's ranges, widened to what this run's own
    schedule drew (hazard probes may reach past the ranges). A stored trial asking more (a filler of
    two billion tokens) is not this run's and is dropped, never run into an engine timeout."""

    batch_size: int
    filler_len: int
    filler_max_tokens: int
    arrival_step: int
    budget: int | None

    @staticmethod
    def of(config: Config) -> Limits:
        s = config.schedule
        return Limits(s.batch_size[1], s.filler_len[1], s.filler_max_tokens[1], s.arrival_step[1],
                      None if s.max_num_batched_tokens is None else s.max_num_batched_tokens[1])

    @staticmethod
    def drawn(schedule: Sequence[Trial]) -> Limits:
        fillers = [f for t in schedule for f in t.fillers]
        budgets = [t.max_num_batched_tokens for t in schedule if t.max_num_batched_tokens is not None]
        return Limits(max(t.batch_size for t in schedule), max((f.length for f in fillers), default=0),
                      max((f.max_tokens for f in fillers), default=0), _latest_arrival(schedule),
                      max(budgets) if budgets else None)

    def widened(self, other: Limits) -> Limits:
        budgets = [b for b in (self.budget, other.budget) if b is not None]
        return Limits(max(self.batch_size, other.batch_size), max(self.filler_len, other.filler_len),
                      max(self.filler_max_tokens, other.filler_max_tokens),
                      max(self.arrival_step, other.arrival_step), max(budgets) if budgets else None)

    def excess(self, t: Trial) -> str | None:
        """What of `t` is over the limits (`filler length 2,000,000,000 > 32`), or None."""
        checks = [("batch size", t.batch_size, self.batch_size),
                  ("target arrival step", t.target_arrival_step, self.arrival_step)]
        checks += [(name, v, limit) for f in t.fillers for name, v, limit in (
            ("filler length", f.length, self.filler_len), ("filler max_tokens", f.max_tokens, self.filler_max_tokens),
            ("filler arrival step", f.arrival_step, self.arrival_step))]
        if t.max_num_batched_tokens is not None:
            checks.append(("token budget", t.max_num_batched_tokens, self.budget or 0))
        return next((f"{name} {v:,} > {limit:,}" for name, v, limit in checks if v > limit), None)


@dataclass
class ExampleDB:
    """Failing trials under one run's key, in a hypothesis example database at `path`."""

    path: Path
    key: str
    limits: Limits | None = None
    # What the report's `example_db.warnings` says: entries dropped, trials that could not be saved.
    warnings: list[str] = field(default_factory=list)

    @staticmethod
    def open(path: Path, config: Config) -> ExampleDB:
        if path.exists() and not path.is_dir():
            raise ConfigError(f"--db {path}: not a folder (the example database is a folder)")
        return ExampleDB(path, db_key(config), Limits.of(config))

    def _fetch(self, db: Any, key: bytes) -> list[bytes]:
        """The entries under `key`, each read bounded and from a regular file only (oracle.files): hypothesis'
        own fetch reads whatever the folder holds, a FIFO (forever) or a link to /dev/zero (all memory)."""
        from oracle.files import read_regular

        folder = db._key_path(key)
        if not folder.is_dir():
            return []
        blobs = []
        for entry in sorted(folder.iterdir()):
            try:
                blobs.append(read_regular(entry, MAX_ENTRY_BYTES, "example database entry"))
            except ConfigError as e:
                self.warnings.append(f"--db: entry dropped: {e}")
        return blobs

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
        for blob in self._fetch(db, key):
            trial = _decode(blob)
            if trial is None or not 0 <= trial.target < n_targets or not 0 <= trial.position <= len(trial.fillers):
                db.delete(key, blob)
                continue
            excess = None if self.limits is None else self.limits.excess(trial)
            if excess is not None:
                self.warnings.append(f"--db: a stored trial asks more than this run's schedule can ({excess}); "
                                     "dropped")
                db.delete(key, blob)
                continue
            out[blob] = trial
        return [out[b] for b in sorted(out, key=lambda b: (_size(out[b]), b))]

    def replayed(self, n_targets: int, first_id: int, schedule: Sequence[Trial] = ()) -> tuple[Trial, ...]:
        """The stored trials as this run's, ids from `first_id`, origin `database`; those asking more than
        `schedule` (this run's trials) or the config's ranges can are dropped with a warning."""
        if schedule and self.limits is not None:
            self.limits = self.limits.widened(Limits.drawn(schedule))
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
        # hypothesis' save drops an OSError (a read-only folder, a full disk) silently: count what is on
        # disk, so the report never claims a trial saved that is not.
        on_disk = set(self._fetch(db, key)) if saved else set()
        stored = sum(blob in on_disk for blob, _ in saved)
        if stored < len(saved):
            self.warnings.append(f"--db {self.path}: {len(saved) - stored} of {len(saved)} failing trials could not "
                                 "be saved (a read-only folder or a full disk?)")
        done: dict[str, Any] = {"saved": stored, "deleted": deleted}
        if self.warnings:
            done["warnings"] = list(self.warnings)
        return done
