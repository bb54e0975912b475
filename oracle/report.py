"""The Report: one pydantic model, written as report.json, read back by every reader.

`report.schema.json` is generated from these models (`python -m oracle.report` rewrites it; a
test checks the committed file is current), so the schema, the writer and the readers (replay,
localize, the GitHub Action's helpers, the renderers) cannot drift apart.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from oracle.localized_op import LocalizedOp
from oracle.redaction import redact_document, redact_tree, scrub_text
from oracle.report_sections import (
    EnvironmentDict,
    ExampleDbSection,
    HazardRecord,
    PostureRecord,
    SearchSection,
    ShardSection,
    ShardSlice,
)

Verdict = Literal["pass", "fail", "vacuous", "error", "skipped"]
Requirement = Literal["required", "warn", "report"]
# The verdicts that are a problem: they block a `required` check and warn at `warn` (oracle.render.verdict
# holds every rule the views derive from them).
PROBLEM_VERDICTS: tuple[Verdict, ...] = ("fail", "vacuous", "error")
# What made a divergence: the batch (what shared the target's passes), run-to-run nondeterminism (the
# target differed although it ran alone, its solo run or a trial differed from itself run again), or the
# sampler (another token sampled from bitwise equal logits), among others.
Cause = Literal["batch", "nondeterminism", "prefill", "prefix_cache", "kernels", "golden", "sampling", "instance"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_ENGINE = 3

SCHEMA_ID = "oracle-report/2"
MAX_REPORT_BYTES = 1 << 30  # a report.json larger than this is not one oracle wrote


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FillerRecord(_Model):
    seed: int = Field(ge=0)
    length: int = Field(ge=1)
    max_tokens: int = Field(ge=1)
    arrival_step: int = Field(ge=0)
    shared_prefix: int = Field(default=0, ge=0, description="leading tokens copied from the target's prompt")


class TrialRecord(_Model):
    """A trial as data: enough to run it again (`oracle replay REPORT --trial ID`)."""

    trial_id: int = Field(ge=0)
    target: int = Field(ge=0)
    position: int = Field(ge=0)
    target_arrival_step: int = Field(ge=0)
    fillers: list[FillerRecord]
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    origin: Literal["schedule", "database", "search", "shrink"] = Field(
        default="schedule", description="schedule (drawn by the seeded generator), database (a failing trial of an "
        "earlier run, replayed first), search (the guided search), shrink (a shrinker candidate)")
    parent: int | None = Field(default=None, description="for a shrink candidate: the trial it was reduced from")
    probe: str = Field(default="", description="a hazard probe's stratum and side (`fa3_kv_256:above`); empty "
                       "for a trial the generator drew")


def _absent(value: Any) -> bool:
    return value is None


class Strength(_Model):
    """What a pass rules out (oracle.checks.strength): with 0 divergences in N independent batched trials, a
    break that shows in a fraction p of such trials escapes with probability (1-p)^N, so at `level` its rate
    is below `rate_bound` = 1 - (1-level)^(1/N) (about 3/N at 95%, the rule of three)."""

    batched_trials: int = Field(ge=0, description="trials whose target shared a forward pass with another sequence")
    compositions: int = Field(ge=0, description="distinct pass compositions of those trials: the set of (num_seqs, "
                              "num_tokens, is_prefill, chunked, cached) over the target's passes")
    level: float = Field(gt=0, lt=1, description="the confidence the bound is stated at")
    rate_bound: float | None = Field(description="the rate of a break in batched trials that 0 divergences rule "
                                     "out at `level`; null with no batched trial")
    wanted: int | None = Field(default=None, exclude_if=_absent, description="schedule.confidence: the batched "
                               "trials its rate needs at its level")

    def line(self) -> str:
        """`15 batched; 12 compositions; rules out a break in >= 18% of batched trials (95%)`."""
        if self.rate_bound is None:
            return "no batched trial: rules out nothing"
        kinds = "composition" if self.compositions == 1 else "compositions"
        return (f"{self.batched_trials} batched; {self.compositions} {kinds}; rules out a break in "
                f">= {_percent(self.rate_bound)} of batched trials ({_percent(self.level)})")


def _percent(x: float) -> str:
    """0.181 -> `18%`, 0.0495 -> `5%`, 0.0031 -> `0.31%`."""
    return f"{x * 100:.0f}%" if x >= 0.01 else f"{x * 100:.2g}%"


class CheckResult(_Model):
    """One check's verdict. `requirement`: required | warn | report."""

    name: str
    requirement: str
    verdict: Verdict
    trials: int = Field(default=0, ge=0)
    divergent: int = Field(default=0, ge=0)
    evidence: dict[str, Any] = Field(default_factory=dict)
    message: str = ""
    strength: Strength | None = Field(default=None, exclude_if=_absent, description="a pass over batched "
                                      "trials: what it rules out (absent where the check does not say)")

    @property
    def blocks(self) -> bool:
        """True when this verdict makes the run fail (exit 1)."""
        return self.requirement == "required" and self.verdict in PROBLEM_VERDICTS

    # One constructor per verdict, so a check states its outcome by name and never spells a verdict string.
    @classmethod
    def passed(cls, name: str, requirement: str, *, message: str, trials: int = 0, divergent: int = 0,
               evidence: dict[str, Any] | None = None, strength: Strength | None = None) -> CheckResult:
        """`strength`: what the pass rules out, its line appended to the message (every view shows it)."""
        if strength is not None:
            message = f"{message}; {strength.line()}"
        return cls._of("pass", name, requirement, message, trials, divergent, evidence).model_copy(
            update={"strength": strength})

    @classmethod
    def failed(cls, name: str, requirement: str, *, message: str, trials: int = 0, divergent: int = 0,
               evidence: dict[str, Any] | None = None) -> CheckResult:
        return cls._of("fail", name, requirement, message, trials, divergent, evidence)

    @classmethod
    def vacuous(cls, name: str, requirement: str, *, message: str, trials: int = 0, divergent: int = 0,
                evidence: dict[str, Any] | None = None) -> CheckResult:
        return cls._of("vacuous", name, requirement, message, trials, divergent, evidence)

    @classmethod
    def skipped(cls, name: str, requirement: str, *, message: str, trials: int = 0, divergent: int = 0,
                evidence: dict[str, Any] | None = None) -> CheckResult:
        return cls._of("skipped", name, requirement, message, trials, divergent, evidence)

    @classmethod
    def error(cls, name: str, requirement: str, *, message: str, trials: int = 0, divergent: int = 0,
              evidence: dict[str, Any] | None = None) -> CheckResult:
        return cls._of("error", name, requirement, message, trials, divergent, evidence)

    @classmethod
    def _of(cls, verdict: Verdict, name: str, requirement: str, message: str, trials: int, divergent: int,
            evidence: dict[str, Any] | None) -> CheckResult:
        return cls(name=name, requirement=requirement, verdict=verdict, trials=trials, divergent=divergent,
                   evidence=evidence if evidence is not None else {}, message=message)


