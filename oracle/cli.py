"""The `oracle` command. Imports torch and engines lazily, so --help and config errors are instant.

Expected errors (config, model, engine) become one line on stderr and an exit code:
0 every required check passed, 1 a required check failed or was vacuous, 2 usage or config
error, 3 engine or infrastructure error (the partial report is still written), 130 interrupted
(SIGINT), 143 terminated (SIGTERM). A subcommand is a parser in `_parser` and a handler in `HANDLERS`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from oracle import cli_bench
from oracle.errors import ConfigError, OracleError
from oracle.lifecycle import signals
from oracle.lifecycle.exit_trap import ExitCalled

if TYPE_CHECKING:
    from oracle.config import Config


def _int_at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer >= low (and <= high) (the error names the option: `argument --trials: ...`)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be <= {high}, got {value}")
        return value

    return parse


def _err(line: str) -> None:
    """One line on stderr; user strings in it (paths, engine errors) never reach the terminal as escapes."""
    from oracle.render.escape import terminal_text

    print(terminal_text(line, newlines=True), file=sys.stderr)


class UsageError(SystemExit):
    """A wrong command line (exit 2, as argparse's own): `message` is argparse's, already said in one line."""

    def __init__(self, message: str) -> None:
        super().__init__(2)
        self.message = message


class _Parser(argparse.ArgumentParser):
    """argparse's parser, its usage error one line on stderr naming the command and where its help is (a CI
    log shows the error, not a usage block to read past)."""

    def error(self, message: str) -> NoReturn:
        _err(f"{self.prog}: error: {message} (see {self.prog} --help)")
        raise UsageError(message)


# `oracle run`'s options that take a value: the first other word is the config (read from a wrong command line).
_RUN_VALUED = ("--report-dir", "--seed", "--trials", "--model", "--set", "--db", "--shard")


def _run_paths(words: list[str]) -> tuple[Path | None, Path | None]:
    """The config and `--report-dir` of an `oracle run` command line that argparse refused, as far as they
    can be told from its words."""
    config: Path | None = None
    report_dir: Path | None = None
    i = 0
    while i < len(words):
        word = words[i]
        if word in _RUN_VALUED:
            if word == "--report-dir" and i + 1 < len(words):
                report_dir = Path(words[i + 1])
            i += 2
            continue
        if word.startswith("--report-dir="):
            report_dir = Path(word.partition("=")[2])
        elif not word.startswith("-") and config is None and word:
            config = Path(word)
        i += 1
    return config, report_dir


def _refused_run(argv: list[str], e: UsageError) -> None:
    """`oracle run` refused by argparse: an earlier run's report where this run would write says so."""
    if not argv or argv[0] != "run":
        return
    with signals.deferred():
        from oracle.lifecycle.run_guard import replace_stale_report
    config, report_dir = _run_paths(argv[1:])
    replace_stale_report(config, report_dir, ConfigError(f"oracle run: {e.message}"))


