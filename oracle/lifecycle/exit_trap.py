"""`os._exit` called by an engine or a `preload` module while a run is on: an error, never a silent exit.

`os._exit(0)` skips every `finally` and would end a run (and a pytest session) with exit 0 before
its report is written. While `trapped()` is active, a call from the main thread or the watchdog's
engine thread raises `ExitCalled` instead (a SystemExit: `except Exception` in engine code does not
swallow it), so the run stops with an engine error in its report; from any other thread, where the
run cannot be unwound, the process exits at once with 3, never the code asked for. A forked child (multiprocessing) exits as asked.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

from oracle.errors import EngineError

EXIT_ENGINE = EngineError.exit_code  # 3

# The watchdog runs engine calls on a thread of this name (oracle.lifecycle.watchdog).
ENGINE_THREAD = "oracle-engine"


class ExitCalled(SystemExit):
    """`os._exit(code)` was called during a run."""

    def __init__(self, code: int) -> None:
        super().__init__(EXIT_ENGINE)
        self.requested = code

    def __str__(self) -> str:
        return f"os._exit({self.requested!r})"


@contextmanager
def trapped() -> Iterator[None]:
    real = os._exit
    pid = os.getpid()

    def trap(status: int) -> NoReturn:
        code = status
        if os.getpid() != pid:  # a forked child ending itself
            real(code)
        thread = threading.current_thread()
        # The watchdog's engine thread hands what it raises to the run (an engine error, the report written).
        if thread is not threading.main_thread() and thread.name != ENGINE_THREAD:
            sys.stderr.write(f"oracle: error: os._exit({code!r}) was called in a thread during the run; "
                             "the report is left incomplete\n")
            sys.stderr.flush()
            real(EXIT_ENGINE)  # never the code asked for: 0 would pass, 1 would read as a failed check
        raise ExitCalled(code)

    os._exit = trap
    try:
        yield
    finally:
        os._exit = real
