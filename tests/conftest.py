"""Shared fixtures. `tests/support` is importable so configs can name `fake_engine:FakeEngine`."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

SUPPORT = Path(__file__).parent / "support"

# Property tests (hypothesis): seeded (derandomized), no `.hypothesis/` folder, no deadline; a few examples
# by default, more where the run selects the slow cases (`pytest -m slow`, as CI does).
_PROPERTIES = dict(derandomize=True, database=None, deadline=None, print_blob=False,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("oracle-fast", max_examples=15, **_PROPERTIES)  # type: ignore[arg-type]
settings.register_profile("oracle-slow", max_examples=200, **_PROPERTIES)  # type: ignore[arg-type]
settings.load_profile("oracle-fast")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--reverse", action="store_true",
                     help="run the collected tests in reverse order (a test must not depend on what ran before it)")
    parser.addoption("--shuffle", type=int, default=None, metavar="SEED",
                     help="run the collected tests in an order shuffled by SEED (printed in the header)")


def pytest_report_header(config: pytest.Config) -> str | None:
    seed = config.getoption("--shuffle")
    return f"tests shuffled with --shuffle {seed}" if seed is not None else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--reverse"):
        items.reverse()
    seed = config.getoption("--shuffle")
    if seed is not None:
        random.Random(seed).shuffle(items)


def pytest_configure(config: pytest.Config) -> None:
    expr = str(config.getoption("markexpr", "") or "")
    if "slow" in expr.replace("not slow", ""):
        settings.load_profile("oracle-slow")
sys.path.insert(0, str(SUPPORT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


# A user's run leaves `oracle-report/` in the working directory (the README's first command does, in the
# repository root); the suite run next in the same tree must neither read nor replace it. Every test is
# checked: the folder (in the working directory and in the repository root) is the same after the test as
# before, by its files' names, sizes and modification times.
ROOT = Path(__file__).resolve().parents[1]


def _fingerprint(folder: Path) -> tuple[tuple[str, int, int], ...] | None:
    if not folder.exists():
        return None
    return tuple(sorted((str(f.relative_to(folder)), f.stat().st_size, f.stat().st_mtime_ns)
                        for f in folder.rglob("*") if f.is_file()))


@pytest.fixture(autouse=True)
def _the_users_report_is_untouched() -> Any:
    folders = {Path.cwd().resolve() / "oracle-report", ROOT / "oracle-report"}
    before = {folder: _fingerprint(folder) for folder in folders}
    yield
    for folder, was in before.items():
        now = _fingerprint(folder)
        assert now == was, (f"this test (or one running beside it under xdist) wrote {folder}: a test writes only "
                            "under its tmp_path (pass --report-dir, or chdir to tmp_path)")


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One model cache for the session, so presets are made once."""
    path = tmp_path_factory.mktemp("models")
    os.environ["ORACLE_CACHE_DIR"] = str(path)
    return path


@pytest.fixture(scope="session")
def tiny_qwen3(model_cache: Path) -> Path:
    from oracle.models import ensure_model

    return ensure_model("tiny-qwen3", cache_dir=model_cache)


@pytest.fixture(scope="session")
def small_qwen3(model_cache: Path) -> Path:
    """small-qwen3 (head_dim 64: vLLM's CPU attention has no kernel for tiny-qwen3's 16), made once a session."""
    from oracle.models import ensure_model

    return ensure_model("small-qwen3", cache_dir=model_cache)


def write_fake_checkpoint(path: Path, vocab_size: int = 97) -> Path:
    """A checkpoint folder for the fake engine: a config and one (unused) weight."""
    import json

    import torch
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"vocab_size": vocab_size}))
    save_file({"unused": torch.zeros(1)}, str(path / "model.safetensors"))
    return path


@pytest.fixture
def fake_model(tmp_path: Path) -> Path:
    return write_fake_checkpoint(tmp_path / "fake-model")


@pytest.fixture
def vllm_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planning a vLLM config checks that the vllm package is installed (only the worker imports it): a test
    that plans one without starting it gets an empty `vllm` module where the real one is absent."""
    import importlib.machinery
    import importlib.util
    import sys
    import types

    if importlib.util.find_spec("vllm") is None:
        vllm = types.ModuleType("vllm")
        vllm.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
        monkeypatch.setitem(sys.modules, "vllm", vllm)
