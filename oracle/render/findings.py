"""Findings every format shows in words: the first diverging operator of a divergence, what a golden
check found changed, and the coverage table. Read defensively: each shows up once its data exists."""

from __future__ import annotations

from typing import Any


def _as_dict(lo: Any) -> Any:
    return lo.model_dump() if hasattr(lo, "model_dump") else lo


def localized_line(d: Any) -> str | None:
    """`first diverging op: MODULE (OP), layer L, pass P` for a divergence, or None when not localized."""
    lo = _as_dict(getattr(d, "localized_op", None))
    if not lo:
        return None
    if not isinstance(lo, dict):
        return f"first diverging op: {lo}"
    text = f"first diverging op: {lo.get('module', '?')} ({lo.get('op', '?')})"
    if lo.get("layer") is not None:
        text += f", layer {lo['layer']}"
    if lo.get("forward_pass") is not None:
        text += f", pass {lo['forward_pass']}"
    if lo.get("still_diverged") is False:
        text += " (the divergence did not reproduce there)"
    return text


def localized_cells(d: Any) -> dict[str, str]:
    """The localized op's fields as table cells (empty strings when absent)."""
    lo = _as_dict(getattr(d, "localized_op", None))
    keys = ("module", "op", "layer", "forward_pass", "engine_step", "ulp", "max_abs_diff", "eager",
            "still_diverged")
    if not isinstance(lo, dict):
        return {k: (str(lo) if k == "module" and lo else "") for k in keys}
    return {k: "" if lo.get(k) is None else (f"{lo[k]:.3g}" if isinstance(lo[k], float) else str(lo[k]))
            for k in keys}


def _pair(v: Any) -> tuple[Any, Any] | None:
    if isinstance(v, dict):
        return v.get("golden"), v.get("now", v.get("run"))
    if isinstance(v, (list, tuple)) and len(v) == 2:
        return v[0], v[1]
    return None


def _short(v: Any) -> str:
    s = str(v)
    return s[:12] if len(s) == 64 and all(ch in "0123456789abcdef" for ch in s) else s


def golden_lines(c: Any) -> list[str]:
    """For a golden check: one line per differing target (step, tokens) and one naming what changed."""
    ev = getattr(c, "evidence", None) or {}
    lines: list[str] = []
    for diff in ev.get("differing", []):
        target = diff.get("target", "?")
        if "problem" in diff:
            lines.append(f"golden: target {target}: {diff['problem']}")
            continue
        exp, act = diff.get("expected_token"), diff.get("actual_token")
        if diff.get("tokens_differ"):
            what = f"token {exp} -> {act}"
        else:
            what = f"same token {exp}, logprob or logits bits differ"
        lines.append(f"golden: target {target}: step {diff.get('step')}: {what}")
    if lines or ev.get("environment_changes") or "config_digest" in ev:
        lines.append("golden: changed since the golden file: " + changes_text(ev))
    return lines


def changes_text(ev: dict[str, Any]) -> str:
    """`torch: 2.11 -> 2.13; config digest: abc -> def` from a golden check's evidence."""
    parts = []
    for key, value in (ev.get("environment_changes") or {}).items():
        pair = _pair(value)
        parts.append(f"{key}: {pair[0]} -> {pair[1]}" if pair else f"{key}: {value}")
    digest = _pair(ev.get("config_digest"))
    if digest is not None:
        parts.append(f"config digest: {_short(digest[0])} -> {_short(digest[1])}" if digest[0] != digest[1]
                     else f"config digest unchanged ({_short(digest[0])})")
    return "; ".join(parts) or "nothing recorded in the environment"


def coverage(report: Any) -> dict[str, int]:
    """The report's coverage table (condition -> number of trials), or empty when it has none."""
    cov = getattr(report, "coverage", None)
    if not isinstance(cov, dict):
        return {}
    return {str(k): v for k, v in cov.items()}


TOKEN_CHANGED = "token changed"


def ulp_text(d: Any) -> str:
    """A divergence's ULP distance as views show it: only between logprobs of the same token; a changed
    token says so (an older report may still hold a ULP computed across two tokens: not shown)."""
    if d.kind == "token":
        return TOKEN_CHANGED
    return "" if d.ulp is None else str(d.ulp)


def minimal_first(divergences: list[Any]) -> list[Any]:
    """Divergences with the shrunk minimal trial first, so it is never among the rows cut."""
    return sorted(divergences, key=lambda d: not (getattr(d, "evidence", None) or {}).get("shrunk"))


def is_minimal(d: Any) -> bool:
    return bool((getattr(d, "evidence", None) or {}).get("shrunk"))
