"""`oracle*.yaml` / `oracle*.yml` files as pytest items: one item per check the config turns on.

The file's config is read at collection (a config error is a one-line collection error); it is
run once, when its first item runs, and every item of the file judges its check from that
Report: a blocking verdict (fail, vacuous, error at `required`) fails, a warning (the same at `warn`, a
report-level gate that failed or errored) warns; anything else passes. Under pytest-xdist each worker that gets an item of the file
runs the config itself (same seed, same result); `--dist loadfile` keeps a file on one worker.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from oracle.errors import OracleError
from oracle.pytest_plugin.failure import describe_failure
from oracle.pytest_plugin.runs import STATE, OracleSession, OracleWarning
from oracle.render.verdict import gate

if TYPE_CHECKING:
    from oracle.config import Config
    from oracle.report import Report


def is_oracle_config(path: Path) -> bool:
    return path.name.startswith("oracle") and path.suffix in (".yaml", ".yml")


def check_names(config: Config) -> list[str]:
    """The checks the run will judge, in report order (every check not turned off)."""
    checks = config.checks
    return [name for name in type(checks).model_fields if getattr(checks, name).requirement != "off"]


class OracleCheckFailure(Exception):
    """A check item failed; its message is the whole report (no traceback)."""


class OracleFile(pytest.File):
    """An oracle config; its Report (or the error that stopped it) is cached on the node."""

    oracle_config: Config
    _outcome: tuple[Report, Path] | OracleError | None = None

    def collect(self) -> Iterator[OracleCheckItem]:
        from oracle.config import load_config

        trials = self.config.stash[STATE].trials
        try:
            self.oracle_config = load_config(self.path, {"schedule.trials": trials} if trials else None)
        except OracleError as e:
            raise self.CollectError(str(e)) from None
        for name in check_names(self.oracle_config):
            yield OracleCheckItem.from_parent(self, name=name, check=name)

    def outcome(self) -> tuple[Report, Path]:
        """Run the config the first time an item asks; later items get the same Report."""
        if self._outcome is None:
            session = OracleSession(self.config.stash[STATE])
            try:
                self._outcome = self._run_once(session)
            except OracleError as e:
                self._outcome = e
            except Exception as e:  # cached too: the next item of this file must not run the config again
                self._outcome = OracleError(f"{type(e).__name__}: {e}")
            except SystemExit as e:  # an engine's sys.exit / os._exit: an engine error, once
                self._outcome = OracleError(f"the run stopped: {e} was called")
        if isinstance(self._outcome, OracleError):
            raise OracleCheckFailure(f"oracle: {self._outcome}")
        return self._outcome

    def _run_once(self, session: OracleSession) -> tuple[Report, Path]:
        """Run the config, once per session: under pytest-xdist the file's items can go to several
        workers; the first to ask runs it (holding a lock beside its report folder), the others read
        the report it wrote in this session (`testrunuid`, the same on every worker)."""
        import fcntl

        from oracle.report import load_report

        label = self.nodeid
        run_dir = session.run_dir_for(label)
        run_id = getattr(self.config, "workerinput", {}).get("testrunuid")
        if run_id is None:
            return session.run_config(self.oracle_config, label, str(self.path), run_dir=run_dir, warn=False)
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(run_dir.parent / f".{run_dir.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            marker = run_dir.parent / f".{run_dir.name}.run"
            if marker.is_file() and marker.read_text() == str(run_id):
                return load_report(run_dir / "report.json"), run_dir / "report.json"
            outcome = session.run_config(self.oracle_config, label, str(self.path), run_dir=run_dir, warn=False)
            marker.write_text(str(run_id))
            return outcome


class OracleCheckItem(pytest.Item):
    """`oracle-x.yaml::invariance`: one check of the file's run."""

    def __init__(self, *, check: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.check = check

    def runtest(self) -> None:
        assert isinstance(self.parent, OracleFile)
        report, path = self.parent.outcome()
        result = report.check(self.check)
        if report.error:
            checks = [result] if result else []
            raise OracleCheckFailure(describe_failure(report, path, checks))
        if result is None:
            raise OracleCheckFailure(f"oracle: {self.check} is not in the report ({path})")
        outcome = gate(result)
        if outcome == "skip":
            pytest.skip(f"oracle {self.check}: {result.message}")
        if outcome == "fail":
            raise OracleCheckFailure(describe_failure(report, path, [result]))
        if outcome == "warn":
            warnings.warn_explicit(OracleWarning(describe_failure(report, path, [result])), OracleWarning,
                                   str(self.path), 1)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str | Any:
        if isinstance(excinfo.value, OracleCheckFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"oracle {self.path.name}::{self.check}"
