"""One row per engine kind (oracle.engines.kinds): every built-in row is complete, the trust gate reads
the rows' code-loading fields (vLLM's import paths included), a missing engine package is exit 2 with
its install line, and a third-party engine installed through the `oracle.engines` entry point runs a
config, shards and merges, and replays, with no change in oracle."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from oracle.cli import main
from oracle.config import EngineConfig, parse_config
from oracle.engine_options import ENTRY_POINT_GROUP
from oracle.engines.kinds import BUILTIN, EngineKind, declared_posture, kind_of
from oracle.errors import ConfigError
from oracle.example_configs import example_dir
from oracle.posture import FIELDS, UNKNOWN
from oracle.runner import run
from oracle.trust import code_loading_fields


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_every_builtin_row_is_complete(name: str) -> None:
    """Each field a contributor fills for a new kind is filled and means what it says."""
    row = BUILTIN[name]
    assert row.name == name and callable(row.build) and not row.user_code
    assert row.options is not None and row.start_work and row.start_work != "constructor"
    assert row.example is not None and (example_dir() / f"{row.example}.yaml").is_file()
    assert bool(row.packages) == bool(row.install)  # a package it needs comes with the line that installs it
    assert all(p.replace("_", "").isalnum() for p in row.packages)
    assert row.code_options({}) == []
    cfg = parse_config({"model": "preset:tiny-qwen3", "prompts": {"random": {"count": 1}}, "engine": {"kind": name, **(
        {"options": {"base_url": "http://127.0.0.1:1"}} if name == "openai" else {})}}).engine
    assert kind_of(cfg) is row
    posture = declared_posture(cfg, "invariant")
    assert set(posture) == set(FIELDS) and posture["engine"] == name
    assert row.runs_weights is (row.fits is not None)  # an engine that loads the weights has its memory checked
    assert row.instance(cfg, "invariant", 0).kind == name


def test_the_native_rows_posture_is_known_from_the_config() -> None:
    posture = declared_posture(EngineConfig(kind="native"), "invariant")
    assert posture["engine_version"] == "oracle" and posture["tensor_parallel"] == 1
    assert posture["linear_kernel"] == "oracle_kernels mm"
    assert declared_posture(EngineConfig(kind="transformers"), "invariant")["tensor_parallel"] == UNKNOWN


# --- trust: every field that loads code, from the rows ------------------------------------------------------


@pytest.mark.parametrize(("engine_args", "field"), [
    ({"logits_processors": ["evil_mod:Proc"]}, "engine_args.logits_processors"),
    ({"logits_processors": ["evil_mod.Proc"]}, "engine_args.logits_processors"),
    ({"kv_transfer_config": {"kv_connector": "X", "kv_connector_module_path": "evil.connector"}},
     "engine_args.kv_transfer_config.kv_connector_module_path"),
    ({"ec_transfer_config": {"ec_connector_module_path": "evil.ec"}},
     "engine_args.ec_transfer_config.ec_connector_module_path"),
    ({"scheduler_cls": "evil.Scheduler"}, "engine_args.scheduler_cls"),
    ({"worker_cls": "evil.Worker"}, "engine_args.worker_cls"),
    ({"distributed_executor_backend": "evil.Executor"}, "engine_args.distributed_executor_backend"),
    ({"reasoning_parser_plugin": "/tmp/evil.py"}, "engine_args.reasoning_parser_plugin"),
    ({"io_processor_plugin": "evil"}, "engine_args.io_processor_plugin"),
    ({"compilation_config": {"backend": "evil.mod.compile"}}, "engine_args.compilation_config.backend"),
    ({"log_config_file": "/tmp/logging.json"}, "engine_args.log_config_file"),
    ({"model_class_overrides": {"Qwen3ForCausalLM": "evil.Model"}}, "engine_args.model_class_overrides"),
    ({"speculative_config": {"model": "m", "trust_remote_code": True}}, "engine_args.speculative_config.trust_remote_code"),
])
def test_vllm_engine_args_that_import_code_need_trust(engine_args: dict[str, Any], field: str) -> None:
    fields = code_loading_fields({"engine": {"kind": "vllm", "options": {"engine_args": engine_args}}})
    assert f"engine.options.{field}" in fields


def test_vllm_engine_args_that_load_no_code_pass() -> None:
    args = {"max_num_seqs": 4, "attention_backend": "FLASH_ATTN", "distributed_executor_backend": "mp",
            "tensor_parallel_size": 2, "kv_cache_dtype": "fp8_e4m3", "compilation_config": {"pass_config": {
                "enable_sp": True}}, "trust_remote_code": False, "tokenizer": "Qwen/Qwen3-8B"}
    assert code_loading_fields({"engine": {"kind": "vllm", "options": {"engine_args": args}}}) == []


def test_the_shipped_configs_need_trust_only_where_they_run_code() -> None:
    """No false alarm: vLLM's own op names (compilation_config.custom_ops: [none]) load no code; a server
    command does."""
    import yaml

    flagged = {p.stem: code_loading_fields(yaml.safe_load(p.read_text())) for p in example_dir().glob("*.yaml")}
    # server.yaml's env only sizes the KV cache and picks the in-process engine core (INERT_ENV)
    assert flagged.pop("server") == ["engine.options.command"]
    assert not any(flagged.values()), flagged


def test_a_vllm_worker_environment_needs_trust() -> None:
    assert code_loading_fields({"engine": {"kind": "vllm", "options": {"env": {"LD_PRELOAD": "x.so"}}}}) == [
        "engine.options.env"]


def test_replay_of_a_report_whose_vllm_args_load_code_is_refused(fake_model: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A downloaded report naming a logits processor vLLM would import: exit 2 naming the field, before any
    engine starts."""
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({"model": str(fake_model), "engine": {"kind": "fake_engine:FakeEngine"},
                                  "prompts": {"random": {"count": 1, "min_len": 2, "max_len": 3}},
                                  "sampling": {"max_tokens": 2}, "schedule": {"trials": 1, "seed": 1}}))
    assert main(["run", str(config), "--report-dir", str(tmp_path / "r")]) in (0, 1)
    report = tmp_path / "r" / "report.json"
    data = json.loads(report.read_text())
    data["config"]["engine"] = {"kind": "vllm", "options": {"engine_args": {"logits_processors": ["evil_mod:Proc"]}}}
    report.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["replay", str(report), "--trial", "0"]) == 2
    err = capsys.readouterr().err
    assert "engine.options.engine_args.logits_processors" in err and "--trust-report" in err


