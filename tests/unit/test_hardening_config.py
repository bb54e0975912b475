"""`--set` and `config init` as hostile input: deep nesting and unknown sections name the flag (exit 2,
never a traceback); `config init` never writes through a symbolic link."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from oracle.cli import main


@pytest.fixture
def config(fake_model: Path, tmp_path: Path) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"model": str(fake_model), "engine": {"kind": "fake_engine:FakeEngine"},
                                    "prompts": {"random": {"count": 2}}, "report_dir": str(tmp_path / "r")}))
    return path


@pytest.mark.parametrize(("setting", "needle"), [
    ("engine.options.x=" + "[" * 5000 + "]" * 5000, "argument --set: engine.options.x: VALUE is nested too deeply"),
    ("engine.options.x=" + "{a: " * 3000 + "1" + "}" * 3000, "argument --set: engine.options.x: VALUE is nested"),
    ("engine." + ".".join(["a"] * 3000) + "=1", "argument --set: engine.a.a"),
    ("foo.bar=1", "--set foo.bar: foo: unknown field"),
    ("schedule.trials.x=3", "--set schedule.trials.x: schedule.trials:"),
])
def test_set_errors_name_the_flag(config: Path, setting: str, needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(["run", str(config), "--set", setting])
    except SystemExit as e:  # argparse's usage error
        code = e.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert code == 2, err
    assert needle in err and "Traceback" not in err and str(config) not in err, err[-500:]


def test_config_init_refuses_a_dangling_symlink(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outside = tmp_path / "outside" / "victim.yaml"
    outside.parent.mkdir()
    link = tmp_path / "work" / "oracle.yaml"
    link.parent.mkdir()
    link.symlink_to(outside)
    assert main(["config", "init", str(link)]) == 2
    assert "symbolic link" in capsys.readouterr().err
    assert not outside.exists()
    # --force replaces the link itself, never the file it points to.
    assert main(["config", "init", str(link), "--force"]) == 0
    assert not outside.exists() and link.is_file() and not link.is_symlink()
