"""A GPU config on a torch that cannot give the GPU is a config error (exit 2) naming engine.device, before
any model is made or the report folder touched."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from oracle.cli import main
from oracle.config import parse_config
from oracle.engines import check_device
from oracle.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def _engine(kind: str = "native", device: str = "cuda") -> object:
    return parse_config({"model": "preset:tiny-qwen3", "engine": {"kind": kind, "device": device},
                         "prompts": {"random": {"count": 1}}}).engine


@pytest.mark.skipif(torch.version.cuda is not None, reason="needs a CPU build of torch")
def test_the_gpu_config_on_cpu_torch_says_so_before_making_the_model(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    cache = tmp_path / "models"
    monkeypatch.setenv("ORACLE_CACHE_DIR", str(cache))
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "gpu.yaml"
    config.write_text((ROOT / "configs" / "gpu.yaml").read_text())
    assert main(["run", str(config), "--report-dir", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err
    assert "engine.device: cuda, but this torch has no CUDA" in err and len(err.splitlines()) == 1, err
    assert not cache.exists() or not any(cache.iterdir())  # no checkpoint was made
    assert not (tmp_path / "report").exists()


@pytest.mark.skipif(torch.version.cuda is not None, reason="needs a CPU build of torch")
def test_the_plan_checks_it_too(tmp_path: Path) -> None:
    """The pytest plugin and `oracle.runner.run` plan through check_engine_config, which checks the device."""
    from oracle.engines import check_engine_config

    with pytest.raises(ConfigError, match="engine.device: cuda:1, but this torch has no CUDA"):
        check_engine_config(_engine(device="cuda:1"))  # type: ignore[arg-type]


def test_a_cpu_device_and_the_engines_that_pick_their_own_are_not_checked() -> None:
    check_device(_engine(device="cpu"))  # type: ignore[arg-type]
    cfg = parse_config({"model": "m", "engine": {"kind": "openai", "device": "cuda",
                                                 "options": {"base_url": "http://127.0.0.1:1"}},
                        "prompts": {"random": {"count": 1}}}).engine
    check_device(cfg)


@pytest.mark.parametrize(("count", "device", "message"), [
    (0, "cuda", "no CUDA device is visible"),
    (2, "cuda:2", "torch sees 2 CUDA device(s) (cuda:0 to cuda:1)"),
])
def test_a_cuda_build_without_the_device_asked_for(monkeypatch: pytest.MonkeyPatch, count: int, device: str,
                                                   message: str) -> None:
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    with pytest.raises(ConfigError, match=f"engine.device: {device}, but") as e:
        check_device(_engine(device=device))  # type: ignore[arg-type]
    assert message in str(e.value)


def test_every_shipped_gpu_config_names_a_cuda_device() -> None:
    """What the check is for: the shipped GPU configs (and `oracle config init --example gpu`) set cuda."""
    gpu = yaml.safe_load((ROOT / "configs" / "gpu.yaml").read_text())
    assert gpu["engine"]["device"].startswith("cuda")
