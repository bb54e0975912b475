"""Bad input is a usage error (exit 2, one line naming the file and the field), never a traceback
and never "a required check failed" (issue 17, class 6): configs, prompts files, tokenizers, a model's
vocab_size, and report.json files given to replay, localize or the Action helper."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from oracle.cli import main
from oracle.prompts import MAX_PROMPTS_BYTES
from oracle.render.github import main as action_main


def config_text(model: Path, prompts: str, engine: bool = True) -> str:
    kind = "engine: {kind: 'fake_engine:FakeEngine'}\n" if engine else ""
    return f"model: {model}\n{kind}prompts: {prompts}\nschedule: {{trials: 2, repeat_trials: 1}}\n"


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(args)
    return code, capsys.readouterr().err.strip()


def assert_usage_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err


def report_code(report_dir: Path) -> int | None:
    path = report_dir / "report.json"
    return json.loads(path.read_text())["exit_code"] if path.is_file() else None


# (name, file name, bytes of the prompts file, what the error names)
PROMPT_FILES: list[tuple[str, bytes, str]] = [
    ("not UTF-8", b'\xff\xfe{"prompt_token_ids": [1]}\n', "p.jsonl:1: not UTF-8"),
    ("not UTF-8 on line 2", b'{"prompt_token_ids": [1]}\n{"prompt": "caf\xe9"}\n', "p.jsonl:2: not UTF-8"),
    ("nested deeply", b'{"prompt_token_ids": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", "p.jsonl:1: "),
    ("a huge integer", b'{"prompt_token_ids": [1' + b"0" * 5000 + b"]}\n", "p.jsonl:1: "),
    ("booleans as token ids", b'{"prompt_token_ids": [true, false, 1]}\n', "p.jsonl:1: prompt_token_ids"),
    ("floats as token ids", b'{"prompt_token_ids": [1.0]}\n', "p.jsonl:1: prompt_token_ids"),
    ("token ids not a list", b'{"prompt_token_ids": "123"}\n', "p.jsonl:1: prompt_token_ids"),
    ("a lone surrogate", b'{"prompt": "a\\ud800b"}\n', "p.jsonl:1: not valid Unicode"),
    ("a name that is not a string", b'{"prompt_token_ids": [1], "name": {"a": 1}}\n', "p.jsonl:1: name"),
    ("the same name twice", b'{"prompt_token_ids": [1], "name": "x"}\n{"prompt_token_ids": [2], "name": "x"}\n',
     "p.jsonl:2: name: 'x' is already the name of line 1"),
]


@pytest.mark.parametrize(("data", "needle"), [c[1:] for c in PROMPT_FILES], ids=[c[0] for c in PROMPT_FILES])
def test_bad_prompts_file(data: bytes, needle: str, tmp_path: Path, tiny_tokenizer_model: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "p.jsonl").write_bytes(data)
    config = tmp_path / "c.yaml"
    config.write_text(config_text(tiny_tokenizer_model, "{file: p.jsonl}"))
    code, err = run_cli(["run", str(config), "--report-dir", str(tmp_path / "r")], capsys)
    assert_usage_error(code, err, needle)
    assert report_code(tmp_path / "r") in (None, 2)  # the report, if any, agrees with the exit code


def test_prompts_file_above_the_size_limit_is_refused_unread(
    tmp_path: Path, fake_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big = tmp_path / "big.jsonl"
    with big.open("wb") as f:  # sparse: the size is real, nothing is written
        f.truncate(MAX_PROMPTS_BYTES + 1)
    config = tmp_path / "c.yaml"
    config.write_text(config_text(fake_model, "{file: big.jsonl}"))
    code, err = run_cli(["run", str(config), "--report-dir", str(tmp_path / "r")], capsys)
    assert_usage_error(code, err, f"prompts.file: {big} is {MAX_PROMPTS_BYTES + 1:,} bytes")


def test_prompts_file_that_is_a_folder(tmp_path: Path, fake_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "d").mkdir()
    config = tmp_path / "c.yaml"
    config.write_text(config_text(fake_model, "{file: d}"))
    code, err = run_cli(["run", str(config), "--report-dir", str(tmp_path / "r")], capsys)
    assert_usage_error(code, err, "prompts.file: ", "is not a file")


@pytest.fixture
def tiny_tokenizer_model(tmp_path: Path, tiny_qwen3: Path) -> Path:
    """A copy of tiny-qwen3's files (the fake engine runs it; its tokenizer is real)."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_qwen3, model)
    return model


