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
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

import yaml

from oracle.errors import ConfigError
from oracle.posture import UNKNOWN

Match = Literal["matches", "possible"]
_OPS = ("contains", "min", "above", "not")


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
    status: str

    def cite(self) -> str:
        """`id (reference, ...)`: how a report names it."""
        return f"{self.id} ({', '.join(self.references)})"


@dataclass(frozen=True)
class HazardMatch:
    hazard: Hazard
    match: Match
    unknown: tuple[str, ...]  # the conditions whose setting the engine did not report

    def to_json(self) -> dict[str, Any]:
        h = self.hazard
        return {"id": h.id, "title": h.title, "match": self.match, "unknown": list(self.unknown),
                "references": list(h.references), "status": h.status, "threshold": h.threshold}

    def line(self) -> str:
        why = f" (if {', '.join(self.unknown)} as listed: not reported by the engine)" if self.unknown else ""
        return f"{self.hazard.id}: {self.hazard.title}; {', '.join(self.hazard.references)}{why}"


def load_hazards(text: str | None = None) -> tuple[Hazard, ...]:
    """The shipped hazards file (or `text`, a YAML list of the same entries)."""
    if text is None:
        text = resources.files("oracle.posture").joinpath("hazards.yaml").read_text(encoding="utf-8")
    raw = yaml.safe_load(text)
    if not isinstance(raw, list):
        raise ConfigError("hazards.yaml: expected a list of hazards")
    out = []
    for i, e in enumerate(raw):
        if not isinstance(e, dict) or not isinstance(e.get("when"), dict):
            raise ConfigError(f"hazards.yaml: entry {i} needs a mapping with `when`")
        for key, cond in e["when"].items():
            if isinstance(cond, dict) and (len(cond) != 1 or next(iter(cond)) not in _OPS):
                raise ConfigError(f"hazards.yaml: {e.get('id', i)}.when.{key}: one of {', '.join(_OPS)}")
        versions = e.get("versions") or {}
        out.append(Hazard(
            id=str(e["id"]), title=str(e.get("title", "")), engine=str(e["engine"]),
            version_min=versions.get("min"), version_below=versions.get("below"), when=dict(e["when"]),
            threshold=str(e.get("threshold", "")), references=tuple(str(r) for r in e.get("references", ())),
            status=str(e.get("status", "open")),
        ))
    return tuple(out)


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


def _holds(cond: Any, value: Any) -> bool | None:
    """One condition on one value: True, False, or None when the value is unknown."""
    if value is None or value == UNKNOWN:
        return None
    if isinstance(cond, list):
        return any(_holds(c, value) for c in cond)
    if isinstance(cond, dict):
        op, arg = next(iter(cond.items()))
        if op == "contains":
            return str(arg).lower() in str(value).lower()
        if op == "not":
            return not _holds(arg, value)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return False
        return value >= arg if op == "min" else value > arg
    if isinstance(cond, bool) or isinstance(value, bool):
        return bool(cond) == bool(value) if isinstance(cond, bool) and isinstance(value, bool) else False
    if isinstance(cond, str) or isinstance(value, str):
        return str(cond).lower() == str(value).lower()
    return bool(cond == value)


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
    in_range = version_in(posture.get("engine_version"), h.version_min, h.version_below)
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
