"""The two SIGTERM windows: while torch is imported (held until the import is whole, then 143 with a
partial report) and just after the final report is written (ignored: the exit code stays the report's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

SUPPORT = Path(__file__).parents[1] / "support"

# Installed in every oracle process of the test through PYTHONPATH: a hook that sends SIGTERM at a
# precise point, chosen by ORACLE_TEST_TERM (no timing involved).
HOOKS = r'''
import os, signal, sys

WHEN = os.environ.get("ORACLE_TEST_TERM", "")


def _term():
    os.kill(os.getpid(), signal.SIGTERM)


TRIED = []


class _Finder:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            TRIED.append(name)
        if WHEN == "torch_import" and name == "torch.distributed" and "torch" in sys.modules:
            _term()  # torch is half imported: torch.distributed is being set up inside `import torch`
        if name in ("oracle.report", "oracle.lifecycle.supervise") and WHEN in ("after_final", "parent_after_final"):
            import importlib.machinery

            spec = importlib.machinery.PathFinder.find_spec(name, path)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                _patch(module)

            spec.loader.exec_module = exec_module
            return spec
        return None


def _patch(module):
    if WHEN == "after_final" and module.__name__ == "oracle.report":
        write = module.Report.write

        def final_then_term(self, report_dir, views=(), *, final=True):
            path = write(self, report_dir, views, final=final)
            if final and self.complete:
                _term()  # the final report is on disk: the signal arrives right after it
            return path

        module.Report.write = final_then_term
    if WHEN == "parent_after_final" and module.__name__ == "oracle.lifecycle.supervise":
        run_child = module.run_child

        def run_then_term(*args, **kwargs):
            code = run_child(*args, **kwargs)
            _term()  # the parent has read the child's final report and has its exit code
            return code

        module.run_child = run_then_term


if WHEN == "torch_import":
    def _atexit():
        if not TRIED:
            return  # the supervising parent never imports torch
        with open(os.environ["ORACLE_TEST_OUT"], "a") as f:
            f.write(f"{os.getpid()} torch_whole={'torch' in sys.modules and hasattr(sys.modules['torch'], 'distributed')}\n")

    import atexit
    atexit.register(_atexit)
sys.meta_path.insert(0, _Finder())
'''


def _run(fake_model: Path, tmp_path: Path, when: str, supervised: bool = True) -> tuple[int, dict, str]:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(HOOKS)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"model": str(fake_model), "engine": {"kind": "fake_engine:FakeEngine"},
                                      "prompts": {"random": {"count": 2, "min_len": 2, "max_len": 4}},
                                      "sampling": {"max_tokens": 2}, "schedule": {"trials": 2, "seed": 1},
                                      "report_dir": str(tmp_path / "r")}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hooks), str(SUPPORT), os.environ.get("PYTHONPATH", "")]),
           "ORACLE_TEST_TERM": when, "ORACLE_TEST_OUT": str(tmp_path / "out.txt")}
    # Supervised: the console script (a parent owning the exit code, the run in a child); else one process
    # (`oracle.cli.main`, as the pytest plugin runs it).
    code = f"import sys; sys.argv = ['oracle', 'run', {str(config)!r}]\nfrom oracle.cli import entry, main\n" + \
        ("entry()" if supervised else "sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    out = (tmp_path / "out.txt").read_text() if (tmp_path / "out.txt").exists() else ""
    return proc.returncode, report, proc.stderr + out


def test_sigterm_while_torch_imports_is_held_until_the_import_is_whole(fake_model: Path, tmp_path: Path) -> None:
    code, report, text = _run(fake_model, tmp_path, "torch_import")
    assert code == 143 == report["exit_code"], text
    assert report["error"].startswith("interrupted (SIGTERM)") and not report["complete"]
    # The signal did not cut torch's import in half (where C++ calls back into Python, that aborts).
    assert "torch_whole=True" in text and "torch_whole=False" not in text, text


def test_sigterm_right_after_the_final_report_keeps_the_reports_code(fake_model: Path, tmp_path: Path) -> None:
    code, report, text = _run(fake_model, tmp_path, "after_final", supervised=False)
    assert report["complete"] and report["exit_code"] == 0, report.get("error")
    assert code == report["exit_code"], text


def test_sigterm_to_the_parent_after_it_read_the_report_keeps_the_reports_code(fake_model: Path,
                                                                              tmp_path: Path) -> None:
    code, report, text = _run(fake_model, tmp_path, "parent_after_final")
    assert report["complete"] and report["exit_code"] == 0
    assert code == 0, text


def test_a_signal_that_lands_where_python_swallows_exceptions_still_stops_the_run(
        capfd: pytest.CaptureFixture[str]) -> None:
    """SIGTERM handled inside a weakref callback (as the import lock's cleanup is): Python ignores the
    callback's exception, so the `Interrupted` would be lost and the run go on. It is delivered again and
    raised in the code that runs next, with nothing printed."""
    import signal
    import time
    import weakref

    from oracle.lifecycle import signals

    class Held:
        pass

    def callback(_: object) -> None:
        signal.raise_signal(signal.SIGTERM)  # the handler runs here, inside the callback
        sum(range(100))

    previous = signals.install()
    try:
        held = Held()
        ref = weakref.ref(held, callback)
        with pytest.raises(signals.Interrupted) as raised:
            del held  # the callback runs now, and Python swallows what it raised
            for _ in range(1000):  # the signal, sent again, is raised in one of these sleeps (10 s at most)
                time.sleep(0.01)
        assert raised.value.signum == signal.SIGTERM and ref() is None
    finally:
        signals.restore(previous)
    assert "Exception ignored" not in capfd.readouterr().err
    assert sys.unraisablehook is not signals._swallowed  # put back once the block that handled signals ends
