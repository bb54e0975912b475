"""Known hazards: upstream breaks of batch invariance (hazards.yaml beside this module), matched to a run's posture and model.

A hazard matches when its engine and version range hold and every condition of `when` holds on the
invariant mode's posture (where invariance is claimed), the model's facts and the sampling. A
condition on a setting the engine did not report ("unknown") makes the hazard `possible`: the run
warns about it too, saying which settings it could not read. Matching is pure: the runner warns
before the engines start (declared posture), records the matches of the real posture in the report
(`environment.hazards`) and cites them on every invariant-mode divergence.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from oracle.config import error_text
from oracle.errors import ConfigError
from oracle.posture import UNKNOWN
from oracle.report_sections import HazardRecord, HazardStatus

Match = Literal["matches", "possible"]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# A condition's operators (`{op: arg}`), each a test of the reported value against its argument.
_CONDITION_OPS: dict[str, Callable[[Any, Any], bool | None]] = {
    "contains": lambda arg, value: str(arg).lower() in str(value).lower(),
    "min": lambda arg, value: _is_number(value) and value >= arg,
    "above": lambda arg, value: _is_number(value) and value > arg,
    "not": lambda arg, value: not _holds(arg, value),
}
_OPS = tuple(_CONDITION_OPS)


@dataclass(frozen=True)
class ProbeSpec:
    """A probe a hazard asks for: a named stratum (`fa3_kv_256`), or one with its threshold
    (`pass_tokens` at 48: a pass of 48 tokens below, 49 above; `pass_bytes`: the same in bytes of hidden state)."""

    name: str
    at: int | None = None

    @property
    def label(self) -> str:
        """How trials and the report name it: `fa3_kv_256`, `pass_tokens=48`."""
        return self.name if self.at is None else f"{self.name}={self.at}"


@dataclass(frozen=True)
class Hazard:
    id: str
    title: str
    engine: str
    version_min: str | None
    version_below: str | None
    when: dict[str, Any]
    threshold: str
    references: tuple[str, ...]
    status: HazardStatus
    probes: tuple[ProbeSpec, ...] = ()  # the strata that put trials on both sides of the threshold
    source: str = "hazards.yaml"  # the file that declared it (the shipped table, or the config's `hazards`)

    def cite(self) -> str:
        """`id (reference, ...)`: how a report names it."""
        return f"{self.id} ({', '.join(self.references)})"


@dataclass(frozen=True)
class HazardMatch:
    hazard: Hazard
    match: Match
    unknown: tuple[str, ...]  # the conditions whose setting the engine did not report

    def record(self) -> HazardRecord:
        """How the report holds it (`environment.hazards`)."""
        h = self.hazard
        return HazardRecord(id=h.id, title=h.title, match=self.match, unknown=list(self.unknown),
                            references=list(h.references), status=h.status, threshold=h.threshold,
                            probes=[p.label for p in h.probes], source=h.source)

    def line(self) -> str:
        why = f" (if {', '.join(self.unknown)} as listed: not reported by the engine)" if self.unknown else ""
        return f"{self.hazard.id}: {self.hazard.title}; {', '.join(self.hazard.references)}{why}"


# Probes a hazard may name: the parameterless strata of oracle.posture.probes, and those that take a threshold.
NAMED_PROBES = ("fa3_packed_query", "fa3_kv_128", "fa3_kv_256", "fa3_kv_512", "chunk_budget", "prefix_block",
                "shared_pass", "shared_prefix", "short_budget")
# `shared_prefix` is both: named, at vLLM's cascade threshold (256 tokens); `{shared_prefix: N}` at N.
THRESHOLD_PROBES = ("pass_tokens", "pass_bytes", "shared_prefix")


def _is_condition_key(key: Any, fields: tuple[str, ...]) -> bool:
    """A posture setting (`attention_backend`), or a fact under `model.`, `sampling.` or `env.`."""
    head, dot, rest = str(key).partition(".")
    if dot:
        return bool(rest) and head in ("model", "sampling", "env")
    return key in fields


def _is_condition(cond: Any) -> bool:
    """A value, or a mapping of exactly one operator (`{min: 2}`) to its argument."""
    return not isinstance(cond, dict) or (len(cond) == 1 and next(iter(cond)) in _OPS)


def _is_threshold_probe(p: Any) -> bool:
    """`{pass_tokens: N}`, `{pass_bytes: N}` or `{shared_prefix: N}` with an integer N >= 1."""
    if not isinstance(p, dict) or len(p) != 1:
        return False
    name, at = next(iter(p.items()))
    return name in THRESHOLD_PROBES and isinstance(at, int) and not isinstance(at, bool) and at >= 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Versions(_Strict):
    min: str | None = Field(None, description="first version affected (inclusive)")
    below: str | None = Field(None, description="first version fixed (exclusive)")


class HazardEntry(_Strict):
    """One entry of a hazards file, as YAML gives it (the shipped table and a user's file alike)."""

    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    title: str = Field(min_length=1)
    engine: str = Field(min_length=1, description="the posture's engine: native, vllm, openai, transformers, ...")
    versions: _Versions = Field(default_factory=_Versions)  # type: ignore[arg-type]
    when: dict[str, Any] = Field(description="conditions on the invariant posture, model.*, sampling.*, env.*")
    threshold: str = Field(min_length=1, description="where the break switches on, in words")
    references: list[str] = Field(min_length=1)
    status: HazardStatus = "open"
    probes: list[Any] = Field(default_factory=list, description="probes that cross the threshold: a probe's name, "
                              "or {pass_tokens: N} / {pass_bytes: N} / {shared_prefix: N}")

    @field_validator("when")
    @classmethod
    def _conditions(cls, when: dict[str, Any]) -> dict[str, Any]:
        from oracle.posture import FIELDS

        for key, cond in when.items():
            if not _is_condition_key(key, FIELDS):
                raise ValueError(f"{key}: not a posture setting ({', '.join(FIELDS)}), model.*, sampling.* "
                                 "or env.*")
            if not all(_is_condition(c) for c in (cond if isinstance(cond, list) else [cond])):
                raise ValueError(f"{key}: a condition is a value, a list, or one of {', '.join(_OPS)}")
        return when

    @field_validator("probes")
    @classmethod
    def _probes(cls, probes: list[Any]) -> list[Any]:
        for i, p in enumerate(probes):
            if isinstance(p, str) and p not in NAMED_PROBES:
                raise ValueError(f"{i}: {p!r} is not a probe ({', '.join(NAMED_PROBES)}, or {{pass_tokens: N}}, "
                                 "{pass_bytes: N}, {shared_prefix: N})")
            if not isinstance(p, str) and not _is_threshold_probe(p):
                raise ValueError(f"{i}: a threshold probe is {{pass_tokens: N}}, {{pass_bytes: N}} or "
                                 f"{{shared_prefix: N}}, N >= 1 (got {p!r})")
        return probes

    def hazard(self, source: str) -> Hazard:
        specs = tuple(ProbeSpec(p) if isinstance(p, str) else ProbeSpec(*next(iter(p.items()))) for p in self.probes)
        return Hazard(id=self.id, title=self.title, engine=self.engine, version_min=self.versions.min,
                      version_below=self.versions.below, when=dict(self.when), threshold=self.threshold,
                      references=tuple(self.references), status=self.status, probes=specs, source=source)


def load_hazards(text: str | None = None, source: str = "hazards.yaml") -> tuple[Hazard, ...]:
    """The shipped hazards file (or `text`, a YAML list of the same entries, read from `source`); ConfigError
    (exit 2) naming the file, the entry and the field of the first problem."""
    if text is None:
        text = resources.files("oracle.posture").joinpath("hazards.yaml").read_text(encoding="utf-8")
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{source}: not YAML ({str(err).splitlines()[0]})") from err
    if not isinstance(raw, list):
        raise ConfigError(f"{source}: expected a list of hazards (- id: ..., engine: ..., when: ...)")
    out: list[Hazard] = []
    for i, e in enumerate(raw):
        name = _entry_name(i, e)
        entry = _entry(e, source, name)
        if any(h.id == entry.id for h in out):
            raise ConfigError(f"{source}: {name}: id: {entry.id!r} is declared twice")
        out.append(entry.hazard(source))
    return tuple(out)


def _entry_name(i: int, e: Any) -> str:
    """How an error names entry `i`: `hazard 3 (its-id)`, or `hazard 3` where it has no id."""
    return f"hazard {i}" + (f" ({e['id']})" if isinstance(e, dict) and isinstance(e.get("id"), str) else "")


def _entry(e: Any, source: str, name: str) -> HazardEntry:
    """One entry of a hazards file, validated; ConfigError naming the file, the entry and the field."""
    if not isinstance(e, dict):
        raise ConfigError(f"{source}: {name}: expected a mapping (id, title, engine, when, threshold, ...)")
    try:
        return HazardEntry.model_validate(e)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(x) for x in first["loc"]) or "<entry>"
        raise ConfigError(f"{source}: {name}: {field}: {error_text(first)}") from err


