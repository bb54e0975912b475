"""The engine contract (oracle.engines.contract): the required members, the optional capabilities an engine
declares, and the watchdog's GuardedEngine exposing each of them under its deadline."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from oracle.config import parse_config
from oracle.engines.contract import (
    Capabilities,
    Completion,
    Mode,
    Request,
    RunSpec,
    SamplingParams,
    StepEvidence,
    StopsAtEos,
    capabilities,
    class_needs_weights,
    missing_members,
)
from oracle.errors import ConfigError, EngineError
from oracle.execute import fresh, generate
from oracle.lifecycle.exit_trap import ENGINE_THREAD
from oracle.lifecycle.watchdog import GuardedEngine, build_engine
from oracle.localize import can_localize
from oracle.runner import run

# Only what every engine must have: mode, generate, describe, close. Outputs are a function of the prompt,
# so they are the same in any batch; the evidence says who shared each pass.
MINIMAL_ENGINE = '''
from oracle.engines.contract import Completion, StepEvidence


class MinimalEngine:
    def __init__(self, model, mode):
        self.mode = mode

    def generate(self, requests, max_num_batched_tokens=None):
        out = []
        for r in requests:
            n = r.sampling.max_tokens
            out.append(Completion(
                r.request_id, [(sum(r.prompt_token_ids) + i) % 97 for i in range(n)],
                [-0.25 * (i + 1) for i in range(n)],
                evidence=[StepEvidence(i, len(requests), len(requests), i == 0, token_index=i) for i in range(n)]))
        return out

    def describe(self):
        return {"engine": "minimal", "invariance_mechanism": "none"}

    def close(self):
        pass
'''

GREEDY = SamplingParams(max_tokens=3, logits="none")


def _requests(n: int = 2) -> list[Request]:
    return [Request(f"trial-{i}", (i + 1, 2, 3), GREEDY) for i in range(n)]


def _completion(r: Request, tokens: int | None = None) -> Completion:
    n = r.sampling.max_tokens if tokens is None else tokens
    return Completion(r.request_id, [1] * n, [-0.5] * n, evidence=[StepEvidence(0, 1, 1, True)])


class Minimal:
    """The required members only."""

    def __init__(self, mode: Mode = "production") -> None:
        self.mode: Mode = mode
        self.threads: list[str] = []

    def generate(self, requests: Sequence[Request], max_num_batched_tokens: int | None = None) -> list[Completion]:
        self.threads.append(threading.current_thread().name)
        return [_completion(r) for r in requests]

    def describe(self) -> dict[str, Any]:
        return {"engine": "minimal"}

    def close(self) -> None:
        pass


class Capable(Minimal):
    """Every optional capability, each call recorded with the thread it ran on."""

    stop_at_eos = True
    eos_token_ids = (1,)  # _completion's token
    op_packages = ("my_ops",)

    def __init__(self, mode: Mode = "production", hang: str = "") -> None:
        super().__init__(mode)
        self.hang = hang
        self.calls: list[tuple[str, str]] = []
        self.timed = False
        self.forward_seconds = 0.0

    def _call(self, name: str) -> None:
        self.calls.append((name, threading.current_thread().name))
        if self.hang == name:
            RELEASE.wait(60)  # a watchdog that never gives up fails the test after 60 s, never hangs the suite

    def generate(self, requests: Sequence[Request], max_num_batched_tokens: int | None = None) -> list[Completion]:
        self._call("generate")
        return [_completion(r, tokens=1) for r in requests]  # stopped at EOS after one token

    def reset_prefix_cache(self) -> None:
        self._call("reset_prefix_cache")

    def capture(self, run: RunSpec, rows: Any) -> Completion:
        self._call("capture")
        return _completion(run.requests[run.target_index])

    def localize(self, expected: RunSpec, actual: RunSpec, repro_dir: Path | None = None) -> Any:
        self._call("localize")
        return None

    def localize_layout(self, forward_pass: int, kwargs: dict[str, Any], target_index: int) -> Any:
        return None


RELEASE = threading.Event()


@pytest.fixture(autouse=True)
def _release_hangs() -> Iterator[None]:
    RELEASE.clear()
    yield
    RELEASE.set()  # an abandoned call ends with the test


def test_an_engine_with_only_the_required_members_runs_every_check_it_can(fake_model: Path, tmp_path: Path) -> None:
    (tmp_path / "minimal_engine.py").write_text(MINIMAL_ENGINE)
    config = parse_config({
        "model": str(fake_model), "base_dir": str(tmp_path),
        "engine": {"kind": "minimal_engine:MinimalEngine", "timeout_s": 30},
        "prompts": {"random": {"count": 2, "min_len": 2, "max_len": 5}},
        "sampling": {"max_tokens": 3},
        "schedule": {"trials": 6, "seed": 1, "batch_size": [1, 4], "repeat_trials": 1},
        "checks": {"prefix_cache": "warn"},
        "report_dir": str(tmp_path / "report"),
    })
    report = run(config)
    assert report.error is None and report.exit_code() == 0
    assert report.check("invariance").verdict == "pass"  # type: ignore[union-attr]
    assert report.check("repeatability").verdict == "pass"  # type: ignore[union-attr]
    assert report.environment["engines"]["invariant"]["engine"] == "minimal"
    prefix = report.check("prefix_cache")  # needs ResetsPrefixCache: skipped with a note, not an error
    assert prefix is not None and prefix.verdict == "skipped" and "without prefix caching" in prefix.message


def test_an_engine_that_declares_nothing_has_every_capability_off() -> None:
    engine = Minimal()
    assert capabilities(engine) == Capabilities()
    assert not can_localize(engine)
    guarded = GuardedEngine(engine, 5.0)
    assert guarded.capabilities == Capabilities() and guarded.stop_at_eos is False and guarded.op_packages == ()
    with pytest.raises(EngineError, match=r"no reset_prefix_cache\(\) .*ResetsPrefixCache"):
        guarded.reset_prefix_cache()
    with pytest.raises(EngineError, match=r"no capture\(\)"):
        guarded.capture(RunSpec(tuple(_requests(1)), 0), object())  # type: ignore[arg-type]
    # fresh() runs without a reset; a short completion is an engine error (it does not stop at EOS).
    assert len(fresh(guarded, _requests())) == 2

    class Short(Minimal):
        def generate(self, requests: Sequence[Request], max_num_batched_tokens: int | None = None) -> list[Completion]:
            return [_completion(r, tokens=1) for r in requests]

    with pytest.raises(EngineError, match="production engine, request trial-0: 1 tokens for max_tokens 3"):
        generate(Short(), _requests())


def test_declared_capabilities_are_seen_and_called_through_the_watchdog() -> None:
    engine = Capable()
    assert capabilities(engine) == Capabilities(stop_at_eos=True, eos_token_ids=(1,), reset_prefix_cache=True,
                                                capture=True,
                                                localize=True, localize_layout=True, op_packages=("my_ops",),
                                                forward_timing=True)
    guarded = GuardedEngine(engine, 5.0)
    assert guarded.capabilities == capabilities(engine) == capabilities(guarded)
    assert guarded.stop_at_eos and guarded.op_packages == ("my_ops",) and can_localize(guarded)
    assert guarded.eos_token_ids == (1,) and isinstance(guarded, StopsAtEos)
    spec = RunSpec(tuple(_requests(1)), 0)
    guarded.reset_prefix_cache()
    assert guarded.capture(spec, object()).request_id == "trial-0"  # type: ignore[arg-type]
    assert guarded.localize(spec, spec) is None
    out = fresh(guarded, _requests())  # one token each: allowed, the engine stops at EOS
    assert [len(c.token_ids) for c in out] == [1, 1]
    names = [name for name, _ in engine.calls]
    assert names == ["reset_prefix_cache", "capture", "localize", "reset_prefix_cache", "generate"]
    assert {thread for _, thread in engine.calls} == {ENGINE_THREAD}  # every call on the watchdog's thread


@pytest.mark.parametrize(("hang", "call", "expected"), [
    ("reset_prefix_cache", lambda g: g.reset_prefix_cache(),
     "engine reset_prefix_cache did not return within 0.2 s (engine.timeout_s) during the production engine's "
     "reset_prefix_cache()"),
    ("capture", lambda g: g.capture(RunSpec(tuple(_requests(1)), 0), object()),
     "engine capture did not return within 0.2 s (engine.timeout_s) during the production engine's capture"),
    ("capture", lambda g: g.capture(RunSpec(tuple(_requests(1)), 0, warm_with=tuple(_requests(1))), object()),
     "engine capture did not return within 0.4 s (2 x engine.timeout_s)"),
    ("localize", lambda g: g.localize(RunSpec(tuple(_requests(1)), 0), RunSpec(tuple(_requests(2)), 1)),
     "engine localize did not return within 0.6 s (3 x engine.timeout_s) during the production engine's localize"),
])
def test_a_hanging_capability_call_times_out_into_an_engine_error(hang: str, call: Any, expected: str) -> None:
    guarded = GuardedEngine(Capable(hang=hang), 0.2)
    with pytest.raises(EngineError) as info:
        call(guarded)
    assert expected in str(info.value)


def test_no_capture_or_localize_starts_beside_an_abandoned_call() -> None:
    """Once a call timed out its thread may still drive the engine: a later localize or capture is refused at
    once (a note in a run), never run beside it."""
    guarded = GuardedEngine(Capable(hang="localize"), 0.1)
    spec = RunSpec(tuple(_requests(1)), 0)
    with pytest.raises(EngineError, match="did not return"):
        guarded.localize(spec, spec)
    for again in (lambda: guarded.localize(spec, spec), lambda: guarded.capture(spec, object())):
        with pytest.raises(EngineError, match="not started: an earlier call on the production engine was abandoned"):
            again()


def test_a_capability_that_raises_is_an_engine_error_naming_it() -> None:
    class Raising(Capable):
        def reset_prefix_cache(self) -> None:
            raise RuntimeError("cache is gone")

    with pytest.raises(EngineError, match="engine raised RuntimeError in reset_prefix_cache: cache is gone"):
        GuardedEngine(Raising(), 5.0).reset_prefix_cache()


def test_the_guard_passes_no_undeclared_attribute_through() -> None:
    guarded = GuardedEngine(Capable(), 5.0)
    with pytest.raises(AttributeError):
        guarded.forward_seconds  # type: ignore[attr-defined]  # noqa: B018 - bench times unguarded engines
    assert not hasattr(guarded, "calls")


@pytest.mark.parametrize(("members", "missing"), [
    ({"mode": "production", "generate": lambda *a: [], "describe": lambda: {}, "close": lambda: None}, []),
    ({"generate": lambda *a: [], "describe": lambda: {}, "close": lambda: None}, ["mode"]),
    ({"mode": "production", "generate": None, "describe": lambda: {}}, ["generate", "close"]),
])
def test_missing_members_names_what_the_engine_lacks(members: dict[str, Any], missing: list[str]) -> None:
    engine = type("Engine", (), {})()
    for name, value in members.items():
        setattr(engine, name, value)
    assert missing_members(engine) == missing


def test_a_custom_engine_without_close_is_a_config_error(tmp_path: Path) -> None:
    source = MINIMAL_ENGINE.replace("    def close(self):\n        pass\n", "")
    (tmp_path / "closeless_engine.py").write_text(source)
    cfg = parse_config({"model": "m", "engine": {"kind": "closeless_engine:MinimalEngine"},
                        "prompts": {"random": {"count": 1}}, "base_dir": str(tmp_path)}).engine
    with pytest.raises(ConfigError, match=r"engine.kind: closeless_engine:MinimalEngine lacks close"):
        build_engine(cfg, tmp_path, "production")


def test_needs_weights_unless_the_class_says_not() -> None:
    class Server:
        needs_weights = False

    assert class_needs_weights(Minimal) is True and class_needs_weights(Server) is False
