"""Engines that misbehave in process, and report folders that cannot hold a report: a clear exit code,
and report.json's `exit_code` always the process's."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from oracle.cli import main


def _config(model: Path, tmp_path: Path, **options: Any) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({
        "model": str(model),
        "engine": {"kind": "fake_engine:FakeEngine", "options": options},
        "prompts": {"random": {"count": 2, "min_len": 2, "max_len": 4}},
        "sampling": {"max_tokens": 3},
        "schedule": {"trials": 10, "seed": 3, "batch_size": [1, 6], "repeat_trials": 2},
        "report_dir": str(tmp_path / "report"),
    }))
    return path


def _report(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "report" / "report.json").read_text())  # type: ignore[no-any-return]


def test_sys_exit_in_generate_is_an_engine_error_not_a_pass(
    fake_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", str(_config(fake_model, tmp_path, fault_after_calls=4, fault="sys_exit"))])
    err = capsys.readouterr().err
    assert code == 3, err
    assert "sys.exit(0)" in err
    report = _report(tmp_path)
    assert report["complete"] is False and report["exit_code"] == 3 and "sys.exit(0)" in report["error"]


def test_an_exception_in_close_is_a_note_in_the_report(
    fake_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", str(_config(fake_model, tmp_path, close_raises=True))])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "planted close failure" in err
    report = _report(tmp_path)
    assert report["exit_code"] == code == 0 and report["complete"] is True
    for mode in ("invariant", "production"):
        assert "planted close failure" in report["environment"]["engines"][mode]["close_error"]


@pytest.mark.parametrize("where", ["file", "under_a_file", "read_only"])
def test_unusable_report_folder_is_exit_2_before_any_model(
    where: str, fake_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file")
    target = {"file": blocker, "under_a_file": blocker / "sub", "read_only": tmp_path / "ro"}[where]
    if where == "read_only":
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only folder")
        target.mkdir()
        target.chmod(0o500)
    # A preset that is not made yet: an unusable folder must stop the run before the model is made.
    path = tmp_path / "c.yaml"
    path.write_text(f"model: preset:tiny-qwen3\nmodel_seed: 999\nprompts: {{random: {{count: 1}}}}\n"
                    f"report_dir: {target}\n")
    cache = tmp_path / "cache"
    monkeypatch.setenv("ORACLE_CACHE_DIR", str(cache))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{path}:4: report_dir:" in err and str(target) in err, err
    assert main(["run", str(path), "--report-dir", str(target)]) == 2
    assert capsys.readouterr().err.startswith("oracle: error: --report-dir: ")
    assert not cache.exists()  # no model was made


def test_model_error_after_start_keeps_exit_codes_equal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model that fails to load: exit 2, and the started report says 2 too (not a stale or a 3)."""
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"junk")
    path = tmp_path / "c.yaml"
    path.write_text(f"model: {model}\nprompts: {{random: {{count: 1}}}}\nreport_dir: {tmp_path / 'report'}\n")
    code = main(["run", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    report = _report(tmp_path)
    assert report["exit_code"] == 2 and report["complete"] is False and str(model) in report["error"]


def test_an_engine_that_finishes_starting_as_its_deadline_passes_is_closed(
        fake_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The constructor returns in the instant the start deadline passes (the watchdog raises although the
    engine exists): build_engine closes it, so a server or worker it started never outlives the error."""
    import fake_engine

    from oracle.config import EngineConfig
    from oracle.errors import EngineError
    from oracle.lifecycle import watchdog
    from oracle.lifecycle.watchdog import build_engine

    made: list[object] = []
    closed: list[object] = []
    monkeypatch.setattr(fake_engine.FakeEngine, "close", lambda self: closed.append(self))

    def finished_then_late(fn: Any, *args: Any, **kwargs: Any) -> Any:
        made.append(fn())  # the engine is built ...
        raise EngineError("the invariant engine's start did not finish within 1 s")  # ... but too late

    monkeypatch.setattr(watchdog, "call", finished_then_late)
    with pytest.raises(EngineError, match="did not finish"):
        build_engine(EngineConfig.of("fake_engine:FakeEngine"), fake_model, "invariant")
    assert len(made) == 1 and closed == made


def test_engine_error_is_worded_in_one_place_for_every_site(tmp_path: Path) -> None:
    """Whatever an engine raises, at start, in generate or in another call, reads the same way."""
    from oracle.config import EngineConfig
    from oracle.engines.custom import construct_class
    from oracle.errors import ConfigError, EngineError, engine_error

    told = ConfigError("engine.options.x: wrong")
    assert engine_error(told, "generate") is told  # a user's error keeps its words and exit 2
    assert str(engine_error(SystemExit(4), "reset_prefix_cache")) == "engine called sys.exit(4) in reset_prefix_cache"
    assert str(engine_error(KeyError("k"))) == "engine raised KeyError: 'k'"

    class Fails:
        def __init__(self, model: Path, mode: str) -> None:
            raise RuntimeError("no device")

    with pytest.raises(EngineError, match=r"^engine raised RuntimeError in the start of m:Fails: no device$"):
        construct_class(EngineConfig(kind="m:Fails"), Fails, tmp_path, "invariant")