@pytest.mark.parametrize("text", ['"a\\ud800b"', '"\\udfff"'], ids=["lone high surrogate", "lone low surrogate"])
def test_lone_surrogate_in_a_prompt_text(text: str, tmp_path: Path, tiny_tokenizer_model: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(config_text(tiny_tokenizer_model, f"{{texts: [{text}]}}"))
    code, err = run_cli(["run", str(config), "--report-dir", str(tmp_path / "r")], capsys)
    assert_usage_error(code, err, f"{config}:3: prompts.texts.0: not valid Unicode")


TOKENIZERS = [
    ("not JSON", '{"not": "a tokenizer"'),
    ("no such model type", '{"version": "1.0", "model": {"type": "Nope"}}'),
    ("empty", ""),
]


@pytest.mark.parametrize("content", [c[1] for c in TOKENIZERS], ids=[c[0] for c in TOKENIZERS])
def test_corrupt_tokenizer(content: str, tmp_path: Path, tiny_tokenizer_model: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    (tiny_tokenizer_model / "tokenizer.json").write_text(content)
    config = tmp_path / "c.yaml"
    config.write_text(config_text(tiny_tokenizer_model, "{texts: [hello]}"))
    code, err = run_cli(["run", str(config), "--report-dir", str(tmp_path / "r")], capsys)
    assert_usage_error(code, err, f"{tiny_tokenizer_model / 'tokenizer.json'}: not a tokenizer file")


@pytest.mark.parametrize("vocab", [0, -5, None, True, 1.5, 1e30, [1], "512", 2**40],
                         ids=lambda v: f"vocab_size={v!r}")
@pytest.mark.parametrize("engine", [True, False], ids=["fake engine", "native engine"])
def test_bad_vocab_size(vocab: object, engine: bool, tmp_path: Path, tiny_tokenizer_model: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    path = tiny_tokenizer_model / "config.json"
    data = json.loads(path.read_text())
    data["vocab_size"] = vocab
    path.write_text(json.dumps(data))
    config = tmp_path / "c.yaml"
    config.write_text(config_text(tiny_tokenizer_model, "{random: {count: 2}}", engine=engine))
    code, err = run_cli(["run", str(config), "--report-dir", str(tmp_path / "r")], capsys)
    assert_usage_error(code, err, "vocab_size")
    assert report_code(tmp_path / "r") in (None, 2)


CONFIG_BYTES = [
    ("a NUL byte", b"model: preset:tiny-qwen3\x00\nprompts: {random: {count: 2}}\n", ":1: malformed YAML: character U+0000"),
    ("an escape byte", b"model: preset:tiny-qwen3\nprompts: {random: {count: 2}}\n\x1b[2J\n", ":3: malformed YAML"),
    ("a NUL escape in a path", b'model: "a\\0b"\nprompts: {random: {count: 2}}\n', ":1: model: holds a NUL byte"),
    ("a lone surrogate in a field", b'model: "a\\ud800"\nprompts: {random: {count: 2}}\n',
     ":1: model: not valid Unicode"),
    ("a NUL in report_dir", b'model: preset:tiny-qwen3\nprompts: {random: {count: 2}}\nreport_dir: "r\\0"\n',
     ":3: report_dir: holds a NUL byte"),
]


@pytest.mark.parametrize(("data", "needle"), [c[1:] for c in CONFIG_BYTES], ids=[c[0] for c in CONFIG_BYTES])
def test_bad_bytes_in_a_config(data: bytes, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_bytes(data)
    code, err = run_cli(["run", str(config), "--report-dir", str(tmp_path / "r")], capsys)
    assert_usage_error(code, err, f"{config}{needle}")


def _deep(path: Path) -> None:
    path.write_text('{"config": ' + "[" * 100_000 + "]" * 100_000 + "}")


def _huge_int(path: Path) -> None:
    path.write_text('{"config": {}, "seed": 1' + "0" * 5000 + "}")


def _negative_seed(path: Path) -> None:
    path.write_text(json.dumps({"oracle_version": "0", "seed": -1, "config": {}, "config_digest": "0" * 64}))


def _folder(path: Path) -> None:
    path.mkdir()


def _deep_config(path: Path) -> None:
    inner: object = {}
    for _ in range(600):
        inner = {"a": inner}
    path.write_text(json.dumps({"oracle_version": "0", "seed": 1, "config": {"model": "m", "engine": inner,
                                                                             "prompts": {"texts": ["x"]}},
                                "config_digest": "0" * 64}))


REPORTS: list[tuple[str, Callable[[Path], None]]] = [
    ("nested deeply", _deep), ("a huge integer", _huge_int), ("a negative seed", _negative_seed),
    ("a folder", _folder), ("a deep config", _deep_config),
]


@pytest.mark.parametrize("write", [r[1] for r in REPORTS], ids=[r[0] for r in REPORTS])
@pytest.mark.parametrize("command", ["replay", "localize"])
def test_bad_report_given_to_replay_or_localize(command: str, write: Callable[[Path], None], tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "report.json"
    write(report)
    code, err = run_cli([command, str(report), "--trial", "0"], capsys)
    assert_usage_error(code, err, str(report))


@pytest.mark.parametrize("write", [r[1] for r in REPORTS[:3]], ids=[r[0] for r in REPORTS[:3]])
def test_bad_report_given_to_the_action_helper(write: Callable[[Path], None], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    outputs = tmp_path / "outputs"
    monkeypatch.setenv("GITHUB_OUTPUT", str(outputs))
    write(tmp_path / "report.json")
    assert action_main(["annotate", str(tmp_path), "--exit-code", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"::error title=oracle::the report at {tmp_path / 'report.json'} cannot be read ("), out
    assert "verdict=error" in outputs.read_text()  # oracle said 0, but with no readable report it is no pass


def test_a_seed_beyond_the_schedules_range_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from oracle.cli import main

    monkeypatch.chdir(tmp_path)  # a refused command line writes its exit-2 report where the run would have

    with pytest.raises(SystemExit) as e:
        main(["run", str(tmp_path / "c.yaml"), "--seed", str(10**23)])
    assert e.value.code == 2 and "--seed: must be <=" in capsys.readouterr().err


@pytest.mark.parametrize("content", [b"\xff\xfe not utf-8", b"[" * 100_000 + b"]" * 100_000])
def test_a_broken_golden_file_is_a_config_error_naming_it(tmp_path: Path, content: bytes) -> None:
    from oracle.errors import ConfigError
    from oracle.golden import read_golden

    path = tmp_path / "golden.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match="checks.golden.file: .*golden.json is not valid JSON"):
        read_golden(path)
