"""`oracle bench verdict CONFIG[@SEED] ...`: how long whole `oracle run`s take to a verdict, and where the time went.

Each config is run `runs` times in turn, each as `oracle run` in a process of its own (the first run of a config on
whatever caches the machine holds, the next on what the first left: vLLM's compile cache, Triton's, the model).
A run past its limit is stopped with SIGTERM, as CI's own limit would, and read from the report it writes as it
stops (an interrupted report keeps the timings of the phases it finished). One row per run: wall clock, exit code,
each check's verdict, the first localized op, and where the time went (the report's own line, each engine's start
parts and the localizations' parts beside it), under the machine line. `--json` keeps it all, for docs/results.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oracle.errors import ConfigError

RUN_TIMEOUT_S = 600.0
GRACE_S = 60.0  # after SIGTERM, for the report to be written and engines closed


@dataclass(frozen=True)
class Target:
    """One config to run, and the seed it runs at (None: the config's own)."""

    config: Path
    seed: int | None

    @property
    def name(self) -> str:
        return self.config.stem + ("" if self.seed is None else f"@{self.seed}")


def parse_targets(specs: list[str]) -> list[Target]:
    """`CONFIG` or `CONFIG@SEED` -> Targets; a missing file or a seed that is not a whole number is a ConfigError."""
    if not specs:
        raise ConfigError("bench verdict: give one or more configs (CONFIG or CONFIG@SEED)")
    out = []
    for spec in specs:
        path, at, seed = ("", "", "") if Path(spec).is_file() else spec.rpartition("@")
        if not at:
            path, seed = spec, ""
        elif not re.fullmatch(r"[0-9]+", seed):
            raise ConfigError(f"bench verdict: {spec!r}: the seed after @ must be a whole number")
        config = Path(path)
        if not config.is_file():
            raise ConfigError(f"bench verdict: {config}: no such config file")
        out.append(Target(config, int(seed) if seed else None))
    return out


def run_once(target: Target, report_dir: Path, settings: list[str], timeout_s: float) -> dict[str, Any]:
    """`oracle run` of `target` into `report_dir`, stopped with SIGTERM past `timeout_s`; its row."""
    cmd = [sys.executable, "-m", "oracle", "run", str(target.config), "--report-dir", str(report_dir)]
    if target.seed is not None:
        cmd += ["--seed", str(target.seed)]
    for setting in settings:
        cmd += ["--set", setting]
    log_path = report_dir.parent / f"{report_dir.name}.log"
    # An earlier bench's report in a kept folder must never be read as this run's (a run that dies before it
    # writes one has none).
    (report_dir / "report.json").unlink(missing_ok=True)
    began = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        stopped = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stopped = True
            _stop(proc)
        except BaseException:  # this bench stopped (Ctrl-C, SIGTERM): the run too, with its report written
            _stop(proc)
            raise
    wall = time.perf_counter() - began
    row: dict[str, Any] = {"config": str(target.config), "seed": target.seed, "wall_s": round(wall, 1),
                           "exit_code": proc.returncode, "stopped_at_limit": stopped, "report_dir": str(report_dir)}
    row.update(read_report(report_dir / "report.json"))
    if "timings" not in row:
        row["log_tail"] = log_path.read_text(errors="replace")[-2000:]
    return row


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, as CI's limit sends it (the run writes its report and closes its engines), then SIGKILL past the
    grace period."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def read_report(path: Path) -> dict[str, Any]:
    """What a row quotes from a report: complete or not, each check's verdict, the first localized op, timings."""
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return {"report": f"unreadable: {e}"}
    checks = {c.get("name"): c.get("verdict") for c in report.get("checks") or [] if isinstance(c, dict)}
    localized = None
    for d in report.get("divergences") or []:
        op = d.get("localized_op") if isinstance(d, dict) else None
        if op:
            layer = op.get("layer")
            localized = (f"{op.get('op')} ({op.get('module')}"
                         + (f", layer {layer}" if layer is not None else "")
                         + f", pass {op.get('forward_pass')}, {op.get('status')})")
            break
    return {"complete": bool(report.get("complete")), "checks": checks, "localized": localized,
            "timings": report.get("timings") or {}}


def start_parts(timings: dict[str, Any], phase: str = "engine_start") -> str:
    """`invariant: import_vllm 7.5s, vllm_engine 3.8s; production: ...` from `{mode}_{phase}_{part}_s` (the engines'
    start parts; with `phase` "localize", the localizations' parts)."""
    out = []
    for mode in ("invariant", "production"):
        prefix = f"{mode}_{phase}_"
        parts = [f"{k[len(prefix):-2]} {v:.1f}s" for k, v in timings.items()
                 if k.startswith(prefix) and k.endswith("_s") and len(k) > len(prefix) + 2
                 and isinstance(v, (int, float))]
        if parts:
            out.append(f"{mode}: " + ", ".join(parts))
    return "; ".join(out)


def machine() -> str:
    """The machine line: GPU, driver, torch, Triton, vLLM where importable; else the CPU and its cores."""
    from oracle.bench_vllm import machine_line

    line = machine_line()
    if line.startswith("no GPU"):
        line += f", {os.cpu_count()} CPU cores"
    return line


def bench_verdict(specs: list[str], *, runs: int = 2, timeout_s: float = RUN_TIMEOUT_S, settings: list[str] | None = None,
                  json_path: Path | None = None, keep: Path | None = None) -> int:
    """Run each config `runs` times in turn (all configs once, then all again); print a row per run. 0, or 1 where
    a run did not end in a report that says what it found (stopped, or no report)."""
    from oracle.render.timings import timing_line

    if runs < 1:
        raise ConfigError(f"bench verdict --runs: must be >= 1, got {runs}")
    if timeout_s <= 0:
        raise ConfigError(f"bench verdict --run-timeout: must be > 0, got {timeout_s}")
    targets = parse_targets(specs)
    settings = list(settings or [])
    line = machine()
    print(f"machine: {line}", flush=True)
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        base = keep if keep is not None else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="oracle-verdict-")))
        base.mkdir(parents=True, exist_ok=True)
        try:
            for n in range(runs):
                for i, target in enumerate(targets):
                    # The target's place in the list too: two configs of one name, or one given twice, keep apart.
                    report_dir = base / f"{i + 1}-{target.name.replace('@', '-seed')}-run{n + 1}"
                    row = {"run": n + 1, **run_once(target, report_dir, settings, timeout_s)}
                    if keep is None:  # gone with the temporary folder
                        del row["report_dir"]
                    rows.append(row)
                    _print_row(target, row, timing_line(row.get("timings") or {}))
        finally:  # the rows so far, also where this bench was stopped
            if json_path is not None:
                json_path.parent.mkdir(parents=True, exist_ok=True)
                json_path.write_text(json.dumps({"machine": line, "settings": settings, "run_timeout_s": timeout_s,
                                                 "rows": rows}, indent=2) + "\n")
    return 0 if all(r.get("complete") and not r["stopped_at_limit"] for r in rows) else 1


def _print_row(target: Target, row: dict[str, Any], where: str | None) -> None:
    checks = ", ".join(f"{k} {v}" for k, v in (row.get("checks") or {}).items()) or row.get("report", "no checks")
    ended = ("stopped at the limit" if row["stopped_at_limit"]
             else f"exit {row['exit_code']}" + ("" if row.get("complete") else ", report not complete"))
    print(f"{target.name} run {row['run']}: {row['wall_s']:.1f}s, {ended}; {checks}", flush=True)
    if row.get("localized"):
        print(f"  localized: {row['localized']}", flush=True)
    if where:
        print(f"  {where}", flush=True)
    for phase, label in (("engine_start", "engine start parts"), ("localize", "localize parts")):
        parts = start_parts(row.get("timings") or {}, phase)
        if parts:
            print(f"  {label}: {parts}", flush=True)
    if "log_tail" in row:
        print("  no report; the run's output ended with:\n    " + row["log_tail"][-600:].replace("\n", "\n    "),
              flush=True)
