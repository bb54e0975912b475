"""`oracle run` as a supervised child: whatever the run's process does, the exit code is never 0 without a
complete report, and the report and the exit code agree. Real subprocesses, a fake engine.

No test depends on timing: a process is signalled once its output or a file says how far it got, and
the random-moment test holds for whichever moment the signal lands at.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from run_process import finish, stale_pass

SUPPORT = Path(__file__).resolve().parents[1] / "support"


def _config(tmp_path: Path, model: Path, *, preload: list[str] | None = None, trials: int = 4,
            **options: Any) -> Path:
    cfg = {
        "model": str(model),
        "engine": {"kind": "fake_engine:FakeEngine", "options": options, "preload": preload or []},
        "prompts": {"random": {"count": 2, "min_len": 2, "max_len": 4}},
        "sampling": {"max_tokens": 3},
        "schedule": {"trials": trials, "seed": 1, "batch_size": [1, 8]},
        "report_dir": str(tmp_path / "report"),
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPPORT), str(tmp_path), os.environ.get("PYTHONPATH", "")]),
            "CI": "1", "PYTHONUNBUFFERED": "1"}


def _oracle(tmp_path: Path, config: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "oracle", "run", str(config), *args], env=_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)



def _report(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "report" / "report.json").read_text())



def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie (dead, not yet reaped by its parent) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (OSError, IndexError):
        return True


@pytest.mark.parametrize(("body", "says"), [
    ("import os\nos._exit(0)\n", "os._exit(0) was called during the run"),
    # C's exit() skips Python entirely; only the supervising parent can tell.
    ("import ctypes\nctypes.CDLL(None).exit(0)\n", "exited with code 0 before writing its report"),
    ("import ctypes\nctypes.string_at(0)\n", "killed by SIGSEGV before writing its report"),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", "killed by SIGKILL before writing its report"),
])
def test_a_preload_that_ends_the_process_never_reads_as_a_pass(fake_model: Path, tmp_path: Path, body: str,
                                                             says: str) -> None:
    (tmp_path / "ender.py").write_text(body)
    stale_pass(tmp_path / "report")
    proc = _oracle(tmp_path, _config(tmp_path, fake_model, preload=["ender"]))
    err = finish(proc)
    assert proc.returncode == 3, err
    report = _report(tmp_path)
    assert report["complete"] is False and report["exit_code"] == 3
    assert says in report["error"], report["error"]
    assert "STALE" not in (tmp_path / "report" / "summary.md").read_text()


def test_os_exit_in_generate_is_an_engine_error_with_what_completed(fake_model: Path, tmp_path: Path) -> None:
    """os._exit(0) in generate() (on the watchdog's engine thread): an engine error in the run's own report."""
    config = _config(tmp_path, fake_model, fault_after_calls=3, fault="os_exit")
    proc = _oracle(tmp_path, config)
    err = finish(proc)
    assert proc.returncode == 3, err
    report = _report(tmp_path)
    assert report["exit_code"] == 3 and report["complete"] is False
    # The watchdog's engine thread raises it into the run: the run's own engine error, not the parent's.
    assert "os._exit(0)" in report["error"] and "before writing its report" not in report["error"], report["error"]


def test_sigkill_of_oracle_run_takes_the_run_and_its_server_with_it(fake_model: Path, tmp_path: Path) -> None:
    """The preload starts a tethered 'server' (as the openai and vLLM engines do), records both pids and
    blocks; SIGKILL of `oracle run` must leave neither running."""
    pids = tmp_path / "pids"
    (tmp_path / "holder.py").write_text(
        "import os, threading\n"
        "from oracle.lifecycle import tether\n"
        "server = tether.popen(['sleep', '600'])\n"
        f"open({str(pids)!r} + '.tmp', 'w').write(f'{{os.getpid()}} {{server.pid}}')\n"
        f"os.replace({str(pids)!r} + '.tmp', {str(pids)!r})\n"
        "threading.Event().wait()\n")
    proc = _oracle(tmp_path, _config(tmp_path, fake_model, preload=["holder"]))
    try:
        _wait_until(lambda: pids.exists(), "the preload to start its server")
        child, server = (int(x) for x in pids.read_text().split())
        assert not _gone(child) and not _gone(server)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        _wait_until(lambda: _gone(child) and _gone(server), "the run's process and its server to end")
    finally:
        proc.kill()
    report = _report(tmp_path)
    assert report["complete"] is False and report["exit_code"] == 3


def _wait_until(ready: Any, what: str, limit: float = 120) -> None:
    import time

    deadline = time.monotonic() + limit
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


def test_a_tethered_process_exits_with_its_own_code(tmp_path: Path) -> None:
    from oracle.lifecycle import tether

    proc = tether.popen(["sh", "-c", "exit 7"])
    assert proc.wait() == 7
    tether.release(proc)
    proc = tether.popen(["sh", "-c", "kill -TERM $$"])
    assert proc.wait() == 128 + signal.SIGTERM
    tether.release(proc)


def _moments(n: int) -> list[float]:
    # Seeded: the same moments every run; spread over start-up (torch import), planning and trials.
    rng = random.Random(17)
    return sorted(rng.uniform(0.0, 4.0) for _ in range(n))


@pytest.mark.parametrize("delay", _moments(4))
def test_sigterm_at_any_moment_ends_with_a_report_that_agrees(fake_model: Path, tmp_path: Path, delay: float) -> None:
    _sigterm_at(fake_model, tmp_path, delay)


@pytest.mark.slow
@pytest.mark.parametrize("delay", _moments(40))
def test_sigterm_at_many_moments_ends_with_a_report_that_agrees(fake_model: Path, tmp_path: Path,
                                                               delay: float) -> None:
    _sigterm_at(fake_model, tmp_path, delay)


def _sigterm_at(model: Path, tmp_path: Path, delay: float) -> None:
    """Whatever the moment, the exit code is the report's; a stale pass never survives. The one exception
    is a signal before Python has run any of oracle's code: the default action kills the process
    (returncode -15), non-zero too, and nothing of this run exists to agree with."""
    import time

    stale_pass(tmp_path / "report")
    proc = _oracle(tmp_path, _config(tmp_path, model, trials=6, sleep_s=0.01))
    time.sleep(delay)  # the moment varies; the assertion holds for every moment
    proc.send_signal(signal.SIGTERM)
    err = finish(proc)
    assert proc.returncode != 0 or _report(tmp_path)["complete"], err
    if proc.returncode == -signal.SIGTERM:
        return
    assert "Traceback" not in err, err
    report = _report(tmp_path)
    assert report.get("exit_code") == proc.returncode, (report.get("error"), err)
    if proc.returncode == 0:
        assert report["complete"] is True


def test_config_error_replaces_an_earlier_report(tmp_path: Path) -> None:
    """A config that does not load must not leave the previous run's pass in the folder it names."""
    stale_pass(tmp_path / "report")
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"report_dir: {tmp_path / 'report'}\nschedule: {{trials: -1}}\n")
    proc = subprocess.run([sys.executable, "-m", "oracle", "run", str(bad)], capture_output=True, text=True,
                          env=_env(tmp_path), timeout=120)
    assert proc.returncode == 2, proc.stderr
    report = _report(tmp_path)
    assert report["complete"] is False and report["exit_code"] == 2 and "bad.yaml" in report["error"]


