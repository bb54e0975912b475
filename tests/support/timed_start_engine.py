"""The fake engine with `start_seconds` (TimesItsStart): where its start went, as an engine reports it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fake_engine import FakeEngine

from oracle.engines.contract import Mode


class TimedStartEngine(FakeEngine):
    def __init__(self, model: Path, mode: Mode, **kwargs: Any) -> None:
        super().__init__(model, mode, **kwargs)
        # Two parts kept; a NaN, a negative and a flag dropped.
        self.start_seconds = {"load": 0.25, "warm": 1.5, "nan": math.nan, "back": -1.0, "flag": True}
