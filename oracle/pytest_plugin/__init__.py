"""The pytest plugin (entry point `pytest11`, name `oracle`; `-p no:oracle` turns it off).

- options `--oracle-config`, `--oracle-seed N|last`, `--oracle-trials`, `--oracle-report-dir`,
  `--oracle-db PATH` (failing trials of earlier sessions replayed first; oracle.example_db);
- an `oracle` fixture (session scope) with `assert_batch_invariant`, `assert_matches_golden`,
  `record_golden` and `run`;
- a `@pytest.mark.oracle(trials=, seed=, config=, checks=, engine=, model=)` marker, validated
  when the test is set up;
- `oracle*.yaml` / `oracle*.yml` files collected as one item per check;
- an "oracle" section in the terminal summary: every run's config, seed, verdicts and report.

The seed is drawn once per session by the controller, shown in the header, kept in
`config.stash`, handed to pytest-xdist workers in `workerinput`, and saved in pytest's cache so
that `--oracle-seed last` reuses it. This module imports neither torch nor an engine nor the
runner: they load when a run starts.
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path
from typing import Any

import pytest

from oracle.pytest_plugin.items import OracleFile, is_oracle_config
from oracle.pytest_plugin.runs import (
    MARKER_HELP,
    STATE,
    USER_PROPERTY,
    Current,
    MarkerSettings,
    OracleSession,
    RunRecord,
    SessionState,
    validate_marker,
)

CACHE_KEY = "oracle/seed"


def _seed_option(value: str) -> int | str:
    if value == "last":
        return value
    try:
        seed = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'last', got {value!r}") from None
    if seed < 0:
        raise argparse.ArgumentTypeError(f"expected a seed >= 0, got {seed}")
    return seed


def _trials_option(value: str) -> int:
    try:
        trials = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of trials, got {value!r}") from None
    if trials < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1 trial, got {trials}")
    return trials


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("oracle", "oracle determinism checks")
    group.addoption("--oracle-config", metavar="PATH", default=None,
                    help="base config for the oracle fixture (default: a tiny random Qwen3 on the CPU)")
    group.addoption("--oracle-seed", metavar="N|last", type=_seed_option, default=None,
                    help="schedule seed for every oracle run (overrides configs' schedule.seed); "
                         "'last' reuses the previous session's; default: drawn once per session")
    group.addoption("--oracle-trials", metavar="N", type=_trials_option, default=None,
                    help="trials per run, over config files and the fixture's default "
                         "(a marker's or a call's trials= still wins)")
    group.addoption("--oracle-report-dir", metavar="DIR", default=None,
                    help="where each run's report folder goes (default: pytest's cache, .pytest_cache/d/oracle)")
    group.addoption("--oracle-db", metavar="PATH", default=None,
                    help="example database folder: every run replays the failing trials saved there first and "
                         "saves its own (default: none, nothing written)")
    group.addoption("--oracle-gpu-per-worker", choices=("auto", "off"), default="auto",
                    help="pytest-xdist: give each worker one of the GPUs CUDA_VISIBLE_DEVICES lets the session see "
                         "when there are several (auto, the default), or every worker all of them (off)")


def _draw() -> int:
    return random.SystemRandom().randrange(2**32)


def _session_seed(config: pytest.Config) -> tuple[int, bool, str]:
    """(seed, forced, where it came from). Workers take the controller's; the controller saves it."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and "oracle_seed" in workerinput:
        return int(workerinput["oracle_seed"]), bool(workerinput["oracle_seed_forced"]), "from the controller"
    option = config.getoption("oracle_seed")
    cache = getattr(config, "cache", None)
    if isinstance(option, int):
        seed, forced, source = option, True, "--oracle-seed"
    elif option == "last":
        previous = cache.get(CACHE_KEY, None) if cache is not None else None
        if isinstance(previous, dict) and isinstance(previous.get("seed"), int):
            seed, forced, source = previous["seed"], bool(previous.get("forced")), "last"
        else:
            seed, forced, source = _draw(), False, "drawn: no previous seed in the cache"
    else:
        seed, forced, source = _draw(), False, "drawn"
    if cache is not None and workerinput is None:
        cache.set(CACHE_KEY, {"seed": seed, "forced": forced})
    return seed, forced, source


