"""Hostile config input: one line `file:line: field: message` and exit 2, never a hang or a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oracle.cli import main

GOOD = """\
model: preset:tiny-qwen3
prompts:
  random: {count: 2}
schedule:
  trials: 3
"""

BOMB = """\
a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]
model: preset:tiny-qwen3
prompts: {texts: *i}
"""

CASES = [
    # (file bytes, expected line, needle)
    (GOOD.encode() + b"report_dir: caf\xe9\n", 6, "not UTF-8"),
    (GOOD.replace("trials: 3", "trials: 3\n  trials: 4").encode(), 6, "schedule.trials: duplicate key (first on line 5)"),
    (GOOD.encode() + b"model: preset:other\n", 6, "model: duplicate key (first on line 1)"),
    (BOMB.encode(), None, "YAML"),
    (b"a: &a [*a]\n" + GOOD.encode(), 1, "a.0: recursive YAML alias"),
    (b"x: " + b"[" * 5000 + b"]" * 5000 + b"\n" + GOOD.encode(), None, "nested too deeply"),
    (GOOD.replace("trials: 3", "trials: 3\n  seed: -1").encode(), 6, "schedule.seed: Input should be greater than or equal to 0"),
    (GOOD.encode() + b"sampling: {seed: -2}\n", 6, "sampling.seed: Input should be greater than or equal to 0"),
    (GOOD.replace("{count: 2}", "{count: 2, seed: -3}").encode(), 3, "prompts.random.seed"),
    (GOOD.encode() + b"model_seed: -1\n", 6, "model_seed: Input should be greater than or equal to 0"),
    (GOOD.encode() + b"engine: {max_num_seqs: 8}\n", 4, "schedule.batch_size: max 16 is above engine.max_num_seqs (8)"),
    (GOOD.encode() + b"sampling: {max_tokens: 100000000000000}\n", 6, "sampling.max_tokens: Input should be less than or equal to 1048576"),
    (GOOD.replace("trials: 3", "arrival_step: [0, 1000000000]").encode(), 5, "schedule.arrival_step: arrival_step max must be <= 10,000"),
    (GOOD.replace("trials: 3", "trials: 1000000000000").encode(), 5, "schedule.trials: Input should be less than or equal to 1000000"),
    (GOOD.encode() + b"engine: {timeout_s: 0}\n", 6, "engine.timeout_s"),
    (GOOD.encode() + b"schedule: 5\n", None, "schedule"),
]


@pytest.mark.parametrize(("data", "line", "needle"), CASES, ids=[c[2][:40] for c in CASES])
def test_bad_config_input_is_one_line_naming_file_line_field(
    data: bytes, line: int | None, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(data)
    code = main(["run", str(path), "--report-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert needle in err, err
    prefix = f"oracle: error: {path}:{line}: " if line else f"oracle: error: {path}"
    assert err.startswith(prefix), err
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())  # no model, no report


@pytest.mark.parametrize(("argv", "needle"), [
    (["--trials", "-1"], "argument --trials: must be >= 1, got -1"),
    (["--trials", "0"], "argument --trials: must be >= 1, got 0"),
    (["--trials", "lots"], "argument --trials: must be an integer"),
    (["--seed", "-5"], "argument --seed: must be >= 0, got -5"),
    (["--trials", "100000000000"], "--trials: Input should be less than or equal to 1000000"),
])
def test_bad_command_line_values_blame_the_option(argv: list[str], needle: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "good.yaml"
    path.write_text(GOOD)
    with pytest.raises(SystemExit) as e:  # argparse's own exit, or ours
        raise SystemExit(main(["run", str(path), "--report-dir", str(tmp_path / "r"), *argv]))
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert needle in err and str(path) not in err, err


def test_a_config_that_is_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the default report folder is the working directory's: this test's
    assert main(["run", str(tmp_path)]) == 2
    assert "is a folder, not a config file" in capsys.readouterr().err


def _fake_config(model: Path, tmp_path: Path, max_tokens: int) -> Path:
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({
        "model": str(model), "engine": {"kind": "fake_engine:FakeEngine"},
        "prompts": {"random": {"count": 2, "min_len": 10, "max_len": 10}},
        "sampling": {"max_tokens": max_tokens},
        "schedule": {"trials": 2, "seed": 1, "filler_len": [1, 4], "filler_max_tokens": [1, 4]},
        "report_dir": str(tmp_path / "report"),
    }, sort_keys=False))
    return path


def test_prompt_plus_max_tokens_beyond_the_context_is_a_config_error(
    fake_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = json.loads((fake_model / "config.json").read_text())
    (fake_model / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 16}))
    path = _fake_config(fake_model, tmp_path, max_tokens=7)
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"{path}:" in err and "sampling.max_tokens: prompt" in err and "exceeds the model's context of 16" in err
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["exit_code"] == 2 and report["complete"] is False  # checked before any engine ran
    path = _fake_config(fake_model, tmp_path, max_tokens=6)  # 10 + 6 = 16 fits
    assert main(["run", str(path)]) == 0