class DivergenceRecord(_Model):
    """One divergence: which check, target and trial; where it starts, how big, and what caused it."""

    check: str
    mode: Literal["invariant", "production"]
    target: str
    trial_id: int | None
    trial: TrialRecord | None
    request_id: str
    step: int = Field(ge=0)
    kind: Literal["token", "logprob", "logits", "length"]
    expected_token: int | None
    actual_token: int | None
    expected_logprob: float | None
    actual_logprob: float | None
    ulp: int | None = Field(default=None, ge=0)
    max_abs_logits_diff: float | None = None
    reference_margin: float | None = None
    near_tie: bool | None = None
    first_token_step: int | None = None
    cause: Cause = "batch"
    evidence: dict[str, Any] = Field(default_factory=dict)
    localized_op: LocalizedOp | None = None

    @property
    def shrunk(self) -> bool:
        return bool(self.evidence.get("shrunk"))


class ProbeNotFormed(_Model):
    probe: str = Field(description="the probe and side, `pass_tokens=48:above`")
    limit: str = Field(description="the engine's or model's limit that ruled it out")


class HazardProbesRecord(_Model):
    """A known hazard the run's invariant posture matched: the probes that cross its threshold and what they did."""

    id: str
    match: Literal["matches", "possible"]
    threshold: str = ""
    probes: list[str] = Field(default_factory=list, description="the hazard's probes (`fa3_kv_256`, `pass_tokens=48`)")
    sides: list[str] = Field(default_factory=list, description="probe sides the schedule held")
    crossed_by: list[int] = Field(default_factory=list, description="invariant trials that crossed the threshold")
    not_formed: list[ProbeNotFormed] = Field(default_factory=list)
    untested: str = Field(default="", description="why no trial crossed the threshold; a matched hazard left "
                          "untested makes invariance vacuous")