def load_user_hazards(path: Path) -> tuple[Hazard, ...]:
    """A config's own hazards file (`hazards:`), validated as the shipped table; ids must not repeat a shipped one."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"hazards: cannot read {path} ({getattr(e, 'strerror', None) or e})") from e
    found = load_hazards(text, str(path))
    shipped = {h.id for h in load_hazards()}
    for h in found:
        if h.id in shipped:
            raise ConfigError(f"{path}: {h.id}: id: already a shipped hazard (oracle/posture/hazards.yaml); "
                              "give yours another id")
    return found


def hazards_for(config: Any) -> tuple[Hazard, ...]:
    """The shipped hazards and the config's own (`hazards:`, resolved against the config's folder)."""
    shipped = load_hazards()
    if getattr(config, "hazards", None) is None:
        return shipped
    return shipped + load_user_hazards(config.resolve_path(config.hazards))


def _version(text: str) -> tuple[int, ...]:
    """`0.26.1rc2+cu128` -> (0, 26, 1): the leading numeric release only."""
    m = re.match(r"\d+(?:\.\d+)*", text.strip())
    return tuple(int(x) for x in m.group(0).split(".")) if m else ()


def version_in(version: Any, lo: str | None, below: str | None) -> bool | None:
    """Whether `version` is in [lo, below); None when the version is unknown."""
    if not isinstance(version, str) or version == UNKNOWN or not _version(version):
        return None
    v = _version(version)
    return (lo is None or v >= _version(lo)) and (below is None or v < _version(below))


def _equals(cond: Any, value: Any) -> bool:
    """A plain condition: booleans only equal booleans, text compares without case, the rest by value."""
    if isinstance(cond, bool) or isinstance(value, bool):
        return isinstance(cond, bool) and isinstance(value, bool) and cond == value
    if isinstance(cond, str) or isinstance(value, str):
        return str(cond).lower() == str(value).lower()
    return bool(cond == value)


def _holds(cond: Any, value: Any) -> bool | None:
    """One condition on one value: True, False, or None when the value is unknown."""
    if value is None or value == UNKNOWN:
        return None
    if isinstance(cond, list):
        return any(_holds(c, value) for c in cond)
    if isinstance(cond, dict):
        op, arg = next(iter(cond.items()))
        # A file's entries name only these operators; a Hazard made in code with another compares as `above`.
        return _CONDITION_OPS.get(op, _CONDITION_OPS["above"])(arg, value)
    return _equals(cond, value)


def _lookup(key: str, posture: dict[str, Any], model: dict[str, Any], sampling: dict[str, Any]) -> Any:
    head, _, rest = key.partition(".")
    if head == "model" and rest:
        return model.get(rest, UNKNOWN)
    if head == "sampling" and rest:
        return sampling.get(rest, UNKNOWN)
    if head == "env" and rest:
        env = posture.get("env")
        return env.get(rest) if isinstance(env, dict) else UNKNOWN
    return posture.get(key, UNKNOWN)


def match_hazard(h: Hazard, posture: dict[str, Any], model: dict[str, Any],
                 sampling: dict[str, Any]) -> HazardMatch | None:
    """`h` against one mode's posture: matches, possible (some settings unknown), or None."""
    if str(posture.get("engine")) != h.engine:
        return None
    unknown: list[str] = []
    # A hazard without a version range holds for every version, also one the engine does not report.
    in_range = version_in(posture.get("engine_version"), h.version_min, h.version_below) \
        if h.version_min is not None or h.version_below is not None else True
    if in_range is False:
        return None
    if in_range is None:
        unknown.append("engine_version")
    for key, cond in h.when.items():
        held = _holds(cond, _lookup(key, posture, model, sampling))
        if held is False:
            return None
        if held is None:
            unknown.append(key)
    return HazardMatch(h, "possible" if unknown else "matches", tuple(unknown))


def match_hazards(posture: dict[str, Any], model: dict[str, Any], sampling: dict[str, Any],
                  hazards: tuple[Hazard, ...] | None = None) -> list[HazardMatch]:
    """Every hazard that matches or may match; only where invariance is claimed (a mechanism other than none)."""
    mechanism = str(posture.get("invariance_mechanism", ""))
    if mechanism.startswith("none"):
        return []
    found = (match_hazard(h, posture, model, sampling) for h in (hazards if hazards is not None else load_hazards()))
    return [m for m in found if m is not None]


def warning_lines(found: list[HazardMatch]) -> list[str]:
    """What a run prints before it starts: 'invariance claimed, known not to hold: ...' per match."""
    lines = []
    for m in found:
        head = "invariance claimed, known not to hold" if m.match == "matches" else \
            "invariance claimed, may not hold"
        lines.append(f"{head}: {m.line()}")
    return lines
