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

    def exit_code(self) -> int:
        if self.error is not None:
            return EXIT_ENGINE
        return EXIT_FAILED if any(c.blocks for c in self.checks) else EXIT_OK

    def check(self, name: str) -> CheckResult | None:
        return next((c for c in self.checks if c.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["exit_code"] = self.exit_code()
        return d

    def write(self, report_dir: Path) -> Path:
        """Write `report_dir/report.json` atomically (a reader never sees half a report)."""
        report_dir.mkdir(parents=True, exist_ok=True)
        path = report_dir / "report.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, default=_json_default) + "\n")
        os.replace(tmp, path)
        return path


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