def test_a_signal_while_the_config_loads_says_where_the_report_is(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from oracle.lifecycle.run_guard import replace_stale_report
    from oracle.lifecycle.signals import Interrupted

    stale_pass(tmp_path / "report")
    e = Interrupted(signal.SIGTERM)
    replace_stale_report(tmp_path / "missing.yaml", tmp_path / "report", e)
    report = _report(tmp_path)
    assert report["exit_code"] == 143 and report["error"] == "interrupted (SIGTERM)"
    assert e.report_dir == str(tmp_path / "report")  # type: ignore[attr-defined]
    fresh = Interrupted(signal.SIGTERM)
    monkeypatch.chdir(tmp_path / "report")  # the default folder, `oracle-report/` of the working directory, is empty
    replace_stale_report(tmp_path / "missing.yaml", None, fresh)  # no folder named, none holds a report
    assert not hasattr(fresh, "report_dir")


def test_a_tethered_process_gets_the_descriptors_passed_to_it(tmp_path: Path) -> None:
    """The vLLM worker talks over a socket whose descriptor is passed: the tether hands it on."""
    from oracle.lifecycle import tether

    read_end, write_end = os.pipe()
    try:
        proc = tether.popen([sys.executable, "-c", f"import os; os.write({write_end}, b'ok')"],
                            pass_fds=(write_end,))
        assert proc.wait() == 0
        tether.release(proc)
        assert os.read(read_end, 2) == b"ok"
    finally:
        os.close(read_end)
        os.close(write_end)


def test_the_child_exits_with_its_code_after_exit_handlers_and_flushed_output() -> None:
    code = ("import atexit\nfrom oracle.lifecycle.supervise import exit_child\n"
            "atexit.register(lambda: print('handler ran'))\n"
            "print('buffered', end='')\nexit_child(7)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 7
    assert done.stdout == "bufferedhandler ran\n"


def test_the_run_child_does_not_put_the_working_directory_first(tmp_path: Path) -> None:
    """Run from a checkout, the console script must not make its `kernels/` folder (oracle_kernels) the
    `kernels` package transformers imports: the child starts as the parent did (3.11's -P)."""
    import shutil

    pytest.importorskip("transformers")
    if sys.version_info < (3, 11):
        pytest.skip("-P needs Python 3.11")
    script = shutil.which("oracle", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("the console script is not installed beside this Python")
    checkout = tmp_path / "checkout"
    (checkout / "kernels").mkdir(parents=True)
    (checkout / "kernels" / "__init__.py").write_text("")  # not the package transformers looks for
    config = Path(__file__).resolve().parents[2] / "configs" / "transformers.yaml"
    # A fixed schedule seed: with 2 trials a random one may form no batch (invariance vacuous, exit 1).
    done = subprocess.run([script, "run", str(config), "--trials", "2", "--seed", "1", "--report-dir", str(tmp_path / "r")],
                          cwd=checkout, env={**os.environ, "CI": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_the_child_runs_the_config_its_parent_read_even_once_the_file_is_gone(fake_model: Path,
                                                                            tmp_path: Path) -> None:
    """The parent resolves the config (file and --trials) once and hands it to the child through a pipe: the
    file deleted between the two, the child still runs the parent's config, and the report's digest is the
    parent's."""
    from oracle.config import load_config

    config = _config(tmp_path, fake_model)
    parent = load_config(config, {"schedule.trials": 3}, flags={"schedule.trials": "--trials"})
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import sys\nfrom pathlib import Path\nfrom oracle import cli\nfrom oracle.lifecycle import supervise\n"
        "real = supervise.run_child\n\n"
        "def run_child(*args, **kwargs):\n"
        "    Path(sys.argv[1]).unlink()  # read by the parent; the child must not need it\n"
        "    return real(*args, **kwargs)\n\n"
        "supervise.run_child = run_child\n"
        "sys.exit(cli.main(['run', sys.argv[1], '--trials', '3'], supervise=True))\n")
    done = subprocess.run([sys.executable, str(driver), str(config)], env=_env(tmp_path), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not config.exists()
    report = _report(tmp_path)
    assert report["complete"] is True and report["config_digest"] == parent.digest()
    assert report["config"]["schedule"]["trials"] == 3 and report["environment"]["trials"] == 3
