"""Progress hooks a run calls; the CLI's console and CI heartbeat implement them."""

from __future__ import annotations


class Observer:
    """The default does nothing."""

    def seed(self, seed: int) -> None: ...

    def phase(self, name: str, total: int) -> None: ...

    def advance(self, divergences: int) -> None: ...

    def done(self) -> None: ...

    def outcome(self, message: str) -> None:
        """What the running phase came to, in words (said when it is done, instead of its count)."""

    def warn(self, message: str) -> None: ...