class VarianceOpRecord(_Model):
    """One op that made production batch-variant: where drifting trials' first diverging op was."""

    module: str = Field(description="module path with layer numbers as *, e.g. model.layers.*.mlp.down_proj")
    module_class: str = Field(description="the module's own name, e.g. down_proj")
    op: str = Field(description="the op, e.g. _C.onednn_mm.default")
    op_class: str = Field(default="other", description="attention, matmul, norm, sampling, communication, "
                          "kv-cache write or other")
    status: str = Field(default="localized", description="as the localized op's: localized, kv_state, "
                        "after_capture, inconclusive")
    trials: list[int] = Field(default_factory=list, description="drifting trials localized here")
    layers: list[int] = Field(default_factory=list)
    confirmation: dict[str, int] = Field(default_factory=dict, description="confirmed / not reproduced alone / "
                                         "not checked -> trials")
    follows: dict[str, dict[str, list[Any]]] = Field(
        default_factory=dict, description="launch quantities that differed between the solo and the drifting "
        "call: {name: {solo: [values], drifting: [values]}} (rows: M of a matmul or the packed query length)")
    first_at: str = Field(default="", description="the smallest drifting value of the quantity the divergence "
                          "followed, e.g. `M >= 2`")

    @property
    def key(self) -> str:
        """How a golden file and a changed map name it: `model.layers.*.mlp.down_proj _C.onednn_mm.default`."""
        return f"{self.module} {self.op}" + ("" if self.status == "localized" else f" ({self.status})")


class VarianceMap(_Model):
    """Production's batch variance by module and op: every drifting trial localized (or why not), aggregated."""

    localize: Literal["first", "all"]
    drifting_trials: int = Field(default=0, ge=0, description="production trials that diverged from production solo")
    localized: int = Field(default=0, ge=0, description="of them, localized to an op")
    ops: list[VarianceOpRecord] = Field(default_factory=list, description="most trials first")
    classes: dict[str, int] = Field(default_factory=dict, description="op class -> drifting trials localized "
                                    "there (every class, 0 included)")
    not_localized: dict[str, str] = Field(default_factory=dict, description="trial id -> why it names no op")