def _report_root(config: pytest.Config) -> Path:
    option = config.getoption("oracle_report_dir")
    if option:
        return Path(option).expanduser().resolve()
    cache = getattr(config, "cache", None)
    if cache is not None:
        return cache.mkdir("oracle")
    return Path(tempfile.mkdtemp(prefix="oracle-"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)
    device = getattr(config, "workerinput", {}).get("oracle_cuda_device")
    if isinstance(device, str):  # an xdist worker: its one GPU, set before any test imports torch
        import os

        from oracle.pytest_plugin.gpus import ENV

        os.environ[ENV] = device
    seed, forced, source = _session_seed(config)
    base = config.getoption("oracle_config")
    state = SessionState(
        seed=seed, seed_forced=forced, seed_source=source, trials=config.getoption("oracle_trials"),
        base_config=Path(base).expanduser().resolve() if base else None, report_root=_report_root(config),
    )
    db = config.getoption("oracle_db")
    state.example_db = Path(db).expanduser().resolve() if db else None
    config.stash[STATE] = state
    config.pluginmanager.register(_Summary(state), "oracle-summary")


def pytest_report_header(config: pytest.Config) -> str:
    state = config.stash[STATE]
    scope = "over configs' schedule.seed" if state.seed_forced else "where no config or marker pins one"
    return (f"oracle: seed {state.seed} ({state.seed_source}; used {scope}); "
            f"reuse with --oracle-seed {state.seed} or --oracle-seed last")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist, on the controller: hand each worker the session seed."""
    state = node.config.stash[STATE]
    node.workerinput["oracle_seed"] = state.seed
    node.workerinput["oracle_seed_forced"] = state.seed_forced
    if node.config.getoption("oracle_gpu_per_worker") == "auto":
        import os

        from oracle.pytest_plugin.gpus import visible_devices, worker_device

        devices = state.devices if state.devices is not None else visible_devices(os.environ)
        state.devices = devices  # listed once per session, on the controller
        device = worker_device(str(node.workerinput.get("workerid", "")), devices)
        if device is not None:
            node.workerinput["oracle_cuda_device"] = device


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> OracleFile | None:
    if is_oracle_config(file_path):
        return OracleFile.from_parent(parent, path=file_path)  # type: ignore[no-any-return]
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Validate the test's `oracle` marker before its fixtures run; make it the current test."""
    state = item.config.stash[STATE]
    state.current = None
    mark = item.get_closest_marker("oracle")
    settings = MarkerSettings()
    error: str | None = None
    if mark is not None:
        try:
            settings = validate_marker(mark, item.path.parent)
        except ValueError as e:
            error = f"@pytest.mark.oracle: {e}"
    if error:  # failed outside the except block, so no chained traceback is shown
        pytest.fail(error, pytrace=False)
    state.current = Current(item, settings)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    item.config.stash[STATE].current = None


@pytest.fixture(scope="session")
def oracle(pytestconfig: pytest.Config) -> OracleSession:
    """Run oracle from a test: `oracle.assert_batch_invariant(prompts, ...)`, `oracle.run(config)`."""
    return OracleSession(pytestconfig.stash[STATE])


class _Summary:
    """Collects every run (from xdist workers too, through the reports' user_properties) and lists them."""

    def __init__(self, state: SessionState) -> None:
        self.state = state

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "teardown":  # teardown's user_properties hold every run of the test
            return
        self.state.runs += [RunRecord.from_json(str(v)) for k, v in report.user_properties if k == USER_PROPERTY]

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.state.runs:
            return
        terminalreporter.section("oracle")
        for r in self.state.runs:
            verdicts = ", ".join(f"{k} {v}" for k, v in r.verdicts.items()) or "no check judged"
            # The words the CLI and summary.md use (`reported`, `passed with warnings`).
            status = r.headline or ("passed" if r.exit_code == 0 else f"FAILED (exit {r.exit_code})")
            terminalreporter.write_line(f"{r.label}: {status}, seed {r.seed}: {verdicts}")
            terminalreporter.write_line(f"    config {r.source}; report {r.report}")
            if r.error:
                from oracle.render.verdict import error_label

                terminalreporter.write_line(f"    {error_label(r.exit_code)}: {r.error}")
