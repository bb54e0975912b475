"""A compiled vLLM engine localizes in an eager twin: one twin for the localizations that follow each other,
the compiled worker started again only when a request needs it, never two of the engine's workers alive at
once (they would share the device), and nothing left running after close. The workers here are stand-ins
that record what was started and stopped; the real worker's localization runs in the vLLM tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from oracle.config import EngineConfig
from oracle.engines import vllm_engine
from oracle.engines.contract import RunSpec
from oracle.errors import EngineError


class Workers:
    """Every stand-in worker started, in order, and a check that no two run at once."""

    def __init__(self) -> None:
        self.started: list[Worker] = []
        self.fail_next_localize = False
        self.error_next_localize = False  # an error reply from a live worker
        self.own: vllm_engine.WorkerSpec | None = None  # the engine's own spec (its first worker's)

    def alive(self) -> list[Worker]:
        return [w for w in self.started if not w.stopped]

    def kinds(self) -> list[str]:
        return [w.kind for w in self.started]


class Proc:
    """The worker's process as the engine reads it: alive until the stand-in says it died."""

    def __init__(self) -> None:
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


class Worker:
    def __init__(self, workers: Workers, spec: vllm_engine.WorkerSpec) -> None:
        assert not workers.alive(), "a worker started while another of the engine's was running"
        self.workers, self.spec = workers, spec
        self.kind = "eager" if spec.enforce_eager else "compiled"
        self.info: dict[str, Any] = {}
        self.stopped = False
        self.proc = Proc()
        if workers.own is None:
            workers.own = spec
        workers.started.append(self)

    def call(self, msg: tuple[Any, ...], timeout_s: float) -> Any:
        assert not self.stopped
        if msg[0] == "localize":
            assert self.kind == "eager", "localized in a compiled worker"
            if self.workers.fail_next_localize:
                self.workers.fail_next_localize = False
                self.proc.returncode = -9
                raise EngineError("vllm worker died during localize")
            if self.workers.error_next_localize:
                self.workers.error_next_localize = False
                raise EngineError("vllm worker: localize failed: ValueError")
            return {"op": None, "seconds": {"capture": 0.5, "rule": 0.25}}  # the worker's answer
        own = self.spec == self.workers.own  # the engine's own worker (eager for an eager engine), not a twin
        assert own, f"{msg[0]} sent to the eager twin"
        return [] if msg[0] == "generate" else True

    def stop(self) -> None:
        self.stopped = True


@pytest.fixture
def workers(monkeypatch: pytest.MonkeyPatch) -> Workers:
    record = Workers()
    monkeypatch.setattr(vllm_engine._Worker, "start",
                        classmethod(lambda cls, spec, env, timeout_s: Worker(record, spec)))
    return record


def _engine(tmp_path: Path, enforce_eager: bool) -> vllm_engine.VllmEngine:
    (tmp_path / "config.json").write_text("{}")
    config = EngineConfig.of("vllm", enforce_eager=enforce_eager, audit=False)
    return vllm_engine.VllmEngine(tmp_path, "invariant", config)


SPEC = RunSpec((), 0)


def test_consecutive_localizations_share_one_twin_and_the_compiled_worker_waits_for_a_request(
        tmp_path: Path, workers: Workers) -> None:
    engine = _engine(tmp_path, enforce_eager=False)
    assert engine.localize(SPEC, SPEC) is None
    # TimesItsLocalize: the worker's parts, and the twin's start where this call started it
    assert set(engine.localize_seconds) == {"eager_twin_start", "capture", "rule"}
    assert engine.localize_seconds["capture"] == 0.5
    assert engine.localize(SPEC, SPEC) is None
    assert engine.localize_seconds == {"capture": 0.5, "rule": 0.25}  # the twin was running: no start this time
    assert workers.kinds() == ["compiled", "eager"]  # one twin, the compiled worker not restarted in between
    assert engine.generate([]) == []
    assert workers.kinds() == ["compiled", "eager", "compiled"] and [w.kind for w in workers.alive()] == ["compiled"]
    engine.reset_prefix_cache()
    engine.localize(SPEC, SPEC)
    assert workers.kinds() == ["compiled", "eager", "compiled", "eager"]
    engine.close()
    assert workers.alive() == []
    with pytest.raises(EngineError, match="closed"):
        engine.generate([])
    with pytest.raises(EngineError, match="closed"):
        engine.localize(SPEC, SPEC)
    assert len(workers.started) == 4  # nothing started after close


def test_a_twin_that_failed_is_not_used_again(tmp_path: Path, workers: Workers) -> None:
    engine = _engine(tmp_path, enforce_eager=False)
    workers.fail_next_localize = True
    with pytest.raises(EngineError, match="localize"):
        engine.localize(SPEC, SPEC)
    assert workers.alive() == []  # the failed twin stopped; the compiled worker waits for a request
    engine.localize(SPEC, SPEC)
    assert workers.kinds() == ["compiled", "eager", "eager"]
    engine.generate([])
    engine.close()
    assert workers.alive() == []


def test_a_twin_that_answered_with_an_error_stays(tmp_path: Path, workers: Workers) -> None:
    engine = _engine(tmp_path, enforce_eager=False)
    workers.error_next_localize = True
    with pytest.raises(EngineError, match="localize failed"):
        engine.localize(SPEC, SPEC)
    engine.localize(SPEC, SPEC)
    assert workers.kinds() == ["compiled", "eager"]  # the same twin served the next one
    engine.close()
    assert workers.alive() == []


def test_an_eager_engine_localizes_in_its_own_worker(tmp_path: Path, workers: Workers) -> None:
    engine = _engine(tmp_path, enforce_eager=True)
    engine.localize(SPEC, SPEC)
    engine.generate([])
    assert workers.kinds() == ["eager"]
    engine.close()
    assert workers.alive() == []


class Spares:
    """Stands in for the engine's spares: which environments were spawned ahead, taken and left."""

    def __init__(self) -> None:
        self.spawned: list[dict[str, str]] = []
        self.taken: list[dict[str, str]] = []

    def spawn(self, env: dict[str, str]) -> None:
        self.spawned.append(env)

    def take(self, env: dict[str, str]) -> None:
        self.taken.append(env)


@pytest.mark.parametrize(("enforce_eager", "start_together", "gpu", "ahead"), [
    (False, True, True, True),    # compiled, each KV cache given, on a GPU: the twin's import done ahead
    (False, False, True, False),  # vLLM measures the free memory as engines start: nothing spawned beside it
    (True, True, True, False),    # eager: no twin
    (False, True, False, False),  # no GPU: the CPU's starts need no spare
])
def test_the_eager_twin_is_spawned_ahead_only_where_nothing_measures_memory(
        tmp_path: Path, workers: Workers, monkeypatch: pytest.MonkeyPatch, enforce_eager: bool, start_together: bool,
        gpu: bool, ahead: bool) -> None:
    spares = Spares()
    monkeypatch.setattr(vllm_engine, "_SPARES", spares)
    monkeypatch.setattr(vllm_engine, "_sees_a_gpu", lambda: gpu)
    (tmp_path / "config.json").write_text("{}")
    config = EngineConfig.of("vllm", enforce_eager=enforce_eager, start_together=start_together, audit=False)
    engine = vllm_engine.VllmEngine(tmp_path, "invariant", config)
    assert spares.spawned == ([engine.env] if ahead else [])
    engine.close()
    assert spares.taken == ([engine.env] if ahead else [])  # a spare nobody took is stopped with the engine