def _folder(text: str) -> Path:
    """An argparse type: a folder's path, never empty (`Path("")` would be the working directory)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty folder name (an unset variable?)")
    return Path(text)


def _shard(text: str) -> tuple[int, int]:
    """An argparse type: `I/N` (oracle.shards.assign.parse_shard), the error naming --shard."""
    from oracle.shards.assign import parse_shard

    try:
        return parse_shard(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--shard: ")) from None


TRUST_HELP = ("re-run a config that loads code (a custom engine, preload modules, a server command, process "
              "environment): only for a report whose source you trust")


def _setting(text: str) -> tuple[str, object]:
    """An argparse type: `FIELD=VALUE` -> (dotted field, VALUE parsed as a YAML scalar or flow value)."""
    import yaml

    from oracle.config import MAX_SET_DEPTH, nesting_depth

    field, sep, raw = text.partition("=")
    names = field.split(".")
    if not sep or not all(n.isidentifier() for n in names):
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE with a dotted field name, got {text[:200]!r}")
    if len(names) > MAX_SET_DEPTH:
        raise argparse.ArgumentTypeError(f"{field[:80]}...: {len(names):,} names deep (at most {MAX_SET_DEPTH})")
    try:
        value = yaml.safe_load(raw) if raw.strip() else raw
        depth = nesting_depth(value)
    except yaml.YAMLError as e:
        raise argparse.ArgumentTypeError(f"{field}: VALUE is not YAML ({e})") from e
    except RecursionError:
        depth = MAX_SET_DEPTH + len(names) + 1
    if depth + len(names) > MAX_SET_DEPTH:
        raise argparse.ArgumentTypeError(f"{field}: VALUE is nested too deeply (a field at most {MAX_SET_DEPTH} "
                                         "levels deep, its name included)")
    return field, value


def _parser() -> argparse.ArgumentParser:
    from oracle import __version__

    p = _Parser(prog="oracle", description="Bitwise determinism test oracle for LLM inference.")
    p.add_argument("--version", action="version", version=f"oracle {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run every check of a config and write a report")
    r.add_argument("config", type=Path)
    r.add_argument("--report-dir", type=Path, default=None, help="where report.json goes (default: the config's)")
    r.add_argument("--seed", type=_int_at_least(0, 2**63 - 1), default=None,
                   help="schedule seed (default: the config's, else random)")
    r.add_argument("--trials", type=_int_at_least(1), default=None, help="override schedule.trials")
    r.add_argument("--model", default=None, help="override model: preset:NAME, a checkpoint folder (relative to "
                                                 "the working directory) or a hub id")
    r.add_argument("--set", dest="settings", type=_setting, action="append", default=[], metavar="FIELD=VALUE",
                   help="override one config field by its dotted name, VALUE read as YAML (repeatable), e.g. "
                        "--set engine.options.engine_args.attention_backend=TRITON_ATTN")
    r.add_argument("--db", type=Path, default=None, metavar="PATH",
                   help="example database folder: failing trials of earlier runs are replayed first, this "
                        "run's are saved (default: none, nothing written)")
    r.add_argument("--shard", type=_shard, default=None, metavar="I/N",
                   help="run only shard I of N (0-based) of the seed's schedule; `oracle merge` joins the shards")

    mg = sub.add_parser("merge", help="merge the shard folders of one run into the report the unsharded run gives")
    mg.add_argument("shards", type=_folder, nargs="+", metavar="DIR", help="the shards' report folders")
    mg.add_argument("--report-dir", type=Path, default=Path("oracle-report"),
                    help="where the merged report goes (default: oracle-report)")
    mg.add_argument("--trust-report", action="store_true",
                    help="a failing run is shrunk on an engine started from the shards' config: " + TRUST_HELP)

    rp = sub.add_parser("replay", help="rerun one trial of a report and show its divergence")
    rp.add_argument("report", type=Path)
    rp.add_argument("--trial", type=_int_at_least(0), required=True)
    rp.add_argument("--mode", choices=["invariant", "production"], default=None,
                    help="default: the mode the report's divergence was found in")
    rp.add_argument("--trust-report", action="store_true", help=TRUST_HELP)

    lo = sub.add_parser("localize", help="rerun one trial of a report with per-op capture; name the first op that differs")
    lo.add_argument("report", type=Path)
    lo.add_argument("--trial", type=int, required=True)
    lo.add_argument("--trust-report", action="store_true", help=TRUST_HELP)

    rec = sub.add_parser("record", help="write a golden file of the invariant references")
    rec.add_argument("config", type=Path)
    rec.add_argument("--golden", type=Path, required=True)

    pm = sub.add_parser("pin-map", help="pin a report's variance map (checks.drift.localize) in a golden file")
    pm.add_argument("report", type=Path)
    pm.add_argument("--golden", type=Path, required=True)

    cli_bench.add_parser(sub, _int_at_least(1))

    m = sub.add_parser("model", help="make checkpoints")
    msub = m.add_subparsers(dest="model_command", required=True)
    mk = msub.add_parser("make", help="write an HF-format checkpoint with seeded random weights")
    mk.add_argument("preset")
    mk.add_argument("dir", type=Path)
    mk.add_argument("--seed", type=_int_at_least(0), default=0)
    msub.add_parser("presets", help="list the presets")

    c = sub.add_parser("config", help="config helpers")
    csub = c.add_subparsers(dest="config_command", required=True)
    csub.add_parser("schema", help="print the config's JSON Schema")
    csub.add_parser("reference", help="print the config reference (Markdown)")
    ci = csub.add_parser("init", help="write a working example config to start from (default: oracle.yaml)")
    ci.add_argument("path", nargs="?", type=Path, default=None, help="the file to write (default: oracle.yaml)")
    pick = ci.add_mutually_exclusive_group()
    # The kinds are the engine rows' (oracle.engines.kinds), checked when the example is written: --help
    # stays instant, without the config's models.
    pick.add_argument("--engine", default=None, metavar="KIND",
                      help="the example of a built-in engine kind (default: native, a tiny model on the CPU; "
                           "an unknown kind's error lists them)")
    pick.add_argument("--example", default=None, help="a shipped example by name (tiny, gpu, server, vllm-gpu, ...; "
                                                       "custom-engine writes a custom engine's module beside its config)")
    ci.add_argument("--force", action="store_true", help="overwrite the file if it exists")
    return p


def _run(args: argparse.Namespace) -> int:
    # A signal while these load is held until they are whole, then raised: the handler that replaces an
    # earlier run's report imports them again, and a module cut in half by the signal would break it.
    with signals.deferred():
        from oracle.lifecycle import supervise
    if args.supervise and not supervise.is_child():
        return supervise.supervised(args, _checked_config)  # the run in a child, started at once
    with signals.deferred():
        import oracle.config  # noqa: F401 - _checked_config's
        from oracle.lifecycle.run_guard import RunGuard
    child = supervise.is_child()
    if child:
        supervise.warm_up()  # torch imported while the parent reads the config
    config = _checked_config(args)
    report_dir = args.report_dir or Path(config.report_dir)
    # Checked, and any earlier run's report replaced by a "started" one, before any model is made.
    blame = "--report-dir" if args.report_dir else None
    # The child adopts the started report its parent wrote: one write per state, one writer for the run.
    with RunGuard(config, report_dir, args.seed, blame=blame, announce=not child, adopt=child) as guard:
        if child:
            supervise.warmed()
        # torch's import runs C++ that calls back into Python (torch.distributed's init): a signal raised
        # there aborts the process (C++ terminate). Held until the import is whole, it stops the run as
        # any signal does: a partial report and 130/143.
        with signals.deferred():
            import torch  # noqa: F401
        from oracle.render.console import ConsoleObserver, make_console, print_summary
        from oracle.render.files import write_formats
        from oracle.runner import run

        console = make_console()
        report = run(config, seed=guard.seed, observer=ConsoleObserver(console), report_dir=report_dir,
                     views=[write_formats], example_db=args.db, shard=args.shard, writer=guard.writer)
    print_summary(console, report, str(report_dir / "report.json"))
    for mode, described in report.environment.get("engines", {}).items():
        if isinstance(described, dict) and described.get("close_error"):
            _err(f"oracle: warning: {mode} engine: {described['close_error']}")
    if report.error:
        _err(f"oracle: error: {report.error} (partial report in {report_dir})")
    return report.exit_code()


def _overrides(args: argparse.Namespace) -> tuple[dict[str, object], dict[str, str]]:
    """The fields the command line sets (--trials, --model, --set) and the flag that set each."""
    overrides: dict[str, object] = {}
    if args.trials is not None:
        overrides["schedule.trials"] = args.trials
    if args.model is not None:  # a folder given on the command line is the working directory's, not the config's
        overrides["model"] = str(Path(args.model).resolve()) if Path(args.model).is_dir() else args.model
    flags = {"schedule.trials": "--trials", "model": "--model"}
    for field, value in args.settings:  # --trials and --model win over a --set of the same field
        if field not in overrides:
            overrides[field] = value
            flags[field] = f"--set {field}"
    return overrides, {k: flags[k] for k in overrides}


def _checked_config(args: argparse.Namespace) -> Config:
    """`oracle run`'s config with the command line's settings, its engine's packages and device checked; on
    a failure, an earlier run's report in the folder this run would write is replaced (it must not outlive it)."""
    from oracle.config import load_config
    from oracle.lifecycle import supervise
    from oracle.lifecycle.run_guard import replace_stale_report

    overrides, flags = _overrides(args)
    try:
        # The run's child runs the config its parent resolved and its seed (sent through a pipe), parsed once.
        handed = supervise.inherited_run()
        config, args.seed = handed or (load_config(args.config, overrides or None, flags=flags or None), args.seed)
        from oracle.engines import check_engine_packages

        check_engine_packages(config.engine)  # a missing package is known before the report folder is touched
        from oracle.engines import check_device

        check_device(config.engine)  # so is a CUDA device this torch cannot give
        if args.shard is not None and args.seed is None and config.schedule.seed is None:
            # Each shard draws the whole schedule from the seed and keeps its slice: a seed drawn per process
            # would slice a different schedule in every shard.
            raise ConfigError("--shard: give every shard the same --seed S (or set schedule.seed in the config); "
                              "without one each shard would draw its own schedule")
    except (Exception, KeyboardInterrupt) as e:  # any cause: an earlier run's report must not stand for this one
        replace_stale_report(args.config, args.report_dir, e)
        raise
    return config


