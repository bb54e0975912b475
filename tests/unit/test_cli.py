"""CLI paths not covered elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from oracle.cli import main


def test_bench_kernels_without_cuda_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: `oracle bench kernels` would run")
    assert main(["bench", "kernels"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def _fake_config(tmp_path: object, model: object) -> object:
    from pathlib import Path

    import yaml

    path = Path(str(tmp_path)) / "c.yaml"
    path.write_text(yaml.safe_dump({
        "model": str(model), "engine": {"kind": "fake_engine:FakeEngine"},
        "prompts": {"random": {"count": 2, "min_len": 2, "max_len": 4}}, "sampling": {"max_tokens": 3},
        "schedule": {"trials": 3, "seed": 1, "batch_size": [1, 4]},
    }))
    return path


def test_set_overrides_any_field_with_a_yaml_value_and_the_report_keeps_it(fake_model: object, tmp_path: object) -> None:
    import json
    from pathlib import Path

    out = Path(str(tmp_path)) / "r"
    code = main(["run", str(_fake_config(tmp_path, fake_model)), "--report-dir", str(out),
                 "--set", "schedule.batch_size=[2, 3]", "--set", "sampling.max_tokens=2",
                 "--set", "engine.options.sleep_s=0.0", "--trials", "2", "--set", "schedule.trials=9"])
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["schedule"]["batch_size"] == [2, 3]
    assert report["config"]["sampling"]["max_tokens"] == 2
    assert report["config"]["engine"]["options"]["sleep_s"] == 0.0
    assert report["config"]["schedule"]["trials"] == 2  # --trials wins over --set of the same field
    assert all(2 <= 1 + len(t["fillers"]) <= 3 for t in report["schedule"])


@pytest.mark.parametrize(("setting", "says"), [
    ("schedule.trials=many", "--set schedule.trials:"),
    ("sampling.bogus=1", "--set sampling.bogus: unknown field"),
])
def test_a_bad_set_is_a_usage_error_naming_the_flag(fake_model: object, tmp_path: object, setting: str, says: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from pathlib import Path

    code = main(["run", str(_fake_config(tmp_path, fake_model)), "--report-dir", str(Path(str(tmp_path)) / "r"),
                 "--set", setting])
    assert code == 2
    assert says in capsys.readouterr().err


def test_a_set_without_a_field_name_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a refused command line writes its exit-2 report where the run would have
    with pytest.raises(SystemExit) as e:
        main(["run", "c.yaml", "--set", "not a field"])
    assert e.value.code == 2
    assert "expected FIELD=VALUE" in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "says"), [
    # The flag sets the field the conflict names second: the file's line of batch_size is not to blame.
    (["--set", "engine.max_num_seqs=4"], "--set engine.max_num_seqs: schedule.batch_size: max 17 is above "
                                         "engine.max_num_seqs (4)"),
    # The flag sets the field the conflict is reported on.
    (["--set", "schedule.batch_size=[1, 99]"], "--set schedule.batch_size: schedule.batch_size: max 99 is above"),
])
def test_a_set_that_conflicts_with_the_file_names_the_flag_not_a_line(
        tmp_path: object, capsys: pytest.CaptureFixture[str], flags: list[str], says: str) -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    config = Path(str(tmp_path)) / "tiny.yaml"
    config.write_text((root / "configs" / "tiny.yaml").read_text())
    assert main(["run", str(config), "--report-dir", str(Path(str(tmp_path)) / "r"), *flags]) == 2
    err = capsys.readouterr().err
    assert says in err and f"{config}:" not in err, err


def test_a_conflict_inside_the_file_still_names_its_line(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    config = Path(str(tmp_path)) / "tiny.yaml"
    config.write_text((root / "configs" / "tiny.yaml").read_text().replace("max_num_seqs: 64", "max_num_seqs: 4"))
    assert main(["run", str(config), "--report-dir", str(Path(str(tmp_path)) / "r"), "--set", "sampling.max_tokens=3"]) == 2
    assert f"{config}:21: schedule.batch_size: max 17" in capsys.readouterr().err
