"""Every file oracle reads is read by one bounded, regular-file-only reader (oracle.files): a FIFO nobody
writes to, a device and an oversized file are refused at once, one line naming the file and the bound."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from oracle.errors import ConfigError
from oracle.files import read_regular

SUPPORT = Path(__file__).parents[1] / "support"
# Far above what a refusal takes (well under a second): the old readers blocked on a FIFO forever.
GENEROUS = 60


def _oracle(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "oracle", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=GENEROUS, stdin=subprocess.DEVNULL)


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def test_the_reader_refuses_fifo_device_and_oversize(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"fifo.*: is a FIFO \(named pipe\), not a regular file; a report"):
        read_regular(_fifo(tmp_path / "fifo"), 100, "report")
    with pytest.raises(ConfigError, match=r"/dev/zero: is a character device"):
        read_regular(Path("/dev/zero"), 100, "golden file")
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    with pytest.raises(ConfigError, match=r"big: config file is 101 bytes, over the bound of 100 bytes"):
        read_regular(big, 100, "config file")
    with pytest.raises(ConfigError, match="not found"):
        read_regular(tmp_path / "missing", 100, "config file")
    link = tmp_path / "link"
    link.symlink_to(big)
    assert read_regular(link, 1000, "config file") == b"x" * 101


def test_a_fifo_config_fails_at_once_even_with_an_earlier_report(tmp_path: Path) -> None:
    # The config cannot be read; the earlier run's report would be replaced, reading the config again.
    (tmp_path / "oracle-report").mkdir()
    (tmp_path / "oracle-report" / "report.json").write_text("{}")
    proc = _oracle(["run", str(_fifo(tmp_path / "c.yaml"))], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "c.yaml" in proc.stderr and "FIFO" in proc.stderr


@pytest.mark.parametrize("verb", ["replay", "localize"])
def test_a_fifo_report_fails_at_once(tmp_path: Path, verb: str) -> None:
    proc = _oracle([verb, str(_fifo(tmp_path / "report.json")), "--trial", "0"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "report.json: is a FIFO" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_merge_of_a_fifo_report_fails_at_once(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    _fifo(tmp_path / "s" / "report.json")
    proc = _oracle(["merge", str(tmp_path / "s"), "--report-dir", str(tmp_path / "out")], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "FIFO" in proc.stderr


def test_golden_file_that_is_a_device_is_refused(fake_model: Path, tmp_path: Path) -> None:
    config = {"model": str(fake_model), "engine": {"kind": "fake_engine:FakeEngine"},
              "prompts": {"random": {"count": 2, "min_len": 2, "max_len": 4}}, "sampling": {"max_tokens": 3},
              "schedule": {"trials": 2, "seed": 1}, "report_dir": str(tmp_path / "r"),
              "checks": {"golden": {"requirement": "required", "file": "/dev/zero"}}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = _oracle(["run", str(path)], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "/dev/zero: is a character device" in proc.stderr
    assert json.loads((tmp_path / "r" / "report.json").read_text())["exit_code"] == 2


def test_a_fifo_prompts_file_is_refused(fake_model: Path, tmp_path: Path) -> None:
    config = {"model": str(fake_model), "engine": {"kind": "fake_engine:FakeEngine"},
              "prompts": {"file": str(_fifo(tmp_path / "p.jsonl"))}, "report_dir": str(tmp_path / "r")}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = _oracle(["run", str(path)], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "p.jsonl" in proc.stderr