class Report(_Model):
    oracle_version: str
    seed: int = Field(ge=0)
    config: dict[str, Any]
    config_digest: str = Field(pattern="^[0-9a-f]{64}$")
    environment: EnvironmentDict = Field(default_factory=dict, description="where the run ran: versions, the "
                                         "machine, the engines per mode, their posture and the hazards it matched")
    checks: list[CheckResult] = Field(default_factory=list)
    divergences: list[DivergenceRecord] = Field(default_factory=list)
    timings: dict[str, float] = Field(default_factory=dict)
    schedule: list[TrialRecord] = Field(default_factory=list, description="every trial run, replayable by id")
    coverage: dict[str, int] = Field(default_factory=dict, description="condition -> trials that hit it")
    search: SearchSection = Field(default=None, description="the guided search (schedule.search): trials asked "
                                  "and run, the hypothesis seed, the best value of each target, failing search "
                                  "trials; `{}` without one")
    example_db: ExampleDbSection = Field(default=None, description="the example database (--db): path, key, "
                                         "trials replayed first, saved and deleted; `{}` without one")
    shard: ShardSection = Field(default=None, description="`oracle run --shard i/N`: index, count, schedule_size "
                                "and this shard's trial ids; its checks cover those trials only and it exits 0 once "
                                "complete: `oracle merge` gives the run's verdict. For a merged report: the shards "
                                "merged; `{}` for a run that was not sharded")
    hazard_probes: list[HazardProbesRecord] = Field(default_factory=list, description="known hazards the "
                                                    "invariant posture matched, the trials that crossed each")
    variance_map: VarianceMap | None = Field(default=None, description="checks.drift.localize: production's "
                                             "batch-variant ops, by module and op")
    error: str | None = None
    complete: bool = False
    # The exit code `error` stands for when it is not an engine error (3): 2 for a config or model
    # error, 130/143 for SIGINT/SIGTERM. Written as report.json's `exit_code`, read back from it.
    _error_exit_code: int | None = PrivateAttr(default=None)
    # The secret values `config` held before it was redacted (see oracle.redaction): scrubbed from
    # every string the report writes. Never written.
    _secrets: set[str] = PrivateAttr(default_factory=set)

    @model_validator(mode="after")
    def _redact_config(self) -> Report:
        """`config` is held redacted from the start, so no view or file can show a secret of it; the
        digest was computed by the caller from the real config."""
        found: set[str] = set()
        self.config = redact_tree(self.config, found)
        self._secrets |= found
        return self

    def public(self) -> Report:
        """A copy for showing or writing: the config and environment redacted, and every message,
        the error and the findings scrubbed of secrets (see `to_dict`)."""
        data = self.to_dict()
        data.pop("exit_code")
        copy = Report.model_validate(data)
        copy._error_exit_code, copy._secrets = self._error_exit_code, set(self._secrets)
        return copy

    def exit_code(self) -> int:
        """The process's exit code for this report (written as `exit_code`); a report that is not complete
        never reads as a pass: 0 every required check passed, 1 one failed or was vacuous, else the error's."""
        if self.error is not None:
            return self._error_exit_code if self._error_exit_code is not None else EXIT_ENGINE
        if not self.complete:
            return EXIT_ENGINE
        if isinstance(self.shard, ShardSlice):
            return EXIT_OK  # one shard's slice: its results are whole; the merged report holds the verdict
        return EXIT_FAILED if any(c.blocks for c in self.checks) else EXIT_OK

    def set_error(self, message: str, exit_code: int = EXIT_ENGINE) -> None:
        """Record why the run stopped early (the report stays `complete: false`)."""
        self.error = scrub_text(message, self._secrets)
        self._error_exit_code = exit_code
        self.complete = False

    def mark_stopped(self, e: BaseException) -> None:
        """Record an exception that stopped the run: a signal (130/143), an OracleError (its code),
        or anything else (3), with the matching exit code."""
        from oracle.errors import OracleError, exit_called
        from oracle.lifecycle.signals import describe, exit_code_of

        if isinstance(e, KeyboardInterrupt):
            self.set_error(describe(e), exit_code_of(e))
        elif isinstance(e, OracleError):
            self.set_error(str(e), e.exit_code)
        elif isinstance(e, SystemExit):
            # oracle.lifecycle.exit_trap.ExitCalled says which exit it was (os._exit); a plain one is sys.exit
            self.set_error(f"{exit_called(e)} was called during the run", EXIT_ENGINE)
        else:
            self.set_error(f"{type(e).__name__}: {e}", EXIT_ENGINE)

    @property
    def partial(self) -> bool:
        return not self.complete

    @property
    def posture(self) -> PostureRecord | None:
        """`environment.posture`: the engines' posture per mode (None before an engine ran)."""
        posture = self.environment.get("posture")
        return None if posture is None else PostureRecord.model_validate(posture)

    @property
    def hazards(self) -> list[HazardRecord]:
        """`environment.hazards`: the known hazards the invariant posture matched."""
        return [HazardRecord.model_validate(h) for h in self.environment.get("hazards") or ()]

    def check(self, name: str) -> CheckResult | None:
        return next((c for c in self.checks if c.name == name), None)

    def trial(self, trial_id: int) -> TrialRecord | None:
        return next((t for t in self.schedule if t.trial_id == trial_id), None)

    def to_dict(self) -> dict[str, Any]:
        """report.json's content: secrets redacted (the config and environment by structure, every other
        string scrubbed of the config's secret values and of token-shaped text; oracle.redaction)."""
        data = redact_document(self.model_dump(mode="json"), ("config", "environment"), verbatim=("config",),
                               secrets=self._secrets)
        return {key: data[key] for key in type(self).model_fields} | {"exit_code": self.exit_code()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def write(self, report_dir: Path, views: Sequence[Callable[[Report, Path], Any]] = (), *,
              final: bool = True) -> Path:
        """The views' formats, then `report_dir/report.json` (never older than they), each file atomic.

        SIGINT/SIGTERM are held until all are written. `final`: the run is over (done or stopping),
        so a signal arriving meanwhile is dropped rather than raised (raising then would make the
        exit code disagree with the report).
        """
        from oracle.lifecycle.signals import deferred

        with deferred(raise_after=not final):
            report_dir.mkdir(parents=True, exist_ok=True)
            for view in views:
                view(self, report_dir)
            path = report_dir / "report.json"
            write_atomic(path, self.to_json())
            return path


def write_atomic(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to a temporary name beside `path`, flush it to disk, then rename it over `path`."""
    data = text.encode("utf-8")
    write_atomic_with(path, lambda f: f.write(data))


def write_atomic_with(path: Path, write: Callable[[BinaryIO], Any]) -> None:
    """`write(f)` into a temporary file beside `path`, flushed to disk, then renamed over `path`."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def load_report(path: Path) -> Report:
    """Read a report.json; ConfigError (exit 2) naming the file when it is missing, too large, not JSON,
    nested too deeply or not an oracle report, and naming the field that is wrong."""
    from oracle.errors import ConfigError

    data = _report_json(path)
    code = data.pop("exit_code", None)
    try:
        report = Report.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(x) for x in err["loc"])
        raise ConfigError(f"{path}: not a report of this oracle version ({field}: {err['msg']})") from e
    except RecursionError as e:
        raise ConfigError(f"{path}: not an oracle report.json (nested too deeply)") from e
    if report.error is not None and isinstance(code, int) and not isinstance(code, bool):
        report._error_exit_code = code
    return report


def _report_json(path: Path) -> dict[str, Any]:
    """report.json's top-level object, read within MAX_REPORT_BYTES; ConfigError naming the file otherwise."""
    from oracle.errors import ConfigError
    from oracle.files import read_regular

    try:
        data = json.loads(read_regular(path, MAX_REPORT_BYTES, "report.json").decode("utf-8"))
    except RecursionError as e:
        raise ConfigError(f"{path}: not an oracle report.json (JSON nested too deeply)") from e
    except ValueError as e:  # not UTF-8, not JSON, an integer of thousands of digits
        raise ConfigError(f"{path}: not an oracle report.json ({_first_line(e)})") from e
    if not isinstance(data, dict) or "config" not in data:
        raise ConfigError(f"{path}: not an oracle report.json")
    return data


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return (lines[0] if lines else type(e).__name__)[:200]


def report_schema() -> dict[str, Any]:
    schema = Report.model_json_schema(mode="serialization")
    schema["properties"]["exit_code"] = {"type": "integer", "description": "the process's exit code"}
    schema["required"] = [*schema.get("required", []), "exit_code"]
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID,
            "title": "oracle report.json", **schema}


if __name__ == "__main__":
    out = Path(__file__).with_name("report.schema.json")
    out.write_text(json.dumps(report_schema(), indent=2) + "\n")
    print(f"wrote {out}")
