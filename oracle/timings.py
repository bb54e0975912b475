"""Where a run's time went: seconds per phase (engine start, references, trials, repeats, shrink, ...).

A phase entered inside another pauses the outer one, so the phases of one clock add up to the time
spent under it and nothing is counted twice (a localization inside the prefix-cache check counts as
`localize`, not as `checks`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

# The phases in the order a run meets them; the report's timings are `{mode}_{phase}_s` and these run-wide
# ones: plan_s, judge_s, write_s, total_s (merge_s for `oracle merge`).
PHASES = ("engine_start", "references", "trials", "search", "repeats", "recheck", "shrink", "localize", "checks", "close",
          "second_instance", "tp_parity")  # the last two: a second engine, started after the first closed


class PhaseClock:
    """`with clock.phase("trials"): ...`; `clock.seconds` maps each phase to the seconds spent in it."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._stack: list[list[object]] = []  # [name, since] of each open phase, innermost last

    def _add(self, name: str, dt: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + dt

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        now = time.perf_counter()
        if self._stack:
            outer = self._stack[-1]
            self._add(str(outer[0]), now - float(outer[1]))  # type: ignore[arg-type]
        self._stack.append([name, now])
        try:
            yield
        finally:
            end = time.perf_counter()
            _, since = self._stack.pop()
            self._add(name, end - float(since))  # type: ignore[arg-type]
            if self._stack:
                self._stack[-1][1] = end


def rounded(seconds: dict[str, float], prefix: str = "") -> dict[str, float]:
    """`{prefix}{phase}_s` -> seconds to the millisecond, in PHASES order (others after)."""
    order = {p: i for i, p in enumerate(PHASES)}
    return {f"{prefix}{k}_s": round(v, 3) for k, v in sorted(seconds.items(), key=lambda kv: order.get(kv[0], 99))}
