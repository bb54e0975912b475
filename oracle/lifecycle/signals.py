"""SIGINT and SIGTERM: both stop the run the same way, as an `Interrupted` exception in the main thread.

`Interrupted` is a KeyboardInterrupt, so every `finally` and `except KeyboardInterrupt` already on
the way out (closing engines, writing the partial report) runs for SIGTERM too. Its `exit_code`
is 128 + the signal number: 130 for SIGINT, 143 for SIGTERM. While `deferred()` is active
(writing a report), a signal is held and raised when the block ends, so a report is never cut
in half by the signal that asked for it.

A signal that lands where Python swallows exceptions (a weakref callback such as the import lock's
cleanup, a `__del__`, the garbage collector) would be lost: its `Interrupted` goes to
`sys.unraisablehook` and the run goes on. The hook installed here takes it instead, says nothing, and
sends the signal again from another thread, so it is raised once that frame has returned.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

HANDLED = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal; `exit_code` is 128 + its number."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        self.signum = signum
        super().__init__(self.describe())

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def describe(self) -> str:
        return f"interrupted ({signal.Signals(self.signum).name})"


def exit_code_of(e: BaseException) -> int:
    """130 for a plain KeyboardInterrupt (Ctrl-C outside our handler), else the signal's code."""
    return e.exit_code if isinstance(e, Interrupted) else 128 + signal.SIGINT


def describe(e: BaseException) -> str:
    return e.describe() if isinstance(e, Interrupted) else "interrupted (SIGINT)"


_pending: list[int] = []
_defer_depth = 0


def _handler(signum: int, frame: FrameType | None) -> None:
    if _settled:
        return
    if _defer_depth:
        _pending.append(signum)
        return
    raise Interrupted(signum)


def _swallowed(unraisable: Any) -> None:
    """`sys.unraisablehook` while signals are handled: an `Interrupted` raised where Python ignores exceptions
    is delivered again (see the module's docstring); anything else goes to the hook that was there."""
    e = unraisable.exc_value
    if not isinstance(e, Interrupted):
        _previous_hook(unraisable)
        return
    if not _settled:
        # From another thread, a moment later: raised here, in the hook, it would be swallowed again.
        again = threading.Timer(0.01, _send_again, (e.signum,))
        again.daemon = True
        again.start()


def _send_again(signum: int) -> None:
    """The signal again, unless its handler is no longer ours (the block that handled it has ended)."""
    if signal.getsignal(signum) is _handler:
        signal.raise_signal(signum)


_previous_hook = sys.unraisablehook
_hooked = 0  # blocks that handle signals, nested: the hook is ours while any is open


def install() -> dict[int, Any]:
    """(Re)arm: route SIGINT and SIGTERM to `Interrupted`; returns the previous handlers (for `restore`).

    A no-op outside the main thread (Python allows handlers only there).
    """
    global _settled, _previous_hook, _hooked
    _settled = False
    _pending.clear()
    if threading.current_thread() is not threading.main_thread():
        return {}
    _hooked += 1
    if sys.unraisablehook is not _swallowed:
        _previous_hook, sys.unraisablehook = sys.unraisablehook, _swallowed
    return {s: signal.signal(s, _handler) for s in HANDLED}


def restore(previous: dict[int, Any]) -> None:
    """Put back what `install` replaced: the handlers it returned, and the unraisable hook once the outermost
    block ends."""
    global _hooked
    for s, h in previous.items():
        signal.signal(s, h)
    if previous:
        _hooked -= 1
        if not _hooked and sys.unraisablehook is _swallowed:
            sys.unraisablehook = _previous_hook


@contextmanager
def handled(ignore_when_settled: bool = False) -> Iterator[None]:
    """Route SIGINT/SIGTERM to `Interrupted` in the block. `ignore_when_settled`: the process exits right
    after the block (the console script), so once the final report is written the signals stay ignored
    rather than restored to the default action, which would kill it with 143 after a report that says 0."""
    previous = install()
    try:
        yield
    finally:
        if ignore_when_settled and _settled and threading.current_thread() is threading.main_thread():
            previous = {s: signal.SIG_IGN for s in previous}
        restore(previous)


def hold() -> None:
    """Hold SIGINT/SIGTERM until the matching `release()` (nests)."""
    global _defer_depth
    _defer_depth += 1


def release(raise_held: bool = True) -> None:
    """End one `hold()`; at the outermost, raise the first signal held (unless `raise_held` is False or
    the final report is written), else drop it."""
    global _defer_depth
    _defer_depth -= 1
    if not _defer_depth and _pending:
        signum = _pending[0]
        _pending.clear()
        if raise_held and not _settled:
            raise Interrupted(signum)


@contextmanager
def deferred(raise_after: bool = True) -> Iterator[None]:
    """Hold SIGINT/SIGTERM until the block ends, then raise the first one held.

    With `raise_after=False` a signal held is dropped: for the final report, written when the work
    is done (or already stopping), where raising would make the exit code disagree with it. When the
    block raises, its exception goes on and a signal held is dropped.
    """
    hold()
    try:
        yield
    except BaseException:
        release(raise_held=False)
        raise
    if not raise_after and _defer_depth == 1:
        # The final report is whole on disk: from here on a signal would make the exit code disagree
        # with it (143 for a report that says 0), so it is ignored, as after `settle()`.
        settle()
    release(raise_after)


_settled = False


def settle() -> None:
    """The final report is written: signals from now on are ignored, so the exit code stays its."""
    global _settled
    _settled = True
