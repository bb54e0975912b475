"""What the pytest plugin's `oracle` fixture does: build a config, run it, record it, assert on it.

Precedence, nearest the test first: a helper's own arguments, then the test's
`@pytest.mark.oracle(...)`, then the command line (`--oracle-trials`, `--oracle-seed N`), then the
config file, then the session seed. A seed drawn for the session (or reused with `last` from a
session that drew it) fills in only where nothing pins one; `--oracle-seed N` overrides config
files as the CLI's `--seed` does.

The runner (and with it torch and the engines) is imported when a run starts, not before.
"""

from __future__ import annotations

import copy
import json
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from oracle.errors import OracleError
from oracle.pytest_plugin.failure import describe_failure
from oracle.render.verdict import headline, is_warning, shown_verdict

if TYPE_CHECKING:
    from typing import TypeAlias

    from oracle.config import Config
    from oracle.report import Report

    Prompts: TypeAlias = str | Sequence[str | Sequence[int]]
    ConfigSource: TypeAlias = Config | str | os.PathLike[str] | Mapping[str, Any]

MARKER_HELP = ("oracle(trials=N, seed=N, config=PATH, checks={name: requirement}, engine=KIND, model=SPEC): "
               "settings for the oracle fixture's runs in this test")

# The fixture's base config when neither --oracle-config nor a marker's config= gives one:
# the embedded default (a tiny random Qwen3 on the CPU), smaller than configs/tiny.yaml.
DEFAULT_CONFIG: dict[str, Any] = {
    "model": "preset:tiny-qwen3",
    "engine": {"kind": "native", "device": "cpu", "dtype": "float32", "max_num_seqs": 64,
               "max_num_batched_tokens": 256, "enable_prefix_caching": True, "num_threads": 1},
    "prompts": {"random": {"count": 4, "min_len": 8, "max_len": 32, "seed": 0}},
    "sampling": {"max_tokens": 8, "temperature": 0.0, "logits": "full"},
    "schedule": {"trials": 20, "batch_size": [1, 16], "filler_len": [1, 48], "filler_max_tokens": [1, 12],
                 "arrival_step": [0, 2], "max_num_batched_tokens": [32, 256], "repeat_trials": 4},
}


class OracleWarning(UserWarning):
    """A check at requirement `warn` failed, was vacuous or errored."""


@dataclass(frozen=True)
class MarkerSettings:
    """The validated arguments of `@pytest.mark.oracle(...)`."""

    trials: int | None = None
    seed: int | None = None
    config: Path | None = None
    checks: dict[str, str] | None = None
    engine: str | None = None
    model: str | None = None


_MARKER_TYPES: dict[str, tuple[type, ...]] = {
    "trials": (int,), "seed": (int,), "config": (str, os.PathLike), "checks": (dict,), "engine": (str,),
    "model": (str,),
}


def validate_marker(mark: pytest.Mark, test_dir: Path) -> MarkerSettings:
    """Raise ValueError naming the argument on a positional argument, an unknown name or a wrong type."""
    _check_names(mark)
    for name, value in mark.kwargs.items():
        _check_type(name, value)
    kw = dict(mark.kwargs)
    for name, low in (("trials", 1), ("seed", 0)):
        if kw.get(name) is not None and kw[name] < low:
            raise ValueError(f"{name}= must be >= {low}, got {kw[name]}")
    if "checks" in kw:
        _validate_checks(kw["checks"])
    if "config" in kw:
        path = Path(kw["config"]).expanduser()
        kw["config"] = path if path.is_absolute() else test_dir / path
    return MarkerSettings(**kw)


