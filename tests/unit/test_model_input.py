"""Broken checkpoints: exit 2 naming the file and the tensor, never a library traceback."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from oracle.cli import main
from oracle.engines.native.loader import load_decoder
from oracle.errors import ModelError

UP = "model.layers.0.mlp.up_proj.weight"


def _truncate(f: Path) -> None:
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])


def _corrupt_header(f: Path) -> None:
    data = bytearray(f.read_bytes())
    data[8:24] = b"\xff" * 16
    f.write_bytes(bytes(data))


def _huge_header_length(f: Path) -> None:
    data = bytearray(f.read_bytes())
    data[:8] = (1 << 60).to_bytes(8, "little")
    f.write_bytes(bytes(data))


def _rewrite(change: Callable[[dict[str, torch.Tensor]], None]) -> Callable[[Path], None]:
    def apply(f: Path) -> None:
        tensors = load_file(str(f))
        change(tensors)
        save_file(tensors, str(f))

    return apply


def _transpose_up(t: dict[str, torch.Tensor]) -> None:
    t[UP] = t[UP].t().contiguous()


def _int_up(t: dict[str, torch.Tensor]) -> None:
    t[UP] = torch.zeros(t[UP].shape, dtype=torch.int32)


def _drop_up(t: dict[str, torch.Tensor]) -> None:
    del t[UP]


CASES = [
    (_truncate, "beyond the end of the data"),
    (_corrupt_header, "corrupt safetensors header"),
    (_huge_header_length, "not a safetensors file or truncated"),
    (_rewrite(_transpose_up), f"tensor {UP} has shape"),
    (_rewrite(_int_up), f"tensor {UP} has dtype I32"),
    (_rewrite(_drop_up), f"weights lack 1 tensors, e.g. {UP}"),
]


@pytest.fixture
def broken_model(tiny_qwen3: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_qwen3, tmp_path / "model"))


@pytest.mark.parametrize(("damage", "needle"), CASES, ids=[c[1][:30] for c in CASES])
def test_broken_weights_are_a_model_error_naming_file_and_tensor(
    damage: Callable[[Path], None], needle: str, broken_model: Path
) -> None:
    weights = broken_model / "model.safetensors"
    damage(weights)
    with pytest.raises(ModelError) as e:
        load_decoder(broken_model, torch.float32, torch.device("cpu"))
    assert needle in str(e.value)
    assert str(weights) in str(e.value) or str(broken_model) in str(e.value)


def test_bad_config_json_values_are_model_errors(broken_model: Path) -> None:
    import json

    cfg = json.loads((broken_model / "config.json").read_text())
    (broken_model / "config.json").write_text(json.dumps({**cfg, "hidden_size": "big"}))
    with pytest.raises(ModelError, match="hidden_size must be a positive integer"):
        load_decoder(broken_model, torch.float32, torch.device("cpu"))
    del cfg["num_attention_heads"]
    (broken_model / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="lacks num_attention_heads"):
        load_decoder(broken_model, torch.float32, torch.device("cpu"))


def test_truncated_weights_through_the_cli_exit_2_one_line(
    broken_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    weights = broken_model / "model.safetensors"
    _truncate(weights)
    path = tmp_path / "c.yaml"
    path.write_text(f"model: {broken_model}\nprompts: {{random: {{count: 1}}}}\nreport_dir: {tmp_path / 'r'}\n")
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and err.startswith(f"oracle: error: {weights}: tensor "), err
    assert "truncated" in err
