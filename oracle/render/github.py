"""The GitHub Action's helpers (`.github/actions/oracle`): annotations, step outputs, the cache key.

    python -m oracle.render.github annotate REPORT_DIR [--exit-code N] [--config PATH]

`annotate` reads REPORT_DIR/report.json and prints one `::error` workflow command per required
check that failed, was vacuous or errored, and one `::warning` per warning (a check at `warn` that
did, a report-level gate that failed or errored: see oracle.render.verdict), plus one for an
engine error or a missing report; then writes `exit-code`, `verdict` (pass | fail | error) and
`report-dir` to $GITHUB_OUTPUT. It never fails the step: the action's last step does that.
Reads the report through oracle.report's model: no torch, no engine.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from oracle.errors import OracleError
from oracle.render.escape import terminal_text
from oracle.render.findings import replay_lines
from oracle.render.verdict import RunVerdict, error_label, first_divergence, gate, run_verdict, shown_verdict
from oracle.report import EXIT_ENGINE, EXIT_OK, EXIT_USAGE, CheckResult, Report, load_report


def escape_data(s: str) -> str:
    """Escape a workflow command's message (GitHub's rules: %, CR, LF); control bytes, terminal escapes
    and lone surrogates are written as `\\xNN`, and secrets scrubbed (oracle.render.escape)."""
    clean = "".join(part if part in ("\r", "\n") else terminal_text(part) for part in re.split(r"(\r|\n)", s))
    return clean.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(s: str) -> str:
    """Escape a workflow command's property value (the message's rules, plus : and ,)."""
    return escape_data(s).replace(":", "%3A").replace(",", "%2C")


def command(kind: str, title: str, message: str, file: str | None = None) -> str:
    props = ([f"file={escape_property(file)}"] if file else []) + [f"title={escape_property(title)}"]
    return f"::{kind} {','.join(props)}::{escape_data(message)}"


def verdict_of(exit_code: int) -> RunVerdict:
    """The `verdict` output: pass | fail | error."""
    return run_verdict(exit_code)


def check_message(report: Report, check: CheckResult, report_path: Path) -> str:
    """The check's message, its first divergence, the op it started at and the command that replays it."""
    lines = [f"{check.name} [{check.requirement}]: {shown_verdict(check)}: {check.message}"]
    d = first_divergence(report, [check.name])
    if d is not None:
        lines.append(f"first divergence: target {d.target}, trial {d.trial_id}, step {d.step} "
                     f"({d.kind}): token {d.expected_token} -> {d.actual_token}, "
                     f"ULP {d.ulp}, top-2 margin {d.reference_margin}")
        if d.localized_op is not None:
            lines.append(d.localized_op.finding())
        for _, command in replay_lines(report, str(report_path), [check.name]):  # what every view gives
            lines.append(f"replay: {command}")
    lines.append(f"seed {report.seed}; report {report_path}")
    return "\n".join(lines)


def workflow_commands(report: Report | None, report_path: Path, exit_code: int,
                      config: str | None = None, unreadable: str | None = None) -> Iterator[str]:
    """The workflow commands for a run: errors for blocking checks, warnings for the warnings.
    `unreadable`: why the report at `report_path` could not be read (it exists but is not a report)."""
    if report is None:
        if unreadable is not None:
            yield command("error", "oracle", f"the report at {report_path} cannot be read ({unreadable}); "
                                             f"oracle exited {exit_code}", config)
            return
        yield command("error", "oracle", f"no report at {report_path}: oracle exited {exit_code} before writing "
                                         "one (a usage or config error; see the run step's log)", config)
        return
    if exit_code == EXIT_OK and report.exit_code() != EXIT_OK:
        yield command("error", "oracle", f"oracle exited 0 but its report says {report.exit_code()} "
                                         f"({'did not complete' if report.partial else 'a check failed'}); "
                                         "the run is not a pass", config)
    if report.error:
        label = error_label(report.exit_code())
        yield command("error", "oracle" if label != "engine error" else "oracle engine",
                      f"{label}: {report.error} (partial report {report_path})",
                      config)
    for check in report.checks:
        kind = {"fail": "error", "warn": "warning"}.get(gate(check))
        if kind is not None:
            yield command(kind, f"oracle {check.name}", check_message(report, check, report_path), config)


def outcome(report: Report | None, exit_code: int | None) -> int:
    """The run's exit code as the outputs give it: oracle's own, never 0 unless the report agrees (a
    run whose process exited 0 without a passing, complete report is not a pass)."""
    if report is None:
        return EXIT_USAGE if exit_code is None else (EXIT_ENGINE if exit_code == EXIT_OK else exit_code)
    if exit_code is None or exit_code == EXIT_OK:
        return report.exit_code()
    return exit_code


def annotate(report_dir: Path, exit_code: int | None, config: str | None, out: TextIO) -> int:
    path = report_dir / "report.json"
    unreadable = None
    try:
        report: Report | None = load_report(path)
    except OracleError as e:
        report = None
        if path.exists():
            unreadable = str(e).removeprefix(f"{path}: ")
    code = outcome(report, exit_code)
    for line in workflow_commands(report, path, code if exit_code is None else exit_code, config, unreadable):
        print(line, file=out)
    write_outputs({"exit-code": str(code), "verdict": verdict_of(code), "report-dir": str(report_dir)})
    return 0


def write_outputs(outputs: dict[str, str]) -> None:
    """Append `name=value` lines to $GITHUB_OUTPUT (a no-op outside Actions)."""
    target = os.environ.get("GITHUB_OUTPUT")
    if not target:
        return
    with open(target, "a", encoding="utf-8", errors="backslashreplace") as f:
        for k, v in outputs.items():
            if "\n" in v or "\r" in v:  # a value over lines (a folder's name) in GitHub's multi-line form
                delimiter = f"ghadelimiter_{uuid.uuid4().hex}"
                f.write(f"{k}<<{delimiter}\n{v}\n{delimiter}\n")
            else:
                f.write(f"{k}={v}\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m oracle.render.github", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("annotate", help="annotations and step outputs from REPORT_DIR/report.json")
    a.add_argument("report_dir", type=Path)
    a.add_argument("--exit-code", type=int, default=None, help="oracle run's exit code (default: the report's)")
    a.add_argument("--config", default=None, help="the config file, to attach the annotations to")
    args = p.parse_args(argv)
    return annotate(args.report_dir, args.exit_code, args.config, sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