def _merge(args: argparse.Namespace) -> int:
    from oracle.render.console import ConsoleObserver, make_console, print_summary
    from oracle.render.files import write_formats
    from oracle.shards.merge import merge

    console = make_console()
    report = merge(args.shards, args.report_dir, observer=ConsoleObserver(console), views=[write_formats],
                   trusted=args.trust_report)
    print_summary(console, report, str(args.report_dir / "report.json"))
    if report.error:
        _err(f"oracle: error: {report.error} (partial report in {args.report_dir})")
    return report.exit_code()


def _replay(args: argparse.Namespace) -> int:
    from oracle.render.console import make_console
    from oracle.replay import replay

    r = replay(args.report, args.trial, args.mode, trusted=args.trust_report)
    console = make_console()
    t = r.trial
    console.print(f"trial {t.trial_id} ({r.mode}): batch {t.batch_size}, target {t.target} at position "
                  f"{t.position}, budget {t.max_num_batched_tokens}")
    d = r.divergence
    rec = r.recorded
    if d is None:
        console.print("no divergence: the target is bitwise equal to its solo run")
        if rec is not None:
            console.print(f"the report had a divergence at step {rec.step} ({rec.kind}, ULP {rec.ulp})")
        return 0
    console.print(f"divergence at step {d.step} ({d.kind}): token {d.expected_token} -> {d.actual_token}, "
                  f"logprob {d.expected_logprob!r} -> {d.actual_logprob!r}, ULP {d.ulp}, "
                  f"max |dlogit| {d.max_abs_logits_diff}, margin {d.reference_margin}")
    if rec is None:
        console.print("the report had no divergence for this trial")
    elif (rec.step, rec.kind, rec.ulp) == (d.step, d.kind, d.ulp):
        console.print("same as the report")
    else:
        console.print(f"the report had step {rec.step} ({rec.kind}, ULP {rec.ulp})")
    return 1


