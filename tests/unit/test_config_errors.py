"""Bad configs exit 2 with one line that names the file and the field (and the line, where it has one)."""

from __future__ import annotations

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

BAD = [
    ("model: [unclosed\n", "malformed YAML"),
    ("- just\n- a list\n", "mapping at the top level"),
    ("prompts:\n  random: {count: 2}\n", "model: required field missing"),
    ("model: preset:tiny-qwen3\n", "prompts: required field missing"),
    (GOOD + "colour: blue\n", "colour: unknown field"),
    (GOOD.replace("trials: 3", "trials: 3\n  trails: 4"), "schedule.trails: unknown field"),
    (GOOD.replace("trials: 3", "trials: many"), "schedule.trials"),
    (GOOD.replace("trials: 3", "trials: 0"), "schedule.trials"),
    (GOOD.replace("trials: 3", "batch_size: [9, 2]"), "schedule.batch_size"),
    (GOOD.replace("trials: 3", "batch_size: [0, 2]"), "schedule.batch_size"),
    (GOOD.replace("trials: 3", "filler_len: [1, 2, 3]"), "schedule.filler_len"),
    (GOOD.replace("trials: 3", "arrival_step: [-1, 2]"), "schedule.arrival_step"),
    (GOOD + "engine:\n  dtype: float64\n", "engine.dtype"),
    (GOOD + "engine:\n  max_num_seqs: 0\n", "engine.max_num_seqs"),
    (GOOD + "engine:\n  kind: nosuch\n", "engine.kind"),
    (GOOD + "engine:\n  kind: 'no_such_module_xyz:Engine'\n", "engine.kind"),
    (GOOD + "engine:\n  preload: [no_such_module_xyz]\n", "engine.preload.0"),
    (GOOD + "checks:\n  invariance: sometimes\n", "checks.invariance"),
    (GOOD + "sampling:\n  temperature: -1\n", "sampling.temperature"),
    (GOOD + "sampling:\n  logits: some\n", "sampling.logits"),
    (GOOD.replace("random: {count: 2}", "random: {count: 2}\n  texts: [hi]"), "prompts"),
    (GOOD.replace("random: {count: 2}", "random: {min_len: 9, max_len: 3}"), "prompts.random"),
    (GOOD.replace("random: {count: 2}", "file: missing.jsonl"), "prompts.file"),
    (GOOD.replace("preset:tiny-qwen3", "/no/such/model/dir"), "/no/such/model/dir"),
]


@pytest.mark.parametrize(("text", "needle"), BAD, ids=[n for _, n in BAD])
def test_bad_config_exits_2_with_one_line(
    text: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], model_cache: Path
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    code = main(["run", str(path), "--report-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert needle in err, err


def test_unknown_field_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a config error replaces a stale report in the default folder: this test's
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD.replace("trials: 3", "trials: 3\n  trails: 4"))
    assert main(["run", str(path)]) == 2
    assert f"{path}:6: schedule.trails: unknown field" in capsys.readouterr().err


def test_missing_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the default report folder is the working directory's: this test's
    assert main(["run", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml: config file not found" in capsys.readouterr().err
