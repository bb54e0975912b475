"""Progress hooks a run calls; the CLI's console and CI heartbeat implement them."""

from __future__ import annotations

from typing import Any


class Observer:
    """The default does nothing."""

    def seed(self, seed: int) -> None: ...

    def phase(self, name: str, total: int) -> None: ...

    def advance(self, divergences: int) -> None: ...

    def done(self) -> None: ...

    def outcome(self, message: str) -> None:
        """What the running phase came to, in words (said when it is done, instead of its count)."""

    def warn(self, message: str) -> None: ...


class Recorded(Observer):
    """What a mode run beside another reports, kept to be told to the run's observer later, call for call
    (`replay`), so the console hears both modes in the order of a sequential run."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def note(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))

    def seed(self, seed: int) -> None:
        self.note("seed", seed)

    def phase(self, name: str, total: int) -> None:
        self.note("phase", name, total)

    def advance(self, divergences: int) -> None:
        self.note("advance", divergences)

    def done(self) -> None:
        self.note("done")

    def outcome(self, message: str) -> None:
        self.note("outcome", message)

    def warn(self, message: str) -> None:
        self.note("warn", message)


def replay(calls: list[tuple[str, tuple[Any, ...]]], observer: Observer) -> None:
    """Tell `observer` what a `Recorded` heard, in order."""
    for name, args in calls:
        getattr(observer, name)(*args)