def _check_names(mark: pytest.Mark) -> None:
    """Keyword arguments only, each one the marker knows."""
    if mark.args:
        raise ValueError(f"takes keyword arguments only ({', '.join(f'{k}=' for k in _MARKER_TYPES)}), "
                         f"got positional {mark.args!r}")
    unknown = sorted(set(mark.kwargs) - set(_MARKER_TYPES))
    if unknown:
        raise ValueError(f"unknown argument{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                         f"expected some of {', '.join(_MARKER_TYPES)}")


def _check_type(name: str, value: object) -> None:
    types = _MARKER_TYPES[name]
    if isinstance(value, bool) or not isinstance(value, types):
        want = " or ".join("path" if t is os.PathLike else t.__name__ for t in types)
        raise ValueError(f"{name}= must be {want}, got {type(value).__name__} {value!r}")


def _validate_checks(checks: dict[str, Any]) -> None:
    from pydantic import ValidationError

    from oracle.config import ChecksConfig

    try:
        ChecksConfig.model_validate(checks)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        msg = "unknown check" if err["type"] == "extra_forbidden" else err["msg"]
        raise ValueError(f"checks={checks!r}: {where}: {msg}") from None


@dataclass(frozen=True)
class RunRecord:
    """One oracle run of the session, for the terminal summary (crosses xdist as JSON)."""

    label: str
    source: str
    seed: int
    exit_code: int
    verdicts: dict[str, str]
    report: str
    error: str | None = None
    headline: str = ""  # the CLI's and summary.md's word for the run: passed, passed with warnings, ...

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RunRecord:
        return cls(**json.loads(text))


@dataclass
class Current:
    """The test being run and its marker's settings."""

    item: pytest.Item
    settings: MarkerSettings


@dataclass
class SessionState:
    """Everything the plugin keeps for a session, in `config.stash`."""

    seed: int
    seed_forced: bool  # --oracle-seed N (or `last` after one): overrides config files' schedule.seed
    seed_source: str
    trials: int | None
    base_config: Path | None
    report_root: Path
    current: Current | None = None
    example_db: Path | None = None  # --oracle-db: failing trials of earlier sessions, replayed first
    runs: list[RunRecord] = field(default_factory=list)
    run_dirs: set[Path] = field(default_factory=set)
    devices: list[str] | None = None  # pytest-xdist: the GPUs the caller lets the session see (controller)


STATE = pytest.StashKey[SessionState]()
USER_PROPERTY = "oracle_run"


class OracleSession:
    """What the `oracle` fixture gives a test: runs of oracle.runner.run with readable assertions."""

    def __init__(self, state: SessionState) -> None:
        self._state = state

    @property
    def seed(self) -> int:
        """The session seed: used by every run whose config, marker or call pins none."""
        return self._state.seed

    def run(self, config: ConfigSource | None = None, *, seed: int | None = None, trials: int | None = None,
            **overrides: Any) -> Report:
        """Run a config (a Config, a YAML path, a mapping; default: the base config) and return its Report.

        `overrides`: `section={...}` merges into that section, `section__field=value` sets one field.
        Never asserts; a config or model error fails the test with its one-line message.
        """
        __tracebackhide__ = True
        return self._run_data(self._base(config), seed=seed, trials=trials, overrides=overrides)[0]

    def assert_batch_invariant(self, prompts: Prompts | None = None, *, engine: str | Mapping[str, Any] | None = None,
                               model: str | os.PathLike[str] | None = None, trials: int | None = None,
                               seed: int | None = None, checks: Mapping[str, Any] | None = None,
                               config: str | os.PathLike[str] | None = None, **overrides: Any) -> Report:
        """Run `prompts` (texts, or lists of token ids) under the schedule; fail unless every
        required check passes: each prompt's outputs under every trial are bitwise equal to its solo
        run (invariance), repeatable, and faithful to production.
        """
        __tracebackhide__ = True
        report, path = self._run_data(self._base(config), seed=seed, trials=trials, overrides=overrides,
                                      prompts=prompts, engine=engine, model=model, checks=checks)
        if report.exit_code() != 0:
            raise AssertionError(describe_failure(report, path))
        return report

    def assert_matches_golden(self, golden_file: str | os.PathLike[str], prompts: Prompts | None = None, *,
                              engine: str | Mapping[str, Any] | None = None,
                              model: str | os.PathLike[str] | None = None, trials: int | None = None,
                              seed: int | None = None, checks: Mapping[str, Any] | None = None,
                              config: str | os.PathLike[str] | None = None, **overrides: Any) -> Report:
        """Run with the `golden` check required against `golden_file` (written by `oracle record`
        or `record_golden`): each target's invariant solo outputs equal the recorded digests, bitwise.
        """
        __tracebackhide__ = True
        golden = {"golden": {"requirement": "required", "file": str(Path(golden_file).resolve())}}
        report, path = self._run_data(self._base(config), seed=seed, trials=trials, overrides=overrides,
                                      prompts=prompts, engine=engine, model=model,
                                      checks={**(checks or {}), **golden})
        if report.exit_code() != 0:
            raise AssertionError(describe_failure(report, path))
        return report

    def record_golden(self, golden_file: str | os.PathLike[str], prompts: Prompts | None = None, *,
                      engine: str | Mapping[str, Any] | None = None, model: str | os.PathLike[str] | None = None,
                      config: str | os.PathLike[str] | None = None, **overrides: Any) -> Path:
        """Write a golden file of the invariant solo references (what `oracle record` writes)."""
        __tracebackhide__ = True
        from oracle.config import parse_config
        from oracle.runner import record_golden

        run_dir = self._run_dir()
        data = self._apply(self._base(config)[0], run_dir, prompts=prompts, engine=engine, model=model,
                           checks=None, overrides=overrides)
        try:
            record_golden(parse_config(data, source=self._label()), Path(golden_file))
            return Path(golden_file)
        except OracleError as e:
            error = f"oracle: {e}"
        pytest.fail(error, pytrace=False)

    # -- the machinery shared with collected YAML files --------------------------------------

    def run_config(self, config: Config, label: str, source: str, *, seed: int | None = None,
                   run_dir: Path | None = None, warn: bool = True) -> tuple[Report, Path]:
        """Run a parsed config into a fresh report folder; record it for the summary. Raises OracleError."""
        from oracle.lifecycle.run_guard import RunGuard
        from oracle.render.files import write_formats
        from oracle.runner import run

        run_dir = run_dir or self._run_dir(label)
        config = config.model_copy(update={"report_dir": str(run_dir)})
        # As `oracle run` does: the folder checked and any earlier report replaced by a "started" one
        # before the model is made; `os._exit` from an engine or preload module is an engine error here.
        with RunGuard(config, run_dir, self._seed(config, seed), announce=False) as guard:
            report = run(config, seed=guard.seed, report_dir=run_dir, views=[write_formats],
                         example_db=self._state.example_db, writer=guard.writer)
        path = run_dir / "report.json"
        self._record(RunRecord(label, source, report.seed, report.exit_code(),
                               {c.name: shown_verdict(c) for c in report.checks}, str(path), report.error,
                               headline(report)))
        for c in report.checks if warn else ():
            if is_warning(c):
                # stacklevel 4: the test's line (test -> helper -> _run_data -> run_config)
                warnings.warn(OracleWarning(f"oracle {c.name} [{c.requirement}]: {shown_verdict(c)}: {c.message} "
                                            f"({path})"),
                              stacklevel=4)
        return report, path

    def _run_data(self, base: tuple[dict[str, Any], str], *, seed: int | None, trials: int | None, overrides: Mapping[str, Any],
                  prompts: Prompts | None = None, engine: str | Mapping[str, Any] | None = None,
                  model: str | os.PathLike[str] | None = None,
                  checks: Mapping[str, Any] | None = None) -> tuple[Report, Path]:
        __tracebackhide__ = True
        from oracle.config import parse_config

        data, source = base
        marker = self._marker()
        label = self._label()
        run_dir = self._run_dir(label)
        data = self._apply(data, run_dir, prompts=prompts, engine=engine if engine is not None else marker.engine,
                           model=model if model is not None else marker.model,
                           checks={**(marker.checks or {}), **(checks or {})}, overrides=overrides)
        trials = next((t for t in (trials, marker.trials, self._state.trials) if t is not None), None)
        if trials is not None:
            data.setdefault("schedule", {})["trials"] = trials
        pinned = seed if seed is not None else marker.seed
        try:
            config = parse_config(data, source=label)
            return self.run_config(config, label, source, seed=pinned, run_dir=run_dir)
        except OracleError as e:
            error = f"oracle: {e}"
        pytest.fail(error, pytrace=False)

    def _seed(self, config: Config, pinned: int | None) -> int:
        if pinned is not None:
            return pinned
        if self._state.seed_forced or config.schedule.seed is None:
            return self._state.seed
        return config.schedule.seed

    def _base(self, config: ConfigSource | None) -> tuple[dict[str, Any], str]:
        """The config to start from, as data, and where it came from: the argument, else the
        marker's config=, else --oracle-config, else the fixture's default."""
        __tracebackhide__ = True
        from oracle.config import Config, load_config

        if config is None:
            config = self._marker().config or self._state.base_config
        if config is None:
            return copy.deepcopy(DEFAULT_CONFIG), "the fixture's default config"
        if isinstance(config, Config):
            return config.model_dump(mode="json"), "a Config"
        if isinstance(config, Mapping):
            return copy.deepcopy(dict(config)), "a mapping"
        try:
            return load_config(Path(config)).model_dump(mode="json"), str(config)
        except OracleError as e:
            error = f"oracle: {e}"
        pytest.fail(error, pytrace=False)

    def _apply(self, data: dict[str, Any], run_dir: Path, *, prompts: Prompts | None,
               engine: str | Mapping[str, Any] | None, model: str | os.PathLike[str] | None,
               checks: Mapping[str, Any] | None, overrides: Mapping[str, Any]) -> dict[str, Any]:
        if model is not None:
            data["model"] = str(model)
        if engine is not None:
            _apply_engine(data, engine)
        if prompts is not None:
            data["prompts"] = prompts_section(prompts, run_dir)
        _apply_checks(data, checks or {})
        _apply_overrides(data, overrides)
        data.setdefault("base_dir", str(self._test_dir()))
        return data

    def _marker(self) -> MarkerSettings:
        cur = self._state.current
        return cur.settings if cur is not None else MarkerSettings()

    def _label(self) -> str:
        cur = self._state.current
        return cur.item.nodeid if cur is not None else "session"

    def _test_dir(self) -> Path:
        cur = self._state.current
        return cur.item.path.parent if cur is not None else Path.cwd()

    def run_dir_for(self, label: str) -> Path:
        """The report folder of the run labelled `label` (a collected config file's node id)."""
        return self._run_dir(label)

    def _run_dir(self, label: str | None = None) -> Path:
        """A report folder of its own for each run: ROOT/<test id>[-N]."""
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", label or self._label()).strip("-.") or "run"
        name = name[-120:]
        path, n = self._state.report_root / name, 1
        while path in self._state.run_dirs:
            n += 1
            path = self._state.report_root / f"{name}-{n}"
        self._state.run_dirs.add(path)
        return path

    def _record(self, record: RunRecord) -> None:
        cur = self._state.current
        if cur is not None:
            cur.item.user_properties.append((USER_PROPERTY, record.to_json()))
        else:
            self._state.runs.append(record)


def prompts_section(prompts: Prompts, run_dir: Path) -> dict[str, Any]:
    """`prompts:` for texts (tokenized by the model's tokenizer) or token ids (a JSONL file in `run_dir`)."""
    items = [prompts] if isinstance(prompts, str) else list(prompts)
    if not items:
        raise ValueError("prompts is empty")
    rows = [_prompt_row(i, p) for i, p in enumerate(items)]
    if all("prompt" in r for r in rows):
        return {"texts": [r["prompt"] for r in rows]}
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"file": str(path.resolve())}