# --- packages: exit 2 with the install line, before the report folder --------------------------------------


def test_a_missing_vllm_is_a_config_error_with_the_install_line(fake_model: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # as where vLLM is not installed
    config = tmp_path / "vllm.yaml"
    config.write_text(json.dumps({"model": str(fake_model), "engine": {"kind": "vllm"},
                                  "prompts": {"random": {"count": 1}}}))
    report_dir = tmp_path / "report"
    assert main(["run", str(config), "--report-dir", str(report_dir)]) == 2
    err = capsys.readouterr().err
    assert "the vllm engine needs the vllm package" in err and "pip install 'oracle-determinism[vllm]'" in err
    assert "Traceback" not in err and not report_dir.exists()


def test_the_generated_server_config_without_its_server_package_is_a_config_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`oracle config init --engine openai` writes a config that starts vLLM's server with this interpreter:
    where vLLM is not installed, that is exit 2 naming the command and the install line, before any report
    folder (it was exit 3, the server's ModuleNotFoundError)."""
    monkeypatch.setitem(sys.modules, "vllm", None)  # as where vLLM is not installed
    monkeypatch.chdir(tmp_path)
    assert main(["config", "init", "--engine", "openai", "server.yaml"]) == 0
    capsys.readouterr()
    assert main(["run", "server.yaml", "--report-dir", "report"]) == 2
    err = capsys.readouterr().err
    assert "engine.options.command: the server it starts needs the vllm package" in err
    assert "pip install 'oracle-determinism[vllm]'" in err and not (tmp_path / "report").exists()


def test_a_server_command_of_another_program_needs_no_package_here() -> None:
    cfg = parse_config({"model": "preset:tiny-qwen3", "prompts": {"random": {"count": 1}},
                        "engine": {"kind": "openai", "options": {"command": ["sglang-server", "--host", "{host}",
                                                                             "--port", "{port}"]}}})
    assert kind_of(cfg.engine).config_packages(cfg.engine) == []
    python_m = cfg.engine.model_copy(update={"options": {"command": ["{python}", "-m", "sglang.launch_server",
                                                                      "--host", "{host}", "--port", "{port}"]}})
    assert kind_of(python_m).config_packages(python_m) == [("engine.options.command", "sglang", "pip install sglang")]


# --- a third-party engine through the entry point -----------------------------------------------------------

ROWS_MODULE = '''
from pydantic import BaseModel, ConfigDict

from oracle.engines.kinds import EngineKind
from fake_engine import FakeEngine


class RowOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    diverge_from_batch: int | None = None
    script: str | None = None


def build(cfg, model_dir, mode):
    options = RowOptions.model_validate(cfg.options)
    return FakeEngine(model_dir, mode, diverge_from_batch=options.diverge_from_batch, diverge_step=1)


def declare(cfg, mode, out, env):
    out["engine_version"] = "row-1.0"


class HttpEngine(FakeEngine):
    """An engine that would send its requests to the server at `endpoint` (here it only answers as the fake)."""

    server_options = ("endpoint",)

    def __init__(self, model, mode, *, endpoint=None, **kwargs):
        super().__init__(model, mode, **kwargs)
        self.endpoint = endpoint


ROW = EngineKind("ignored", build, RowOptions, start_work="row start",
                 code_options=lambda options: ["script"] if options.get("script") else [],
                 declare_posture=declare)
'''


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A distribution installed on sys.path (its dist-info found by importlib.metadata) that registers three
    kinds: `fakeclass`, an engine class, `fakerow`, a row of its own with typed options, and `fakehttp`, an
    engine class that sends to the server its `endpoint` option names."""
    site = tmp_path / "site"
    info = site / "oracle_fake_engines-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: oracle-fake-engines\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nfakeclass = fake_engine:FakeEngine\n"
                                           "fakerow = oracle_fake_rows:ROW\nfakehttp = oracle_fake_rows:HttpEngine\n")
    (site / "oracle_fake_rows.py").write_text(ROWS_MODULE)
    monkeypatch.syspath_prepend(str(site))
    return site


def _config(model: Path, kind: str, report_dir: Path, **options: Any) -> dict[str, Any]:
    return {"model": str(model), "engine": {"kind": kind, "options": options},
            "prompts": {"random": {"count": 3, "min_len": 2, "max_len": 5}}, "sampling": {"max_tokens": 4},
            "schedule": {"trials": 12, "seed": 7, "batch_size": [1, 8]}, "report_dir": str(report_dir)}


@pytest.mark.parametrize("kind", ["fakeclass", "fakerow"])
def test_an_entry_point_engine_runs_shards_merges_and_replays(installed: Path, fake_model: Path, tmp_path: Path,
                                                              kind: str) -> None:
    from oracle.replay import replay
    from oracle.runner import run
    from oracle.shards.merge import merge

    data = _config(fake_model, kind, tmp_path / "whole", diverge_from_batch=3)
    whole = run(parse_config(data), report_dir=tmp_path / "whole")
    inv = next(c for c in whole.checks if c.name == "invariance")
    assert inv.verdict == "fail" and whole.exit_code() == 1  # the planted batch fault is found
    folders = []
    for i in range(2):
        folders.append(tmp_path / f"shard-{i}")
        run(parse_config(data), report_dir=folders[-1], shard=(i, 2))
    # An installed kind names no code of the report's: merge and replay need no --trust-report.
    merged = merge(folders, tmp_path / "merged")
    a, b = (json.loads((tmp_path / f / "report.json").read_text()) for f in ("whole", "merged"))
    for key in ("checks", "divergences", "config_digest", "exit_code"):
        assert a[key] == b[key], key
    failing = next(d for d in merged.divergences if d.check == "invariance")
    again = replay(tmp_path / "merged" / "report.json", failing.trial_id)
    assert again.divergence is not None and again.divergence.step == failing.step
    assert code_loading_fields(a["config"]) == []


def test_an_entry_point_row_brings_its_options_posture_and_trust(installed: Path, fake_model: Path,
                                                                 tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="engine.options.threads"):
        parse_config(_config(fake_model, "fakerow", tmp_path / "r", threads=2))
    cfg = parse_config(_config(fake_model, "fakerow", tmp_path / "r", script="x.sh"))
    row = kind_of(cfg.engine)
    assert isinstance(row, EngineKind) and row.name == "fakerow" and row.start_work == "row start"
    assert declared_posture(cfg.engine, "invariant")["engine_version"] == "row-1.0"
    assert code_loading_fields({"engine": {"kind": "fakerow", "options": {"script": "x.sh"}}}) == [
        "engine.options.script"]
    assert code_loading_fields({"engine": {"kind": "fakeclass"}}) == []


def test_an_unknown_kind_names_the_installed_ones(installed: Path, fake_model: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps(_config(fake_model, "nosuch", tmp_path / "r")))
    assert main(["run", str(config), "--report-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "engine.kind: 'nosuch' is not one of" in err and "fakeclass" in err and "fakerow" in err
    # A report naming a kind not installed here is code of unknown origin: it needs trust.
    assert code_loading_fields({"engine": {"kind": "nosuch"}}) == ["engine.kind"]


def test_a_class_row_comes_from_the_class_attributes() -> None:
    from oracle.engines.kinds import class_row

    class Server:
        needs_weights = False
        code_loading_options = ("script",)
        start_work = "server start"

    row = class_row("srv", Server)
    assert row.runs_weights is False and row.start_work == "server start" and row.options is None
    assert row.code_options({"script": "x.sh", "env": {"A": "1"}, "port": 1}) == ["env", "script"]
    assert class_row("plain", object).runs_weights is True


def test_config_init_names_the_rows_examples_for_an_unknown_engine(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "init", str(tmp_path / "o.yaml"), "--engine", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "--engine: no example config for 'nosuch'" in err and all(name in err for name in BUILTIN)
    assert not (tmp_path / "o.yaml").exists()


def test_an_environment_of_inert_variables_loads_no_code_and_any_other_does() -> None:
    inert = {"engine": {"kind": "vllm", "options": {"env": {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}}}}
    assert code_loading_fields(inert) == []
    mixed = {"engine": {"kind": "vllm", "options": {"env": {"VLLM_CPU_OMP_THREADS_BIND": "0|1", "VLLM_PLUGINS": "x"}}}}
    assert code_loading_fields(mixed) == ["engine.options.env"]
    per_mode = {"engine": {"kind": "openai", "options": {"mode_env": {"invariant": {"PYTHONPATH": "/tmp"}}}}}
    assert code_loading_fields(per_mode) == ["engine.options.mode_env"]


def test_an_installed_engine_that_sends_to_a_server_is_gated_behind_trust(
        installed: Path, fake_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trust gate reads the server URL a kind sends to from its row, for every kind: a report naming an
    installed engine's server sends no credential there, and its replay line carries --trust-report."""
    from oracle.replay import report_config
    from oracle.report import load_report
    from oracle.trust import named_server, replay_command

    data = _config(fake_model, "fakehttp", tmp_path / "r", endpoint="http://127.0.0.1:9")
    report = run(parse_config(data), report_dir=tmp_path / "r")  # the class takes its option; the run is fine
    assert report.exit_code() == 0
    config = json.loads((tmp_path / "r" / "report.json").read_text())["config"]
    assert named_server(config) == "http://127.0.0.1:9"
    assert code_loading_fields(config) == []  # it loads no code: the server is what needs trust
    assert replay_command("r.json", 0, config).endswith("--trust-report")
    assert named_server({"engine": {"kind": "fakeclass", "options": {"endpoint": "http://x"}}}) is None
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-sent")
    path = tmp_path / "r" / "report.json"
    with pytest.raises(ConfigError, match=r"sends requests to http://127\.0\.0\.1:9 .* --trust-report"):
        report_config(load_report(path), path, trusted=False)
    assert report_config(load_report(path), path, trusted=True).engine.kind == "fakehttp"


def test_a_module_class_engine_is_imported_once_per_run(fake_model: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan resolves the engine's row once (oracle.engines.resolve_engine) and every later reader takes it
    from the plan: the engines of both modes, the checks, the posture. A `module:Class` is imported once."""
    import oracle.engines.custom as custom

    imports: list[str] = []
    real = custom.import_module

    def counted(module: str, field: str, cfg: Any) -> object:
        if field == "engine.kind":
            imports.append(module)
        return real(module, field, cfg)

    monkeypatch.setattr(custom, "import_module", counted)
    data = _config(fake_model, "tp_engine:TpEngine", tmp_path / "r", tensor_parallel_size=2)
    data["checks"] = {"cross_instance": "required", "tp_parity": "report"}
    report = run(parse_config(data), report_dir=tmp_path / "r")
    assert {c.name for c in report.checks} >= {"invariance", "cross_instance", "tp_parity"}
    assert imports == ["tp_engine"]