def _localize(args: argparse.Namespace) -> int:
    from oracle.localize import localize_from_report
    from oracle.render.console import make_console

    op = localize_from_report(args.report, args.trial, args.report.parent / "repro", trusted=args.trust_report)
    console = make_console()
    if op is None:
        console.print(f"trial {args.trial}: no op differs for the target: it is bitwise equal to its solo run")
        return 0
    console.print(f"trial {args.trial}: {op.describe()}")
    if op.confirm_note:
        console.print(f"confirmation: {op.confirm_note}")
    if op.repro:
        console.print(f"one-op repro: {op.repro} (python {op.repro}/repro.py)")
    return 1


def _record(args: argparse.Namespace) -> int:
    from oracle.config import load_config
    from oracle.render.console import ConsoleObserver, make_console
    from oracle.runner import record_golden

    config = load_config(args.config)
    golden = record_golden(config, args.golden, ConsoleObserver(make_console()))
    print(f"wrote {len(golden['targets'])} target digests to {args.golden}")
    return 0


def _pin_map(args: argparse.Namespace) -> int:
    from oracle.golden import pin_variance_map
    from oracle.report import load_report

    golden = pin_variance_map(args.golden, load_report(args.report))
    print(f"pinned {len(golden['variance_map']['ops'])} batch-variant ops in {args.golden}")
    return 0