def _prompt_row(i: int, p: object) -> dict[str, Any]:
    """A prompts file's row for a text or a non-empty list of token ids; TypeError for anything else."""
    if isinstance(p, str):
        return {"name": f"prompt-{i}", "prompt": p}
    if isinstance(p, Sequence) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        return {"name": f"prompt-{i}", "prompt_token_ids": list(p)}
    raise TypeError(f"prompts[{i}]: expected a string or a non-empty list of token ids, got {p!r}")


def _apply_engine(data: dict[str, Any], engine: str | Mapping[str, Any]) -> None:
    """`engine=`: a kind, or engine fields, over the base config's engine."""
    kind = engine if isinstance(engine, str) else engine.get("kind")
    base = data.get("engine", {})
    if isinstance(kind, str) and ":" in kind and kind != base.get("kind", "native"):
        # The base's engine fields and options were written for its own kind; a custom engine is
        # given the fields its constructor names (oracle.engines.custom_engine_kwargs), at their defaults.
        base = {k: v for k, v in base.items() if k in ("preload", "timeout_s")}
    data["engine"] = dict(base)
    _merge(data["engine"], {"kind": engine} if isinstance(engine, str) else engine)


def _apply_checks(data: dict[str, Any], checks: Mapping[str, Any]) -> None:
    """`checks=`: a check's requirement (a string, kept with its other settings) or its whole section."""
    for name, value in checks.items():
        node = data.setdefault("checks", {})
        if isinstance(value, str) and isinstance(node.get(name), dict):
            node[name] = {**node[name], "requirement": value}
        else:
            node[name] = copy.deepcopy(value)


def _apply_overrides(data: dict[str, Any], overrides: Mapping[str, Any]) -> None:
    """`schedule__trials=8`: each `__`-separated path set, a mapping merged into the mapping it lands on."""
    for key, value in overrides.items():
        path = key.split("__")
        node = data
        for k in path[:-1]:
            node = node.setdefault(k, {})
        if isinstance(value, Mapping) and isinstance(node.get(path[-1]), dict):
            _merge(node[path[-1]], value)
        else:
            node[path[-1]] = copy.deepcopy(value)


def _merge(into: dict[str, Any], new: Mapping[str, Any]) -> None:
    for k, v in new.items():
        if isinstance(v, Mapping) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = copy.deepcopy(v)

