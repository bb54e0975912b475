"""Golden files: digests of the invariant references, with the environment that made them.

`oracle record CONFIG --golden FILE` writes one; the `golden` check compares a later run (another
torch, engine version or GPU) target by target and step by step, and names what changed.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from oracle.config import Config
from oracle.engines.contract import Completion
from oracle.errors import ConfigError

FORMAT = "oracle-golden/1"
MAX_GOLDEN_BYTES = 256 << 20  # a digest per step per target: far more than any run writes


def golden_path(config: Config) -> Path | None:
    f = config.checks.golden.file
    return config.resolve_path(f) if f else None


def step_digests(c: Completion) -> list[str]:
    """One sha256 per generated step over the token id, the logprob's float32 bits and the logits row's bits."""
    out = []
    for i, (tok, lp) in enumerate(zip(c.token_ids, c.logprobs, strict=True)):
        h = hashlib.sha256()
        h.update(int(tok).to_bytes(8, "little", signed=True))
        h.update(np.array(lp, dtype=np.float32).tobytes())
        if c.logits is not None and i < len(c.logits):
            if c.logits[i] is None:  # a trimmed row (execute.keep_rows): its bits are not here to digest
                raise ValueError(f"step {i}: the logits row was not kept; golden digests need solo references")
            h.update(np.asarray(c.logits[i], dtype=np.float32).tobytes())
        elif c.logits_digests is not None and i < len(c.logits_digests):
            h.update(c.logits_digests[i].encode())
        out.append(h.hexdigest())
    return out


def make_golden(references: dict[str, Completion], prompts: dict[str, tuple[int, ...]],
                environment: dict[str, Any], config_digest: str) -> dict[str, Any]:
    from oracle.redaction import redact_document

    return redact_document({
        "format": FORMAT,
        "config_digest": config_digest,
        # The invariant engine's posture digest (oracle.posture): equal digests, the same settings were tested.
        "posture_digest": (environment.get("posture") or {}).get("digests", {}).get("invariant"),
        # Golden files are committed: the engines' self-description (command lines, env) without secrets.
        "environment": environment,
        "targets": {
            name: {
                "prompt_sha256": _prompt_digest(prompts[name]),
                "token_ids": c.token_ids,
                "steps": step_digests(c),
            }
            for name, c in references.items()
        },
    }, ("environment",))


def write_golden(path: Path, golden: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def read_golden(path: Path) -> dict[str, Any]:
    from oracle.files import read_regular

    try:
        data = json.loads(read_regular(path, MAX_GOLDEN_BYTES, "golden file").decode("utf-8"))
    except ConfigError as e:  # missing, a FIFO or a device (/dev/zero), over the bound
        raise ConfigError(f"checks.golden.file: {e}; write it with `oracle record`") from e
    except json.JSONDecodeError as e:
        raise ConfigError(f"checks.golden.file: {path} is not valid JSON ({e.msg})") from e
    except (UnicodeDecodeError, RecursionError, ValueError) as e:  # not UTF-8, nested too deeply, huge numbers
        raise ConfigError(f"checks.golden.file: {path} is not valid JSON ({type(e).__name__})") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"checks.golden.file: {path} is not an oracle golden file ({FORMAT})")
    return data


def environment_changes(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Keys whose values differ between two environments, flattened: {"torch": ["2.11", "2.13"], ...}."""
    changes: dict[str, Any] = {}
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            changes.update(environment_changes(a, b, f"{prefix}{key}."))
        elif a != b:
            changes[f"{prefix}{key}"] = [a, b]
    return changes


def _prompt_digest(token_ids: Sequence[int]) -> str:
    return hashlib.sha256(json.dumps(list(token_ids)).encode()).hexdigest()


def _first_changed_step(pinned: Sequence[Any], now: Sequence[Any]) -> int | None:
    """The first step whose digest differs, else where the shorter run ends; None when both agree whole."""
    step = next((i for i, (a, b) in enumerate(zip(pinned, now, strict=False)) if a != b), None)
    if step is None and len(now) != len(pinned):
        step = min(len(now), len(pinned))
    return step


def _target_diff(name: str, c: Completion, g: Mapping[str, Any] | None,
                 prompts: Mapping[str, Sequence[int]]) -> dict[str, Any] | None:
    """How one target differs from its golden entry, None when it does not."""
    if g is None:
        return {"target": name, "problem": "not in the golden file"}
    if g["prompt_sha256"] != _prompt_digest(prompts[name]):
        return {"target": name, "problem": "prompt differs from the golden file's"}
    now = step_digests(c)
    step = _first_changed_step(g["steps"], now)
    if step is None:
        return None
    tokens_differ = step >= len(now) or step >= len(g["token_ids"]) or g["token_ids"][step] != c.token_ids[step]
    return {"target": name, "step": step, "tokens_differ": bool(tokens_differ),
            "expected_token": g["token_ids"][step] if step < len(g["token_ids"]) else None,
            "actual_token": c.token_ids[step] if step < len(c.token_ids) else None}


def compare_golden(golden: dict[str, Any], references: dict[str, Completion],
                   prompts: dict[str, tuple[int, ...]]) -> list[dict[str, Any]]:
    """Per target that differs: its first differing step and whether the tokens differ there."""
    found = (_target_diff(name, c, golden["targets"].get(name), prompts) for name, c in references.items())
    return [d for d in found if d is not None]


def pin_variance_map(golden_file: Path, report: Any) -> dict[str, Any]:
    """Pin a report's variance map (checks.drift.localize) in a golden file: the golden check then names every
    op that became or stopped being batch-variant (oracle.variance_map.map_changes)."""
    from oracle.variance_map import pinned_ops

    if report.variance_map is None:
        raise ConfigError("pin-map: the report has no variance_map; run with checks.drift.localize: first or all")
    golden = read_golden(golden_file)
    golden["variance_map"] = {"localize": report.variance_map.localize,
                              "drifting_trials": report.variance_map.drifting_trials,
                              "ops": pinned_ops(report.variance_map)}
    write_golden(golden_file, golden)
    return golden
