"""The Report: plain data, written as JSON, and the exit code it implies."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Verdict = Literal["pass", "fail", "vacuous", "error", "skipped"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_ENGINE = 3


@dataclass
class CheckResult:
    """One check's verdict. `requirement`: required | warn | report | off."""

    name: str
    requirement: str
    verdict: Verdict
    trials: int = 0
    divergent: int = 0
    evidence: dict[str, Any] = field(default_factory=dict)
    message: str = ""

    @property
    def blocks(self) -> bool:
        """True when this verdict makes the run fail (exit 1)."""
        return self.requirement == "required" and self.verdict in ("fail", "vacuous", "error")


@dataclass
class DivergenceRecord:
    """One divergence: which check, target and trial; where it starts and how big it is."""

    check: str
    mode: str
    target: str
    trial_id: int | None
    trial: dict[str, Any] | None
    request_id: str
    step: int
    kind: str
    expected_token: int | None
    actual_token: int | None
    expected_logprob: float | None
    actual_logprob: float | None
    ulp: int | None
    max_abs_logits_diff: float | None
    reference_margin: float | None
    near_tie: bool | None
    first_token_step: int | None
    evidence: dict[str, Any] = field(default_factory=dict)
    localized_op: str | None = None


@dataclass
class Report:
    oracle_version: str
    seed: int
    config: dict[str, Any]
    config_digest: str
    environment: dict[str, Any] = field(default_factory=dict)
    checks: list[CheckResult] = field(default_factory=list)
    divergences: list[DivergenceRecord] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    schedule: list[dict[str, Any]] = field(default_factory=list)  # every trial, replayable by trial_id
    error: str | None = None
    complete: bool = False
    # The exit code `error` stands for when it is not an engine error (3): 2 for a config or model
    # error, 130/143 for SIGINT/SIGTERM. Not written as such: report.json carries `exit_code`.
    error_exit_code: int | None = field(default=None, repr=False)

    def exit_code(self) -> int:
        """The process's exit code for this report; a report that is not complete never reads as a pass."""
        if self.error is not None:
            return self.error_exit_code if self.error_exit_code is not None else EXIT_ENGINE
        if not self.complete:
            return EXIT_ENGINE
        return EXIT_FAILED if any(c.blocks for c in self.checks) else EXIT_OK

    def set_error(self, message: str, exit_code: int = EXIT_ENGINE) -> None:
        """Record why the run stopped early (the report stays `complete: false`)."""
        self.error = message
        self.error_exit_code = exit_code
        self.complete = False

    def mark_stopped(self, e: BaseException) -> None:
        """Record an exception that stopped the run: a signal (130/143), an OracleError (its code),
        or anything else (3), with the matching exit code."""
        from oracle.errors import OracleError
        from oracle.signals import describe, exit_code_of

        if isinstance(e, KeyboardInterrupt):
            self.set_error(describe(e), exit_code_of(e))
        elif isinstance(e, OracleError):
            self.set_error(str(e), e.exit_code)
        elif isinstance(e, SystemExit):
            self.set_error(f"sys.exit({e.code!r}) was called during the run", EXIT_ENGINE)
        else:
            self.set_error(f"{type(e).__name__}: {e}", EXIT_ENGINE)

    @property
    def partial(self) -> bool:
        return not self.complete

    def check(self, name: str) -> CheckResult | None:
        return next((c for c in self.checks if c.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("error_exit_code")
        d["exit_code"] = self.exit_code()
        return d

    def write(self, report_dir: Path) -> Path:
        """Write `report_dir/report.json` atomically (a reader never sees half a report)."""
        report_dir.mkdir(parents=True, exist_ok=True)
        path = report_dir / "report.json"
        write_atomic(path, json.dumps(self.to_dict(), indent=2, default=_json_default) + "\n")
        return path


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to a temporary name beside `path`, flush it to disk, then rename it over `path`."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def load_report(path: Path) -> dict[str, Any]:
    from oracle.errors import ConfigError

    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: cannot read report ({e})") from e
    if not isinstance(data, dict) or "config" not in data:
        raise ConfigError(f"{path}: not an oracle report.json")
    return data
