"""Shard results and merge as untrusted input: secrets redacted in shard-results.npz, a zip bomb and a
tampered header refused with bounded memory, and every merge input problem is exit 2 naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from test_secrets import SECRETS, secret_config

from oracle.cli import main
from oracle.config import parse_config
from oracle.errors import ConfigError
from oracle.runner import run
from oracle.shards.merge import merge
from oracle.shards.results import RESULTS_FILE, load_results

SUPPORT = Path(__file__).parents[1] / "support"


def _config(model: Path, report_dir: Path) -> dict[str, Any]:
    return {"model": str(model), "engine": {"kind": "fake_engine:FakeEngine"},
            "prompts": {"random": {"count": 3, "min_len": 2, "max_len": 5}}, "sampling": {"max_tokens": 4},
            "schedule": {"trials": 8, "seed": 7, "batch_size": [1, 6], "repeat_trials": 2},
            "report_dir": str(report_dir)}


def _shards(data: dict[str, Any], tmp_path: Path, n: int) -> list[Path]:
    out = []
    for i in range(n):
        run(parse_config(data), report_dir=tmp_path / f"shard-{i}", shard=(i, n))
        out.append(tmp_path / f"shard-{i}")
    return out


def _arrays(folder: Path) -> dict[str, np.ndarray]:
    with np.load(folder / RESULTS_FILE, allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


def _rewrite_meta(folder: Path, change: Any) -> None:
    arrays = _arrays(folder)
    meta = json.loads(arrays["meta"].tobytes())
    change(meta)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(folder / RESULTS_FILE, **arrays)


def test_no_secret_in_shard_results(fake_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The engine's description holds the api_key's URL password, the server command's --api-key and env values.
    monkeypatch.syspath_prepend(str(tmp_path))
    config = secret_config(tmp_path, fake_model)
    assert main(["run", str(config), "--report-dir", str(tmp_path / "s"), "--shard", "0/1"]) == 0
    raw = (tmp_path / "s" / RESULTS_FILE).read_bytes()  # stored uncompressed: the text is there to search
    assert b"<redacted: set" in raw
    for secret in SECRETS:
        assert secret.encode() not in raw, secret
    assert load_results(tmp_path / "s").modes  # and it still reads back


@pytest.fixture
def one(fake_model: Path, tmp_path: Path) -> Path:
    return _shards(_config(fake_model, tmp_path / "r"), tmp_path, 1)[0]


def test_zip_bomb_is_refused_before_it_inflates(one: Path) -> None:
    # 256 MiB of zeros deflated to a fraction of a MiB, claiming 3 GiB: refused from the zip's header.
    path = one / RESULTS_FILE
    with zipfile.ZipFile(path, "a") as zf:
        info = zipfile.ZipInfo("bomb.npy")
        info.compress_type = zipfile.ZIP_DEFLATED
        with zf.open(info, "w", force_zip64=True) as f:
            f.write(b"\x93NUMPY\x01\x00v\x00{'descr': '|u1', 'fortran_order': False, 'shape': (3221225472,), }"
                    .ljust(128 - 1, b" ") + b"\n")
            block = bytes(1 << 20)
            for _ in range(256):
                f.write(block)
    assert path.stat().st_size < 4 << 20
    with pytest.raises(ConfigError, match="bomb.npy: a compressed member"):
        load_results(one)


def test_npy_header_claiming_more_than_it_holds_is_refused(one: Path) -> None:
    path = one / RESULTS_FILE
    with zipfile.ZipFile(path, "a") as zf:
        header = b"\x93NUMPY\x01\x00v\x00{'descr': '<f8', 'fortran_order': False, 'shape': (10000000000,), }"
        zf.writestr("r999999.npy", header.ljust(127, b" ") + b"\n" + bytes(64))
    with pytest.raises(ConfigError, match=r"r999999.npy: its header claims 80,000,000,000 bytes"):
        load_results(one)


def test_a_shard_claiming_ten_billion_shards_is_refused(one: Path, tmp_path: Path) -> None:
    _rewrite_meta(one, lambda m: m["shard"].update(count=10**10))
    with pytest.raises(ConfigError, match=r"shard 0/10000000000: COUNT must be in 1\.\.100000"):
        load_results(one)
    # In a merge, a second: the old merge listed the ten billion missing shards.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "oracle", "merge", str(one), "--report-dir", str(tmp_path / "m")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "COUNT" in proc.stderr, proc.stderr


def test_merge_report_dir_that_is_a_file_is_exit_2(one: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out in (afile, afile / "under"):
        assert main(["merge", str(one), "--report-dir", str(out)]) == 2
        err = capsys.readouterr().err
        assert "--report-dir" in err and "Errno" not in err, err


def test_a_failed_merge_replaces_an_earlier_passing_report(fake_model: Path, tmp_path: Path) -> None:
    folders = _shards(_config(fake_model, tmp_path / "r"), tmp_path, 2)
    out = tmp_path / "merged"
    assert main(["merge", *map(str, folders), "--report-dir", str(out)]) == 0
    assert json.loads((out / "report.json").read_text())["exit_code"] == 0
    assert main(["merge", str(folders[0]), "--report-dir", str(out)]) == 2  # shard 1/2 missing
    data = json.loads((out / "report.json").read_text())
    assert data["exit_code"] == 2 and not data["complete"] and "missing" in data["error"]


def test_shards_from_two_working_folders_merge(fake_model: Path, tmp_path: Path) -> None:
    # The same config file content run from two folders: the resolved configs differ only in base_dir.
    folders = []
    for i in range(2):
        work = tmp_path / f"work{i}"
        work.mkdir()
        (work / "oracle.yaml").write_text(yaml.safe_dump(_config(fake_model, Path("r"))))
        assert main(["run", str(work / "oracle.yaml"), "--report-dir", str(work / "s"), "--shard", f"{i}/2"]) == 0
        folders.append(work / "s")
    assert main(["merge", *map(str, folders), "--report-dir", str(tmp_path / "m")]) == 0
    # Anything else that differs is named, not an opaque digest.
    data = _config(fake_model, Path("r"))
    data["sampling"]["temperature"] = 0.0
    data["prompts"]["random"]["count"] = 4
    (tmp_path / "work1" / "oracle.yaml").write_text(yaml.safe_dump(data))
    assert main(["run", str(tmp_path / "work1" / "oracle.yaml"), "--report-dir", str(folders[1]), "--shard", "1/2"]) == 0
    with pytest.raises(ConfigError, match=r"differs from .* in prompts\.random\.count"):
        merge(folders, tmp_path / "m2")
