"""Production mode running while invariant mode runs (oracle.threaded_mode; its engine's start alone, oracle.overlap,
where production localizes), for kinds whose engines live apart: the report is the same as a sequential run's but
for its timings, a fault in either mode still ends in a report that names it, and the timings say what ran
alongside what."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import apart_engine
import pytest
import yaml
from run_process import finish

from oracle.config import EngineConfig, parse_config
from oracle.engines.kinds import BUILTIN, EngineKind
from oracle.overlap import ENV
from oracle.render.timings import timing_line
from oracle.runner import run

SUPPORT = Path(__file__).resolve().parents[1] / "support"


def _config(model: Path, out: Path, **options: Any) -> dict[str, Any]:
    return {
        "model": str(model),
        "engine": {"kind": "apart_engine:ApartEngine", "options": options},
        "prompts": {"random": {"count": 3, "min_len": 2, "max_len": 5}},
        "sampling": {"max_tokens": 4},
        "schedule": {"trials": 20, "seed": 7, "batch_size": [1, 12], "repeat_trials": 3},
        "report_dir": str(out),
    }


def _without_timings(out: Path) -> dict[str, Any]:
    report = json.loads((out / "report.json").read_text())
    report.pop("timings")
    return report


@pytest.mark.parametrize("options", [{}, {"diverge_from_batch": 5, "diverge_step": 1},
                                     {"diverge_from_batch": 3, "diverge_mode": "production"}])
def test_overlapped_report_equals_the_sequential_one(fake_model: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch, options: dict[str, Any]) -> None:
    """Byte for byte, timings aside: a clean run, an invariance failure (shrunk), production drift."""
    out = tmp_path / "r"  # one folder: the config (and so the report) names it
    monkeypatch.setenv(ENV, "0")
    run(parse_config(_config(fake_model, out, **options)))
    seq = _without_timings(out)
    monkeypatch.setenv(ENV, "1")
    report = run(parse_config(_config(fake_model, out, **options)))
    assert "overlap_s" in report.timings  # it did overlap
    assert json.dumps(seq, sort_keys=True) == json.dumps(_without_timings(out), sort_keys=True)


def test_production_that_localizes_only_starts_beside(fake_model: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Production localizing drift (the run's one repro is the first localized op's): its engine starts while
    invariant mode runs, its phases run after invariant mode's, and the report is a sequential run's."""
    out = tmp_path / "r"
    cfg = _config(fake_model, out, diverge_from_batch=3, diverge_mode="production")
    cfg["checks"] = {"drift": {"requirement": "report", "localize": "first"}}
    monkeypatch.setenv(ENV, "0")
    run(parse_config(cfg))
    seq = _without_timings(out)
    monkeypatch.setenv(ENV, "1")
    report = run(parse_config(cfg))
    assert "production_start_wait_s" in report.timings and "production_wait_s" not in report.timings
    assert json.dumps(seq, sort_keys=True) == json.dumps(_without_timings(out), sort_keys=True)


