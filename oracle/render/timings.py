"""Where the time went, as one line for the console and summary.md (from the report's `timings`)."""

from __future__ import annotations

from collections.abc import Mapping

from oracle.timings import PHASES

_RUN = (("plan", "plan"), ("judge", "judge"), ("write", "write"), ("merge", "merge"))


def timing_line(timings: Mapping[str, float]) -> str | None:
    """`where the time went: invariant: engine start 0.1s, references 0.8s, ...; production: ...; judge 0.0s`,
    phases under 0.05 s left out; None for a report without the breakdown."""
    parts = []
    for mode in ("invariant", "production"):
        phases = [f"{p.replace('_', ' ')} {timings[f'{mode}_{p}_s']:.1f}s" for p in PHASES
                  if isinstance(timings.get(f"{mode}_{p}_s"), (int, float)) and timings[f"{mode}_{p}_s"] >= 0.05]
        if phases:
            parts.append(f"{mode}: " + ", ".join(phases))
    merge = [f"{p} {timings[f'merge_{p}_s']:.1f}s" for p in PHASES if isinstance(timings.get(f"merge_{p}_s"),
                                                                               (int, float))]
    if merge:
        parts.append("merge's rerun: " + ", ".join(merge))
    run = [f"{label} {timings[f'{key}_s']:.1f}s" for key, label in _RUN
           if isinstance(timings.get(f"{key}_s"), (int, float)) and timings[f"{key}_s"] >= 0.05]
    if "shards_wall_s" in timings:
        run.append(f"slowest shard {timings['shards_wall_s']:.1f}s (all shards {timings.get('shards_sum_s', 0):.1f}s)")
    if not parts and not run:
        return None
    return "where the time went: " + "; ".join([*parts, *run])
