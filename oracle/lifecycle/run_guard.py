"""What `oracle run` does around the runner so that every way a run ends leaves a true report.

Before any model is made the report folder is checked (exit 2 naming it) and its report replaced
by this run's "started" one (`complete: false`, exit 3): a run killed outright (SIGKILL,
`os._exit` in an engine) leaves that, never an earlier run's pass. When the run stops with an
exception before the runner wrote its own report (a signal while the model is made, a model or
context error), the started report is rewritten with that error and the exit code the process
ends with. Once the final report is written, signals are ignored so the exit code stays its.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import re
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

from oracle import __version__
from oracle.config import Config
from oracle.errors import ConfigError
from oracle.lifecycle import signals
from oracle.lifecycle.exit_trap import trapped
from oracle.plan import draw_seed
from oracle.render.escape import terminal_text
from oracle.render.files import ReportWriter, report_dir_problem
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
    """`with RunGuard(config, report_dir, seed) as guard: run(config, seed=guard.seed, writer=guard.writer, ...)`.

    `guard.writer` owns the report folder for the whole run. `adopt`: the run's child, whose parent
    wrote the started report already (it is taken over, not written again)."""

    def __init__(self, config: Config, report_dir: Path, seed: int | None, blame: str | None = None, *,
                 announce: bool = True, adopt: bool = False) -> None:
        problem = report_dir_problem(report_dir)
        if problem is not None:
            raise ConfigError(f"{blame}: {problem}") if blame else config.error(("report_dir",), problem)
        self.report_dir = report_dir
        self.seed = draw_seed(config, seed)
        self.report = Report(oracle_version=__version__, seed=self.seed, config=config.model_dump(mode="json"),
                             config_digest=config.digest(), environment=light_environment())
        self.writer = ReportWriter(report_dir)
        self.announce = announce
        self.adopt = adopt
        self._trap = trapped()

    def __enter__(self) -> RunGuard:
        # The announcement is inside the guard too: a signal that arrives as soon as it is read still
        # lands here, before `with` has a block whose exit would handle it.
        try:
            if self.adopt:
                self.writer.adopt(self.report)
            else:
                self.writer.started(self.report)
            if self.announce:
                print(terminal_text(f"oracle: writing the report to {self.report_dir}"), flush=True)
            self._trap.__enter__()
        except BaseException as e:
            self._stopped(e)
            raise
        return self

    def __exit__(self, typ: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self._trap.__exit__(None, None, None)
        if e is None:
            signals.settle()
        else:
            self._stopped(e)

    def _stopped(self, e: BaseException) -> None:
        """The run ended with `e`; rewrite the report unless the runner already wrote its own."""
        if isinstance(e, KeyboardInterrupt):
            e.report_dir = str(self.report_dir)  # type: ignore[attr-defined]  # read by the CLI's message
        self.writer.stopped(self.report, e)


def replace_stale_report(config_path: Path | None, report_dir: Path | None, e: BaseException) -> None:
    """The config could not be read, the command line was wrong (or a signal came meanwhile): an earlier
    run's report in the folder this run would have written is replaced by one that says why this run did
    not start, so a step that reads the folder afterwards never publishes an earlier run's verdict.

    The folder is `--report-dir`, else the config's `report_dir` as far as its text names one (a line
    `report_dir: DIR` of a file that is not valid YAML counts), else the default. Written only where a
    report.json is already there (nothing is created for a run that never started). `config_path`: None
    when the command line gave none.
    """
    folder = report_dir if report_dir is not None else _report_dir_of(config_path)
    if not (folder / "report.json").is_file():
        return
    if report_dir_problem(folder) is not None:
        return
    from oracle.config import MAX_CONFIG_BYTES
    from oracle.errors import ConfigError
    from oracle.files import read_regular

    try:  # bounded and regular-only: the config that failed may be a FIFO or a device
        raw = read_regular(config_path, MAX_CONFIG_BYTES, "config file") if config_path is not None else b""
    except ConfigError:
        raw = b""
    source = str(config_path) if config_path is not None else "(no config given)"
    report = Report(oracle_version=__version__, seed=0, config={"source": source},
                    config_digest=hashlib.sha256(raw).hexdigest(), environment=light_environment())
    report.mark_stopped(e)
    try:
        ReportWriter(folder).final(report)
    except OSError:
        return
    if isinstance(e, KeyboardInterrupt):
        e.report_dir = str(folder)  # type: ignore[attr-defined]


# A top-level `report_dir: DIR` line, read from a config that is not valid YAML.
_REPORT_DIR_LINE = re.compile(r"""^report_dir:[ \t]*(?:"([^"\n]+)"|'([^'\n]+)'|([^\s#'"][^#\n]*?))[ \t]*(?:#.*)?$""",
                              re.MULTILINE)


def _report_dir_of(config_path: Path | None) -> Path:
    """The folder the run would have written: the config's `report_dir` as far as its text can be read (the
    YAML, else a top-level `report_dir:` line), the default where it names none or cannot be read."""
    from oracle.config import Config

    default = Path(str(Config.model_fields["report_dir"].default))
    if config_path is None:
        return default
    try:
        from oracle.config import MAX_CONFIG_BYTES
        from oracle.files import read_regular

        text = read_regular(config_path, MAX_CONFIG_BYTES, "config file").decode("utf-8", errors="replace")
    except Exception:  # missing or unreadable: the error being reported says so
        return default
    try:
        import yaml

        data = yaml.safe_load(text)
        value = data.get("report_dir") if isinstance(data, dict) else None
    except Exception:  # malformed YAML: its own line may still name the folder
        found = _REPORT_DIR_LINE.search(text)
        value = next((g for g in found.groups() if g), None) if found else None
    return Path(value) if isinstance(value, str) and value and "\0" not in value else default
