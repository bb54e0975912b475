"""Where the time went, as one line for the console and summary.md (from the report's `timings`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from oracle.timings import PHASES

_RUN = (("plan", "plan"), ("judge", "judge"), ("write", "write"), ("merge", "merge"))


def _spent(timings: Mapping[str, float], prefix: str, labels: Iterable[tuple[str, str]],
           floor: float | None = 0.05) -> list[str]:
    """`label 1.2s` for each (key, label) whose `{prefix}{key}_s` is a number (of at least `floor`)."""
    out = []
    for key, label in labels:
        v = timings.get(f"{prefix}{key}_s")
        if isinstance(v, (int, float)) and (floor is None or v >= floor):
            out.append(f"{label} {v:.1f}s")
    return out


def timing_line(timings: Mapping[str, float]) -> str | None:
    """`where the time went: invariant: engine start 0.1s, references 0.8s, ...; production: ...; judge 0.0s`,
    phases under 0.05 s left out; None for a report without the breakdown. Where the second mode's engine
    started while the first mode ran (oracle.overlap), its start says how much of it ran alongside; where the whole
    second mode ran beside the first (oracle.forked_mode), the mode says what of it was waited for. Either way the
    line ends with the wall clock (`total_s`), which is then less than the phases' sum."""
    parts = []
    modes = ("invariant", "production")
    for mode in modes:
        phases = _spent(timings, f"{mode}_", ((p, p.replace("_", " ")) for p in PHASES))
        wait = timings.get(f"{mode}_start_wait_s")
        if phases and isinstance(wait, (int, float)) and phases[0].startswith("engine start"):
            other = next(m for m in modes if m != mode)
            phases[0] += f" ({timings.get('overlap_s', 0):.1f}s of it alongside {other}, {wait:.1f}s waited for)"
        ran = timings.get(f"{mode}_wait_s")  # the whole mode ran beside the other (oracle.forked_mode)
        if phases and isinstance(ran, (int, float)):
            other = next(m for m in modes if m != mode)
            parts.append(f"{mode} (beside {other}, {ran:.1f}s waited for): " + ", ".join(phases))
        elif phases:
            parts.append(f"{mode}: " + ", ".join(phases))
    merge = _spent(timings, "merge_", ((p, p) for p in PHASES), floor=None)
    if merge:
        parts.append("merge's rerun: " + ", ".join(merge))
    run = _spent(timings, "", _RUN)
    if "shards_wall_s" in timings:
        run.append(f"slowest shard {timings['shards_wall_s']:.1f}s (all shards {timings.get('shards_sum_s', 0):.1f}s)")
    if "overlap_s" in timings and isinstance(timings.get("total_s"), (int, float)):
        run.append(f"wall clock {timings['total_s']:.1f}s")
    if not parts and not run:
        return None
    return "where the time went: " + "; ".join([*parts, *run])
