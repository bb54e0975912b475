"""A config says what it means: a bool is no count, a typo names the nearest field, and `oracle config init`
writes only shipped examples, fails when its write fails and never points a wheel user at `configs/`."""

from __future__ import annotations

import os
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from oracle.cli import main
from oracle.config import Config, parse_config
from oracle.engine_options import NativeOptions, OpenAIOptions, TransformersOptions, VllmOptions
from oracle.errors import ConfigError
from oracle.strict_numbers import counts_only

BASE: dict[str, Any] = {"model": "preset:tiny-qwen3", "prompts": {"random": {"count": 2}}}


def _number_fields(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every field of `model` and the models it holds (not in lists) whose type is a number's."""
    for name, field in model.model_fields.items():
        path = (*prefix, name)
        if counts_only(field.annotation):
            yield path
        origin = typing.get_origin(field.annotation)
        if origin in (list, tuple, dict):
            continue
        for arg in (field.annotation, *typing.get_args(field.annotation)):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                yield from _number_fields(arg, path)


def _set(data: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = {**data}
    node = out
    for key in path[:-1]:
        node[key] = dict(node.get(key) or {})
        node = node[key]
    node[path[-1]] = value
    return out


CONFIG_FIELDS = list(_number_fields(Config))


def test_the_walk_finds_the_integer_fields() -> None:
    names = {".".join(p) for p in CONFIG_FIELDS}
    assert {"schedule.search.trials", "schedule.trials", "engine.max_num_seqs", "sampling.max_tokens",
            "schedule.batch_size", "engine.timeout_s", "model_seed"} <= names, names


@pytest.mark.parametrize("path", CONFIG_FIELDS, ids=".".join)
def test_every_number_field_refuses_a_bool(path: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(_set(BASE, path, True), source="c.yaml")
    assert f"{'.'.join(path)}: a number, not true/false" in str(e.value), str(e.value)


def test_a_bool_inside_a_pair_is_refused() -> None:
    with pytest.raises(ConfigError, match="schedule.batch_size: a number, not true/false"):
        parse_config(_set(BASE, ("schedule", "batch_size"), [1, True]))


@pytest.mark.parametrize("model", [NativeOptions, TransformersOptions, VllmOptions, OpenAIOptions])
def test_every_engine_option_number_refuses_a_bool(model: type[BaseModel]) -> None:
    from pydantic import ValidationError

    for path in _number_fields(model):
        with pytest.raises(ValidationError, match="a number, not true/false"):
            model.model_validate(_set({"base_url": "http://localhost:1"} if model is OpenAIOptions else {},
                                      path, True))


def test_bools_stay_bools_and_numbers_numbers() -> None:
    config = parse_config(_set(_set(BASE, ("schedule", "search", "trials"), 3), ("engine", "enable_prefix_caching"),
                               True))
    assert config.schedule.search.trials == 3 and config.engine.enable_prefix_caching is True


@pytest.mark.parametrize(("path", "says"), [
    (("engine", "max_num_seq"), "engine.max_num_seq: unknown field; did you mean max_num_seqs?"),
    (("schedule", "serch"), "schedule.serch: unknown field; did you mean search?"),
    (("checks", "invariance", "requirment"), "checks.invariance.requirment: unknown field; did you mean requirement?"),
    (("engine", "options", "stop_at_eoss"), "engine.options.stop_at_eoss: unknown field; did you mean stop_at_eos?"),
    (("report_dri",), "report_dri: unknown field; did you mean report_dir?"),
])
def test_a_typo_names_the_nearest_field(path: tuple[str, ...], says: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(_set(BASE, path, 1))
    assert says in str(e.value), str(e.value)


def test_a_field_near_nothing_is_only_unknown() -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(_set(BASE, ("engine", "zzzzqqq"), 1))
    assert str(e.value).endswith("engine.zzzzqqq: unknown field") or "did you mean" not in str(e.value)


def test_config_init_to_a_device_fails_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "init", "/dev/full"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("oracle: error: /dev/full: "), err


def test_config_init_never_replaces_a_fifo_even_with_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    assert main(["config", "init", str(fifo), "--force"]) == 2
    assert "not a regular file" in capsys.readouterr().err
    assert fifo.exists() and not fifo.is_file()


def test_config_init_when_the_write_fails_exits_non_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "afile").write_text("x")
    assert main(["config", "init", str(tmp_path / "afile" / "oracle.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot write the example" in err[0], err


@pytest.mark.parametrize("name", ["../examples/custom_engine", "../configs/tiny", "/etc/passwd", "tiny.yaml", ""])
def test_config_init_takes_only_a_shipped_examples_name(name: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "init", str(tmp_path / "x.yaml"), "--example", name]) == 2
    assert "--example: no example" in capsys.readouterr().err
    assert not (tmp_path / "x.yaml").exists()


def test_the_written_config_names_no_repository_path(tmp_path: Path) -> None:
    from oracle.example_configs import example_names

    for name in example_names():
        path = tmp_path / f"{name}-oracle.yaml"
        assert main(["config", "init", str(path), "--example", name]) == 0
        text = path.read_text()
        assert "configs/" not in text, (name, [line for line in text.splitlines() if "configs/" in line])
    assert f"oracle run {tmp_path / 'tiny-oracle.yaml'}" in (tmp_path / "tiny-oracle.yaml").read_text()