def _model(args: argparse.Namespace) -> int:
    from oracle.models import PRESETS, make_model

    if args.model_command == "presets":
        from oracle.render.console import make_console, print_presets

        print_presets(make_console(), PRESETS)
        return 0
    path = make_model(args.preset, args.dir, seed=args.seed)
    print(f"wrote {args.preset} (seed {args.seed}) to {path}")
    return 0


def _config(args: argparse.Namespace) -> int:
    if args.config_command == "init":
        from oracle.example_configs import FILE_EXAMPLES, default_path, write_example

        path = args.path or default_path(args.example)
        name = write_example(path, engine=args.engine, name=args.example, force=args.force)
        beside = FILE_EXAMPLES[name].beside if name in FILE_EXAMPLES else ()
        also = f" (and {', '.join(str(path.parent / f) for f in beside)})" if beside else ""
        run = f"; run it with: oracle run {path}" if name not in FILE_EXAMPLES or FILE_EXAMPLES[name].is_config else ""
        print(f"wrote the {name} example to {path}{also}{run}")
        return 0
    if args.config_command == "reference":
        from oracle.render.config_reference import render_reference

        print(render_reference(), end="")
        return 0
    from oracle.config import Config

    print(json.dumps(Config.model_json_schema(), indent=2))
    return 0


HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": _run, "merge": _merge, "replay": _replay, "localize": _localize, "record": _record, "pin-map": _pin_map, "bench": cli_bench.command, "model": _model,
    "config": _config,
}


def main(argv: list[str] | None = None, *, supervise: bool = False) -> int:
    """Parse, run the subcommand's handler with SIGINT/SIGTERM routed to `Interrupted`, map errors to codes.

    `supervise`: `oracle run` runs in a child process and this one keeps the exit code true to the
    report whatever the child does (see `oracle.lifecycle.supervise`); the console script and `python -m oracle`.
    """
    from oracle.lifecycle import supervise as supervision

    if supervision.is_child():
        supervision.watch_parent()
    with signals.handled(ignore_when_settled=supervise):
        # A signal while the arguments are read is held and raised inside the `try` below, where
        # `oracle run` still replaces an earlier run's report before it stops.
        signals.hold()
        try:
            args = _parser().parse_args(argv)  # usage errors exit 2 here, in one line
        except BaseException as e:
            signals.release(raise_held=False)
            if isinstance(e, UsageError):
                _refused_run(sys.argv[1:] if argv is None else list(argv), e)
            raise
        args.supervise, args.argv = supervise, argv
        try:
            signals.release()
            return HANDLERS[args.command](args)
        except OracleError as e:
            _err(f"oracle: error: {e}")
            return e.exit_code
        except KeyboardInterrupt as e:
            return _stopped(args, e)
        except SystemExit as e:  # from an engine or a user's module: never a silent pass
            print(f"oracle: error: {e} was called during the run" if isinstance(e, ExitCalled)
                  else f"oracle: error: sys.exit({e.code!r}) was called during the run", file=sys.stderr)
            return 3
        except OSError as e:
            _err(f"oracle: error: {e}")
            return 3
        except Exception as e:  # a case no handler names: one line and exit 3, never a traceback and exit 1
            _err(f"oracle: error: {type(e).__name__}: {e}")
            return 3


def _stopped(args: argparse.Namespace, e: KeyboardInterrupt) -> int:
    """A signal stopped the command: say where its report says so, and exit 130/143."""
    where = getattr(e, "report_dir", None)
    if where is None and args.command == "run":  # stopped before the run's guard was in place
        from oracle.lifecycle.run_guard import replace_stale_report

        replace_stale_report(args.config, args.report_dir, e)
        where = getattr(e, "report_dir", None)
    told = f"the report in {where} says so" if where else "no report was written"
    _err(f"oracle: {signals.describe(e)}; stopped ({told})")
    return signals.exit_code_of(e)


def entry() -> None:
    """The console script `oracle` (and `python -m oracle`): `oracle run` is supervised."""
    from oracle.lifecycle import supervise

    code = main(supervise=True)
    if supervise.is_child():
        supervise.exit_child(code)  # report.json is written: skip the interpreter's teardown
    sys.exit(code)


if __name__ == "__main__":
    entry()
