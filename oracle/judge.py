"""judge: the list of checks, and the run's verdicts over the frozen results of both modes.

Each check is a module of oracle.checks (its verdict function, its own runs if any, its row); `CHECKS` lists their
rows in the order they run and are reported. `judge()` calls every enabled check whose modes ran; `coverage()`
counts what the schedule exercised. Nothing here runs an engine or writes a report.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from oracle.checks import (
    cross_instance,
    drift,
    fidelity,
    golden,
    invariance,
    negative_control,
    prefill_decode,
    prefix_cache,
    repeatability,
    seeded_sampling,
    tp_parity,
)
from oracle.checks.base import BOTH, SECTIONS, Check, CheckRun, Runs
from oracle.config import Config
from oracle.engines.contract import Completion, Mode, StepEvidence
from oracle.posture.probes import probe_hits
from oracle.report import CheckResult, DivergenceRecord
from oracle.schedule import Trial

KV_BOUNDARIES = (64, 128, 256, 512)

# One row per check (and per field of `checks:` in the config), in the order they run and are reported.
CHECKS: dict[str, Check] = {row.name: row for row in (
    invariance.ROW,
    repeatability.ROW,
    fidelity.ROW,
    drift.ROW,
    negative_control.ROW,
    prefill_decode.ROW,
    prefix_cache.ROW,
    golden.ROW,
    seeded_sampling.ROW,
    cross_instance.ROW,
    tp_parity.ROW,
)}


def check_runs(config: Config) -> dict[str, CheckRun]:
    """The own runs of the checks `config` enables, by check name, in table order (oracle.execute)."""
    return {name: row.runs for name, row in CHECKS.items()
            if row.runs is not None and getattr(config.checks, name).requirement != "off"}


def check_data() -> dict[str, Any]:
    """Check name -> the type of what its own runs keep in `ModeResult.checks` (oracle.shards.results)."""
    return {name: row.runs.data for name, row in CHECKS.items() if row.runs is not None}


def sections() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The views' divergence sections, in order: (title, the checks whose records it lists, in table order)."""
    return tuple((title, tuple(name for name, row in CHECKS.items() if row.section == title)) for title in SECTIONS)


def modes_read(config: Config) -> list[Mode]:
    """The modes the enabled checks read, in the order they run: a run executes only these."""
    read = {m for name, row in CHECKS.items()
            if getattr(config.checks, name).requirement != "off" for m in (*row.reads, *row.reads_also(config))}
    return [m for m in BOTH if m in read]


SHARED_SERVER = ("one server serves both modes (engine.options.base_url is a single URL), so this compares "
                 "the server with itself; give base_url: {invariant: URL, production: URL}")


def shared_server(runs: Runs) -> bool:
    """One server serves both modes (the openai engine with one base_url): the engine's row says."""
    row = runs.engine
    return row is not None and row.shared_server(runs.config.engine)


def _self_compared(result: CheckResult) -> CheckResult:
    """A check that compares one mode's server against the other's, with one server for both: it compared the
    server with itself, and says so (vacuous), whatever it found."""
    if result.verdict == "error":
        return result
    message = SHARED_SERVER + (f" (found: {result.message})" if result.message else "")
    return result.model_copy(update={"verdict": "vacuous", "message": message,
                                     "evidence": {**result.evidence, "shared_server": True}})


def judge(runs: Runs) -> tuple[list[CheckResult], list[DivergenceRecord]]:
    """Every enabled check whose modes ran, in table order."""
    results: list[CheckResult] = []
    divergences: list[DivergenceRecord] = []
    for name, row in CHECKS.items():
        requirement = getattr(runs.config.checks, name).requirement
        if requirement == "off" or any(runs.mode(m) is None for m in row.needs) or not row.applies(runs):
            continue
        judged = row.judge(runs, requirement)
        self_compared = row.self_compared and shared_server(runs)
        results.append(_self_compared(judged.result) if self_compared else judged.result)
        divergences += judged.divergences
    return results, divergences


