"""What `oracle run` does around the runner so that every way a run ends leaves a true report.

Before any model is made the report folder is checked (exit 2 naming it) and its report replaced
by this run's "started" one (`complete: false`, exit 3): a run killed outright (SIGKILL,
`os._exit` in an engine) leaves that, never an earlier run's pass. When the run stops with an
exception before the runner wrote its own report (a signal while the model is made, a model or
context error), the started report is rewritten with that error and the exit code the process
ends with. Once the final report is written, signals are ignored so the exit code stays its.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

from oracle import __version__, signals
from oracle.config import Config
from oracle.errors import ConfigError
from oracle.plan import draw_seed
from oracle.render.files import report_dir_problem, report_is, stamp_of, write_report, write_started
from oracle.report import Report


def light_environment() -> dict[str, Any]:
    """The environment fields the report needs, without importing torch (a started report is early)."""
    from oracle.environment import DETERMINISM_VARS

    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "not installed"
    return {"oracle": __version__, "python": sys.version.split()[0], "platform": platform.platform(),
            "machine": platform.machine(), "torch": torch_version,
            "env": {k: os.environ[k] for k in DETERMINISM_VARS if k in os.environ}}


class RunGuard:
    """`with RunGuard(config, report_dir, seed) as guard: run(config, seed=guard.seed, ...)`."""

    def __init__(self, config: Config, report_dir: Path, seed: int | None, blame: str | None = None) -> None:
        problem = report_dir_problem(report_dir)
        if problem is not None:
            raise ConfigError(f"{blame}: {problem}") if blame else config.error(("report_dir",), problem)
        self.report_dir = report_dir
        self.seed = draw_seed(config, seed)
        self.report = Report(oracle_version=__version__, seed=self.seed, config=config.model_dump(mode="json"),
                             config_digest=config.digest(), environment=light_environment())
        self.stamp: tuple[int, int] | None = None

    def __enter__(self) -> RunGuard:
        # The announcement is inside the guard too: a signal that arrives as soon as it is read still
        # lands here, before `with` has a block whose exit would handle it.
        try:
            write_started(self.report, self.report_dir)
            self.stamp = stamp_of(self.report_dir)
            print(f"oracle: writing the report to {self.report_dir}", flush=True)
        except BaseException as e:
            self._stopped(e)
            raise
        return self

    def __exit__(self, typ: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if e is None:
            signals.settle()
        else:
            self._stopped(e)

    def _stopped(self, e: BaseException) -> None:
        """The run ended with `e`; rewrite the report unless the runner already wrote its own."""
        if self.stamp is not None and not report_is(self.report_dir, self.stamp):
            return
        self.report.mark_stopped(e)
        write_report(self.report, self.report_dir)