def test_production_starts_while_invariant_runs(fake_model: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    apart_engine.EVENTS.clear()
    report = run(parse_config(_config(fake_model, tmp_path / "r", start_s=0.3, sleep_s=0.01)))
    at = {(m, what): t for m, what, t in apart_engine.EVENTS}
    assert at[("production", "start")] < at[("invariant", "close")]  # started before invariant mode ended
    assert at[("production", "start")] >= at[("invariant", "started")]  # once invariant's engine was up
    t = report.timings
    assert t["production_engine_start_s"] >= 0.3  # its own start
    assert t["overlap_s"] > 0.2 and t["production_wait_s"] >= 0  # production ran while invariant mode did
    line = timing_line(t)
    assert line is not None and "production (beside invariant" in line and "wall clock" in line


def test_both_starts_at_once_where_the_row_allows(fake_model: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    apart_engine.EVENTS.clear()
    cfg = _config(fake_model, tmp_path / "r", start_s=0.3)
    cfg["engine"]["kind"] = "apart_engine:TogetherEngine"
    report = run(parse_config(cfg))
    at = {(m, what): t for m, what, t in apart_engine.EVENTS}
    assert at[("production", "start")] < at[("invariant", "started")]  # beside invariant's start
    assert report.timings["overlap_s"] > 0.2


def test_sequential_when_turned_off_or_not_apart(fake_model: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "0")
    apart_engine.EVENTS.clear()
    report = run(parse_config(_config(fake_model, tmp_path / "off")))
    order = [(m, what) for m, what, _ in apart_engine.EVENTS]
    assert order.index(("production", "start")) > order.index(("invariant", "close"))
    assert "overlap_s" not in report.timings
    monkeypatch.delenv(ENV)
    cfg = _config(fake_model, tmp_path / "fake")
    cfg["engine"]["kind"] = "fake_engine:FakeEngine"  # declares nothing: its engines may share this process
    assert "overlap_s" not in run(parse_config(cfg)).timings


def test_production_start_failing_while_invariant_runs(fake_model: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant mode completes and is judged; the report says production's start failed (exit 3), the same
    report as a sequential run's."""
    seen = []
    for value in ("0", "1"):
        monkeypatch.setenv(ENV, value)
        report = run(parse_config(_config(fake_model, tmp_path / "r", fail_start="production")))
        seen.append(_without_timings(tmp_path / "r"))
    assert "overlap_s" in report.timings
    assert report.exit_code() == 3 and report.error is not None
    assert "production mode's engine did not start" in report.error and "planted production start failure" in report.error
    assert report.check("invariance").verdict == "pass"  # type: ignore[union-attr]
    assert not report.environment["engines"].get("production")
    assert seen[0] == seen[1]


def test_invariant_fault_closes_the_production_engine(fake_model: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    apart_engine.EVENTS.clear()
    report = run(parse_config(_config(fake_model, tmp_path / "r", fail_after_calls=10)))
    assert report.exit_code() == 3 and "planted engine failure" in (report.error or "")
    def left_running() -> int:
        events = [(m, what) for m, what, _ in apart_engine.EVENTS]
        return events.count(("production", "started")) - events.count(("production", "close"))

    deadline = time.monotonic() + 10  # an engine still starting when the run stopped is closed once it is up
    while left_running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left_running() == 0  # never left running


def test_rows_declare_it() -> None:
    """vLLM's worker and a server per mode live apart; native and transformers override ops in this process."""
    cfg = EngineConfig.model_validate({"kind": "vllm"})
    rows: dict[str, EngineKind] = BUILTIN
    assert rows["vllm"].starts_apart(cfg)
    for name in ("native", "transformers"):
        assert not rows[name].starts_apart(EngineConfig.model_validate({"kind": name}))
    server = EngineConfig.model_validate({"kind": "openai", "options": {
        "command": ["{python}", "-m", "vllm.entrypoints.openai.api_server", "--host", "{host}"]}})
    assert rows["openai"].starts_apart(server)
    shared = EngineConfig.model_validate({"kind": "openai", "options": {
        "base_url": "http://127.0.0.1:8000"}})
    assert not rows["openai"].starts_apart(shared)


def test_vllm_beside_halves_gpu_memory_only_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from oracle.models import memory

    cfg = EngineConfig.model_validate({"kind": "vllm"})
    beside = BUILTIN["vllm"].beside
    monkeypatch.setattr(memory, "gpus_free", lambda: None)
    assert beside(cfg) == cfg  # a CPU: nothing changes
    assert BUILTIN["vllm"].starts_together(cfg)  # and both starts may run at once
    monkeypatch.setattr(memory, "gpus_free", lambda: memory.Memory(80 << 30, "GPU memory"))
    assert beside(cfg).options["engine_args"]["gpu_memory_utilization"] == 0.45
    assert not BUILTIN["vllm"].starts_together(cfg)  # a GPU: the second start waits for the first engine
    own = EngineConfig.model_validate({"kind": "vllm", "options": {
        "engine_args": {"gpu_memory_utilization": 0.3}}})
    assert beside(own).options["engine_args"]["gpu_memory_utilization"] == 0.3  # the user's setting wins


@pytest.mark.parametrize(("sig", "code", "name"), [(signal.SIGINT, 130, "SIGINT"), (signal.SIGTERM, 143, "SIGTERM")])
def test_signal_mid_overlap_writes_a_partial_report(fake_model: Path, tmp_path: Path, sig: int, code: int,
                                                    name: str) -> None:
    """`oracle run` (a real subprocess) signalled while invariant mode runs and production's start hangs beside
    it: exit 130/143, a partial report, no wait for the hung start."""
    cfg = _config(fake_model, tmp_path / "report", hang_start="production", sleep_s=0.02, announce=True)
    cfg["schedule"]["trials"] = 200
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")]),
           "CI": "1", "PYTHONUNBUFFERED": "1"}
    env.pop(ENV, None)
    proc = subprocess.Popen([sys.executable, "-m", "oracle", "run", str(path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "fake engine: invariant call 20" in line:  # references done, trials under way
            break
    proc.send_signal(sig)
    err = finish(proc, timeout=60)
    assert proc.returncode == code, err
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["complete"] is False and report["error"] == f"interrupted ({name})"
    inv = next(c for c in report["checks"] if c["name"] == "invariance")
    assert 0 < inv["trials"] < 200  # what invariant mode completed is judged