def _bucket(n: int, edges: Iterable[int]) -> str:
    lo = 1
    for e in edges:
        if n <= e:
            return f"{lo}-{e}" if lo != e else str(e)
        lo = e + 1
    return f"{lo}+"


_ORIGIN_HITS = {"search": ("search trials run",), "database": ("trials replayed from the example database",)}


# What a trial's target met, read from the trial and its completion: (condition, hit(trial, completion, the
# passes the target shared with another sequence)). Every condition is listed in coverage, hit or not.
_Condition = Callable[[Trial, Completion, list[StepEvidence]], bool]
_CONDITIONS: tuple[tuple[str, _Condition], ...] = (
    ("target shared a pass", lambda t, c, shared: bool(shared)),
    ("target first in batch", lambda t, c, shared: t.batch_size > 1 and t.position == 0),
    ("target in the middle of the batch",
     lambda t, c, shared: t.batch_size > 1 and t.position not in (0, t.batch_size - 1)),
    ("target last in batch", lambda t, c, shared: t.batch_size > 1 and t.position == t.batch_size - 1),
    ("mixed prefill+decode pass",
     lambda t, c, shared: any(e.num_prefill_tokens and e.num_decode_tokens for e in shared)),
    ("decode-only shared pass", lambda t, c, shared: any(e.num_prefill_tokens == 0 for e in shared)),
    ("target prompt chunked", lambda t, c, shared: any(e.chunked for e in c.evidence)),
    ("shared pass with a chunked prompt", lambda t, c, shared: any(e.has_chunked for e in shared)),
    ("filler shares the target's prefix", lambda t, c, shared: any(f.shared_prefix for f in t.fillers)),
    ("target prompt hit the prefix cache", lambda t, c, shared: any(e.num_cached_tokens > 0 for e in c.evidence)),
    ("staggered arrival", lambda t, c, shared: t.target_arrival_step > 0
     or any(f.arrival_step > t.target_arrival_step for f in t.fillers)),
    *((f"target KV length > {b} in a shared pass",
       lambda t, c, shared, b=b: any((e.kv_len or 0) > b for e in shared)) for b in KV_BOUNDARIES),
)


def _shared_sizes(shared: Sequence[StepEvidence]) -> set[str]:
    """How many other sequences the target's shared passes held, and how many tokens they packed (bucketed)."""
    if not shared:
        return set()
    others = _bucket(max(e.num_seqs for e in shared) - 1, (1, 3, 7, 15, 63, 255))
    return {f"shared with {others} {'sequence' if others == '1' else 'sequences'}",
            f"packed query length {_bucket(max(e.num_tokens for e in shared), (16, 64, 256, 1024))}"}


def _hits(t: Trial, c: Completion) -> set[str]:
    """Every coverage condition one trial's target hit."""
    shared = [e for e in c.evidence if e.num_seqs >= 2]
    return {"trials run", *_ORIGIN_HITS.get(t.origin, ()), *probe_hits(t), *_shared_sizes(shared),
            *(name for name, hit in _CONDITIONS if hit(t, c, shared))}


def _coverage_order(item: tuple[str, int]) -> tuple[int, list[int | str]]:
    """Most hit first; equal counts by name, numbers by value ("> 64" before "> 512")."""
    name, count = item
    return -count, [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def coverage(runs: Runs) -> dict[str, int]:
    """How many trials (invariant mode: the schedule's, replayed and searched) hit each condition that kernels
    key their choices on.

    Conditions read from the engine's per-pass evidence count only passes the target shared with
    another sequence; an engine that does not report a field counts 0 for it.
    """
    inv = runs.inv
    if inv is None:
        return {}
    # every listed condition and every planned probe side, hit or not
    out: Counter[str] = Counter({k: 0 for k in (
        *(name for name, _ in _CONDITIONS), *(h for t in runs.trials.values() for h in probe_hits(t)))})
    for tid in runs.judged_ids:
        c = inv.trials.get(tid)
        if c is not None:
            out.update(_hits(runs.trials[tid], c))
    return dict(sorted(out.items(), key=_coverage_order))
