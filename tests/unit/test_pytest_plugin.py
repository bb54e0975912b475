"""The pytest plugin, driven through pytester: options, seed, fixture, marker, YAML items, xdist.

Inner sessions run the fake engine of tests/support (outputs a pure function of the prompt,
with planted batch-dependent faults), so each takes well under a second after the first.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
import yaml

from oracle.cli import main as oracle_main

pytest_plugins = ["pytester"]

SUPPORT = Path(__file__).resolve().parents[1] / "support"
DOCS = Path(__file__).resolve().parents[2] / "README.md"
QUIET_CHECKS = {"prefill_decode": "off", "prefix_cache": "off", "negative_control": "off"}


@pytest.fixture(scope="session")
def _preloaded(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Load everything an in-process inner session of the fake engine imports, before pytester
    snapshots sys.modules: pytester deletes the modules a test imported when it ends, and torch,
    safetensors and tokenizers cannot be imported a second time in one process. A warm-up run of
    the fake engine (with a planted fault, so the search and shrink paths load too) does it.
    """
    import numpy.random  # noqa: F401
    import safetensors.torch
    import tokenizers.models  # noqa: F401
    import tokenizers.pre_tokenizers  # noqa: F401
    import torch

    import oracle.replay  # noqa: F401
    from oracle.config import parse_config
    from oracle.runner import run

    model = tmp_path_factory.mktemp("warm-up-model")
    (model / "config.json").write_text(json.dumps({"vocab_size": 97}))
    safetensors.torch.save_file({"unused": torch.zeros(1)}, str(model / "model.safetensors"))
    sys.path.insert(0, str(SUPPORT))
    run(parse_config(fake_config(model, trials=2, diverge_from_batch=2)), report_dir=model / "report")


@pytest.fixture
def inner(_preloaded: None, pytester: pytest.Pytester) -> pytest.Pytester:
    """A pytester project whose conftest makes `fake_engine:FakeEngine` importable (workers too)."""
    pytester.makeini("[pytest]\n")
    pytester.makeconftest(f"import sys\nsys.path.insert(0, {str(SUPPORT)!r})\n")
    return pytester


def fake_config(model: Path, trials: int = 6, checks: dict[str, str] | None = None, **options: Any) -> dict[str, Any]:
    return {
        "model": str(model),
        "engine": {"kind": "fake_engine:FakeEngine", "options": options},
        "prompts": {"random": {"count": 2, "min_len": 2, "max_len": 5}},
        "sampling": {"max_tokens": 4},
        "schedule": {"trials": trials, "batch_size": [2, 8], "repeat_trials": 2},
        "checks": {**QUIET_CHECKS, **(checks or {})},
    }


def engine_arg(**options: Any) -> str:
    return repr({"kind": "fake_engine:FakeEngine", "options": options})


def header_seed(result: pytest.RunResult) -> int:
    m = re.search(r"^oracle: seed (\d+) \(", result.stdout.str(), re.M)
    assert m, result.stdout.str()
    return int(m.group(1))


def reports_under(root: Path) -> dict[str, dict[str, Any]]:
    return {p.parent.name: json.loads(p.read_text()) for p in root.rglob("report.json")}


# -- loading -------------------------------------------------------------------------------


def test_importing_the_plugin_loads_no_torch_engine_or_runner() -> None:
    code = ("import json, sys, oracle.pytest_plugin; print(json.dumps(sorted(m for m in sys.modules if "
            "m.split('.')[0] in ('torch', 'vllm', 'transformers', 'oracle_kernels') or "
            "m.startswith(('oracle.engines', 'oracle.runner', 'oracle.judge', 'oracle.execute')))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []


def test_a_session_that_collects_oracle_yaml_imports_no_torch(inner: pytest.Pytester, fake_model: Path) -> None:
    inner.makefile(".yaml", **{"oracle-fake": yaml.safe_dump(fake_config(fake_model))})
    inner.makeconftest(
        f"import sys\nsys.path.insert(0, {str(SUPPORT)!r})\n"
        "def pytest_collection_finish(session):\n"
        "    open('modules.txt', 'w').write(' '.join(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
    )
    result = inner.runpytest_subprocess("--collect-only", "-q")
    result.stdout.fnmatch_lines(["oracle-fake.yaml::invariance"])
    assert (inner.path / "modules.txt").read_text() == ""


def test_registered_as_pytest11_entry_point_with_an_option_group(inner: pytest.Pytester) -> None:
    eps = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert eps.get("oracle") == "oracle.pytest_plugin"
    result = inner.runpytest("--help")
    result.stdout.fnmatch_lines(["oracle determinism checks:", "*--oracle-config=PATH*", "*--oracle-seed=N|last*",
                                 "*--oracle-trials=N*", "*--oracle-report-dir=DIR*"])


# -- the seed ------------------------------------------------------------------------------


def test_seed_is_drawn_shown_in_header_and_reused_with_last(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_seed="def test_seed(oracle):\n    open('seen.txt', 'w').write(str(oracle.seed))\n")
    first = inner.runpytest()
    first.assert_outcomes(passed=1)
    seed = header_seed(first)
    assert "(drawn;" in first.stdout.str()
    assert int((inner.path / "seen.txt").read_text()) == seed

    again = inner.runpytest("--oracle-seed", "last")
    again.assert_outcomes(passed=1)
    assert header_seed(again) == seed and "(last;" in again.stdout.str()
    assert int((inner.path / "seen.txt").read_text()) == seed

    fresh = inner.runpytest()
    assert header_seed(fresh) != seed  # a new draw (equal with probability 2**-32)

    given = inner.runpytest("--oracle-seed", "4242")
    assert header_seed(given) == 4242 and int((inner.path / "seen.txt").read_text()) == 4242
    assert header_seed(inner.runpytest("--oracle-seed", "last")) == 4242


def test_last_without_a_cache_draws_a_new_seed(inner: pytest.Pytester) -> None:
    result = inner.runpytest("--oracle-seed", "last", "-p", "no:cacheprovider")
    header_seed(result)
    assert "no previous seed in the cache" in result.stdout.str()


def test_explicit_seed_overrides_a_config_seed_but_a_drawn_one_does_not(
    inner: pytest.Pytester, fake_model: Path
) -> None:
    cfg = fake_config(fake_model, trials=2)
    cfg["schedule"]["seed"] = 5
    inner.makefile(".yaml", **{"oracle-pinned": yaml.safe_dump(cfg)})
    root = inner.path / "reports"

    inner.runpytest("--oracle-report-dir", str(root)).assert_outcomes(passed=4)
    assert reports_under(root)["oracle-pinned.yaml"]["seed"] == 5  # the session's drawn seed fills in only

    inner.runpytest("--oracle-report-dir", str(root), "--oracle-seed", "9").assert_outcomes(passed=4)
    assert reports_under(root)["oracle-pinned.yaml"]["seed"] == 9

    inner.runpytest("--oracle-report-dir", str(root), "--oracle-seed", "last").assert_outcomes(passed=4)
    assert reports_under(root)["oracle-pinned.yaml"]["seed"] == 9  # `last` restores it as it was: forced


@pytest.mark.parametrize(("args", "message"), [
    (["--oracle-seed", "banana"], "*--oracle-seed: expected an integer or 'last', got 'banana'*"),
    (["--oracle-seed", "-3"], "*--oracle-seed: expected a seed >= 0, got -3*"),
    (["--oracle-trials", "0"], "*--oracle-trials: expected at least 1 trial, got 0*"),
    (["--oracle-trials", "many"], "*--oracle-trials: expected a number of trials, got 'many'*"),
])
def test_bad_option_values_are_usage_errors(inner: pytest.Pytester, args: list[str], message: str) -> None:
    result = inner.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_xdist_workers_get_the_controllers_seed_and_their_runs_reach_the_summary(
    inner: pytest.Pytester, fake_model: Path
) -> None:
    seeds = """
        import os
        import pytest

        @pytest.mark.parametrize("i", range(4))
        def test_seed(oracle, i):
            worker = os.environ.get("PYTEST_XDIST_WORKER", "controller")
            open(f"seed-{worker}-{__name__}-{i}.txt", "w").write(str(oracle.seed))
    """
    inner.makepyfile(test_seeds_a=seeds, test_seeds_b=seeds + f"""
        def test_a_run(oracle):
            oracle.assert_batch_invariant([[1, 2, 3]], engine={engine_arg()}, model={str(fake_model)!r}, trials=2,
                                          checks={QUIET_CHECKS!r})
    """)
    # In z/, so the seed tests come first and xdist's first round deals them to both workers.
    (inner.path / "z").mkdir()
    (inner.path / "z" / "oracle-fake.yaml").write_text(yaml.safe_dump(fake_config(fake_model, trials=2)))
    result = inner.runpytest_subprocess("-n", "2")
    result.assert_outcomes(passed=13)
    seed = header_seed(result)
    seen = {p.name: int(p.read_text()) for p in inner.path.glob("seed-*.txt")}
    assert len(seen) == 8 and set(seen.values()) == {seed}
    assert {name.split("-")[1] for name in seen} == {"gw0", "gw1"}
    result.stdout.fnmatch_lines(["*= oracle =*"])
    result.stdout.fnmatch_lines_random([f"test_seeds_b.py::test_a_run: passed (exit 0), seed {seed}: invariance pass*",
                                        f"z/oracle-fake.yaml: passed (exit 0), seed {seed}: invariance pass*"])
    # The file's items may go to both workers; the config ran once (the other worker read its report).
    runs = [line for line in result.stdout.lines if line.startswith("z/oracle-fake.yaml: ")]
    assert len(runs) == 1 and f"seed {seed}:" in runs[0]


# -- the fixture ---------------------------------------------------------------------------


def test_assert_batch_invariant_passes_on_an_invariant_engine(inner: pytest.Pytester, fake_model: Path) -> None:
    inner.makepyfile(f"""
        def test_ok(oracle):
            report = oracle.assert_batch_invariant([[1, 2, 3], [4, 5, 6, 7]], engine={engine_arg()},
                                                   model={str(fake_model)!r}, trials=4, checks={QUIET_CHECKS!r})
            assert report.exit_code() == 0 and report.check("invariance").verdict == "pass"
            assert report.environment["trials"] == 4 and report.seed == oracle.seed
    """)
    result = inner.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*= oracle =*", "test_assert_batch_invariant_passes*::test_ok: passed (exit 0), seed *",
                                 "    config the fixture's default config; report */report.json"])


def test_failure_message_shows_the_first_divergence_and_a_replay_that_works(
    inner: pytest.Pytester, fake_model: Path
) -> None:
    inner.makepyfile(f"""
        def test_planted(oracle):
            oracle.assert_batch_invariant([[1, 2, 3], [4, 5, 6, 7]],
                                          engine={engine_arg(diverge_from_batch=3, diverge_step=2)},
                                          model={str(fake_model)!r}, trials=8, checks={QUIET_CHECKS!r})
    """)
    result = inner.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "E * AssertionError: oracle: invariance fail (seed *, exit 1)",
        "E *   invariance [[]required]: fail: * trials diverged from the solo reference*",
        "E * first divergence: check invariance (invariant mode), target prompt-*, trial *, request *",
        "E *   step 2 (logprob): expected token *, actual token *",
        "E *   logprob * -> *, ULP distance *",
        "E *   top-2 margin 0.5 (near tie: no), max |logit diff| n/a",
        "E *   that forward pass held * sequences, * tokens",
        "E * replay: oracle replay */report.json --trial * --trust-report",
    ])
    text = result.stdout.str()
    ulp = int(re.search(r"ULP distance (\d+)", text).group(1))  # type: ignore[union-attr]
    assert ulp > 0
    m = re.search(r"replay: oracle replay (\S+) --trial (\d+) (--trust-report)", text)
    assert m is not None
    # The printed command replays the divergence (the fake engine is importable here too); its flag is
    # there because the config names a custom engine class.
    assert oracle_main(["replay", m.group(1), "--trial", m.group(2), m.group(3)]) == 1


def test_token_id_prompts_go_to_a_jsonl_file_in_the_report_dir(inner: pytest.Pytester, fake_model: Path) -> None:
    inner.makepyfile(f"""
        def test_ids(oracle):
            oracle.assert_batch_invariant([[1, 2, 3], (9, 8)], engine={engine_arg()}, model={str(fake_model)!r},
                                          trials=2, checks={QUIET_CHECKS!r})
    """)
    root = inner.path / "reports"
    inner.runpytest("--oracle-report-dir", str(root)).assert_outcomes(passed=1)
    (name, report), = reports_under(root).items()
    rows = [json.loads(line) for line in (root / name / "prompts.jsonl").read_text().splitlines()]
    assert [r["prompt_token_ids"] for r in rows] == [[1, 2, 3], [9, 8]]
    assert report["config"]["prompts"]["file"] == str(root / name / "prompts.jsonl")
    assert report["environment"]["target_names"] == ["prompt-0", "prompt-1"]


def test_text_prompts_need_a_tokenizer_and_say_so_in_one_line(inner: pytest.Pytester, fake_model: Path) -> None:
    inner.makepyfile(f"""
        def test_texts(oracle):
            oracle.assert_batch_invariant(["hello there"], engine={engine_arg()}, model={str(fake_model)!r})
    """)
    result = inner.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*oracle: *tokenizer.json: no tokenizer; give prompts as token ids or random*"])
    assert "Traceback" not in result.stdout.str()


def test_bad_prompts_are_a_type_error(inner: pytest.Pytester, fake_model: Path) -> None:
    inner.makepyfile(f"""
        import pytest

        def test_bad(oracle):
            with pytest.raises(TypeError, match=r"prompts\\[1\\]: expected a string or a non-empty list of token ids"):
                oracle.assert_batch_invariant([[1], [1.5]], engine={engine_arg()}, model={str(fake_model)!r})
    """)
    inner.runpytest().assert_outcomes(passed=1)


def test_trials_precedence_call_then_marker_then_option_then_config(inner: pytest.Pytester, fake_model: Path) -> None:
    inner.makepyfile(f"""
        import pytest

        def run(oracle, **kw):
            return oracle.run({fake_config(fake_model, trials=7)!r}, **kw).environment["trials"]

        def test_option(oracle):
            assert run(oracle) == 3

        @pytest.mark.oracle(trials=4)
        def test_marker(oracle):
            assert run(oracle) == 4

        @pytest.mark.oracle(trials=4)
        def test_call(oracle):
            assert run(oracle, trials=2) == 2
    """)
    inner.runpytest("--oracle-trials", "3").assert_outcomes(passed=3)


def test_overrides_merge_sections_and_set_fields(inner: pytest.Pytester, fake_model: Path) -> None:
    inner.makepyfile(f"""
        def test_overrides(oracle):
            report = oracle.run({fake_config(fake_model, trials=2)!r}, sampling={{"max_tokens": 3}},
                                schedule__batch_size=[2, 3])
            assert report.config["sampling"]["max_tokens"] == 3
            assert report.config["sampling"]["temperature"] == 0.0  # merged, not replaced
            assert report.config["schedule"]["batch_size"] == [2, 3] and report.config["schedule"]["trials"] == 2
    """)
    inner.runpytest().assert_outcomes(passed=1)


def test_oracle_config_option_is_the_base_config(inner: pytest.Pytester, fake_model: Path) -> None:
    inner.makefile(".yaml", base=yaml.safe_dump(fake_config(fake_model, trials=2, diverge_from_batch=2)))
    inner.makepyfile("""
        def test_uses_base(oracle):
            oracle.assert_batch_invariant([[5, 6, 7]])
    """)
    result = inner.runpytest("--oracle-config", "base.yaml")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["E * AssertionError: oracle: invariance fail*", "*config *base.yaml; report *"])


def test_golden_record_then_match_then_mismatch(inner: pytest.Pytester, fake_model: Path) -> None:
    inner.makepyfile(f"""
        import json
        import pytest

        ENGINE = dict(engine={engine_arg()}, model={str(fake_model)!r})
        KW = dict(ENGINE, trials=2, checks={QUIET_CHECKS!r})

        def test_golden(oracle, tmp_path):
            golden = oracle.record_golden(tmp_path / "golden.json", [[1, 2, 3]], **ENGINE)
            report = oracle.assert_matches_golden(golden, [[1, 2, 3]], **KW)
            assert report.check("golden").verdict == "pass"
            data = json.loads(golden.read_text())
            (target,) = data["targets"].values()
            target["steps"][1] = "0" * 64
            golden.write_text(json.dumps(data))
            with pytest.raises(AssertionError, match=r"(?s)golden fail.*differ from the golden file"):
                oracle.assert_matches_golden(golden, [[1, 2, 3]], **KW)
    """)
    inner.runpytest().assert_outcomes(passed=1)


def test_a_warn_check_that_fails_warns_and_does_not_fail(inner: pytest.Pytester, fake_model: Path) -> None:
    inner.makepyfile(f"""
        def test_warn(oracle):
            oracle.assert_batch_invariant([[1, 2, 3]], engine={engine_arg()}, model={str(fake_model)!r}, trials=2,
                                          checks={{**{QUIET_CHECKS!r}, "negative_control": "warn"}})
    """)
    result = inner.runpytest()
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(["*OracleWarning: oracle negative_control [[]warn]: vacuous: production never diverged*"])


# -- the marker ----------------------------------------------------------------------------


def test_marker_arguments_are_validated_at_setup(inner: pytest.Pytester) -> None:
    inner.makepyfile("""
        import pytest

        @pytest.mark.oracle(trails=5)
        def test_unknown(oracle): pass

        @pytest.mark.oracle(trials="5")
        def test_str_trials(oracle): pass

        @pytest.mark.oracle(trials=True)
        def test_bool_trials(oracle): pass

        @pytest.mark.oracle(seed=-1)
        def test_negative_seed(oracle): pass

        @pytest.mark.oracle(10)
        def test_positional(oracle): pass

        @pytest.mark.oracle(checks={"invariance": "sometimes"})
        def test_bad_requirement(oracle): pass

        @pytest.mark.oracle(checks={"nope": "off"})
        def test_unknown_check(oracle): pass

        @pytest.mark.oracle(trials=3, seed=1, checks={"drift": "warn"}, config="x.yaml", engine="native", model="m")
        def test_fine(oracle): pass
    """)
    result = inner.runpytest("-rE")
    result.assert_outcomes(errors=7, passed=1)
    result.stdout.fnmatch_lines_random([
        "*@pytest.mark.oracle: unknown argument trails; expected some of trials, seed, config, checks, engine, model",
        "*@pytest.mark.oracle: trials= must be int, got str '5'",
        "*@pytest.mark.oracle: trials= must be int, got bool True",
        "*@pytest.mark.oracle: seed= must be >= 0, got -1",
        "*@pytest.mark.oracle: takes keyword arguments only (trials=, seed=, config=, checks=, engine=, model=)*",
        "*@pytest.mark.oracle: checks={'invariance': 'sometimes'}: invariance.requirement: Input should be*",
        "*@pytest.mark.oracle: checks={'nope': 'off'}: nope: unknown check",
    ])
    assert "Traceback" not in result.stdout.str()


def test_marker_values_reach_the_fixture(inner: pytest.Pytester, fake_model: Path) -> None:
    (inner.path / "configs").mkdir()
    (inner.path / "configs" / "planted.yaml").write_text(
        yaml.safe_dump(fake_config(fake_model, trials=9, diverge_from_batch=2)))
    inner.makepyfile(f"""
        import pytest

        @pytest.mark.oracle(config="configs/planted.yaml", seed=31, trials=2, checks={{"invariance": "warn"}})
        def test_config_seed_trials_checks(oracle):
            report = oracle.run()
            assert report.seed == 31 and report.environment["trials"] == 2
            assert report.check("invariance").requirement == "warn"
            assert report.check("invariance").verdict == "fail" and report.exit_code() == 0

        @pytest.mark.oracle(engine="fake_engine:FakeEngine", model={str(fake_model)!r}, trials=2,
                            checks={QUIET_CHECKS!r})
        def test_engine_model(oracle):
            report = oracle.assert_batch_invariant([[3, 4]])
            assert report.config["engine"]["kind"] == "fake_engine:FakeEngine"
            assert report.config["model"] == {str(fake_model)!r}
    """)
    inner.runpytest("-W", "ignore::UserWarning").assert_outcomes(passed=2)


# -- YAML collection -----------------------------------------------------------------------


def test_oracle_yaml_files_are_items_one_per_check(inner: pytest.Pytester, fake_model: Path) -> None:
    checks = {"prefill_decode": "off", "prefix_cache": "off", "negative_control": "warn"}
    inner.makefile(".yaml", **{
        "oracle-good": yaml.safe_dump(fake_config(fake_model, checks=checks)),
        "oracle-planted": yaml.safe_dump(fake_config(fake_model, checks=checks, diverge_from_batch=2)),
        "not-oracle": yaml.safe_dump(fake_config(fake_model)),
    })
    inner.makefile(".yml", **{"oracle-alone": yaml.safe_dump(fake_config(fake_model, checks=checks,
                                                                           always_alone=True))})
    collected = inner.runpytest("--collect-only", "-q")
    names = [line for line in collected.stdout.lines if "::" in line]
    assert names == [f"{f}::{c}" for f in ("oracle-alone.yml", "oracle-good.yaml", "oracle-planted.yaml")
                     for c in ("invariance", "repeatability", "fidelity", "drift", "negative_control")]

    root = inner.path / "reports"
    result = inner.runpytest("-v", "--oracle-report-dir", str(root))
    result.assert_outcomes(passed=13, failed=2, warnings=3)
    result.stdout.fnmatch_lines_random([
        "oracle-good.yaml::invariance PASSED*",
        "oracle-planted.yaml::invariance FAILED*",
        "oracle-planted.yaml::negative_control PASSED*",  # production is clean: vacuous, at warn
        "oracle-alone.yml::invariance FAILED*",  # never batched: vacuous, at required
        "oracle-alone.yml::repeatability PASSED*",  # the same trial twice: no batch needed
        "oracle-alone.yml::drift PASSED*",  # drift is a report, never a failure
    ])
    result.stdout.fnmatch_lines([
        "*_ oracle oracle-planted.yaml::invariance _*",
        "oracle: invariance fail (seed *, exit 1)",
        "  invariance [[]required]: fail: *",
        "first divergence: check invariance (invariant mode), *",
        "replay: oracle replay */oracle-planted.yaml/report.json --trial *",
    ])
    result.stdout.fnmatch_lines(["*oracle-alone.yml:1: OracleWarning: oracle: negative_control vacuous*"])
    # Each file ran once; the summary lists the runs.
    assert set(reports_under(root)) == {"oracle-good.yaml", "oracle-planted.yaml", "oracle-alone.yml"}
    result.stdout.fnmatch_lines_random([
        "oracle-good.yaml: passed with warnings (exit 0), seed *: invariance pass, repeatability pass, *",
        "oracle-planted.yaml: failed (exit 1), seed *: invariance fail, *",
        "oracle-alone.yml: failed (exit 1), seed *: invariance vacuous, repeatability pass, *",
    ])
    assert sum("config " in line and "; report " in line for line in result.stdout.lines) == 3
    assert "Traceback" not in result.stdout.str()


def test_oracle_trials_option_overrides_a_yaml_config(inner: pytest.Pytester, fake_model: Path) -> None:
    inner.makefile(".yaml", **{"oracle-x": yaml.safe_dump(fake_config(fake_model, trials=7))})
    root = inner.path / "reports"
    inner.runpytest("--oracle-report-dir", str(root), "--oracle-trials", "3").assert_outcomes(passed=4)
    assert reports_under(root)["oracle-x.yaml"]["environment"]["trials"] == 3


def test_yaml_config_error_is_a_one_line_collection_error(inner: pytest.Pytester, fake_model: Path) -> None:
    inner.makefile(".yaml", **{"oracle-typo": f"model: {fake_model}\nprompts: {{random: {{count: 2}}}}\n"
                                              "schedule:\n  trails: 5\n"})
    result = inner.runpytest()
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*_ ERROR collecting oracle-typo.yaml _*", "*oracle-typo.yaml:4: schedule.trails: unknown field; did you mean trials?",
                                 "*= short test summary info =*"])
    assert "Traceback" not in result.stdout.str()


def test_yaml_engine_failure_fails_every_item_with_the_error(inner: pytest.Pytester, fake_model: Path) -> None:
    inner.makefile(".yaml", **{"oracle-dies": yaml.safe_dump(fake_config(fake_model, fail_after_calls=3))})
    result = inner.runpytest()
    result.assert_outcomes(failed=4)
    result.stdout.fnmatch_lines(["*engine error: engine raised RuntimeError: planted engine failure*"])


def test_yaml_unknown_engine_kind_fails_items_in_one_line(inner: pytest.Pytester, fake_model: Path) -> None:
    cfg = fake_config(fake_model)
    cfg["engine"]["kind"] = "no_such_module:Engine"
    inner.makefile(".yaml", **{"oracle-kind": yaml.safe_dump(cfg)})
    result = inner.runpytest()
    result.assert_outcomes(failed=4)
    result.stdout.fnmatch_lines(["oracle: engine.kind: cannot import 'no_such_module'*"])
    assert "Traceback" not in result.stdout.str()


# -- the real model and the docs -------------------------------------------------------------


def test_default_config_runs_the_tiny_model_with_text_prompts(inner: pytest.Pytester, tiny_qwen3: Path) -> None:
    """The one test on the real tiny model: the fixture's default path (preset, tokenizer, native engine)."""
    inner.makepyfile("""
        def test_tiny(oracle):
            report = oracle.assert_batch_invariant(
                ["The capital of France is"], trials=2, sampling={"max_tokens": 3},
                schedule={"repeat_trials": 1, "batch_size": [2, 4], "filler_len": [1, 8], "filler_max_tokens": [1, 3], "arrival_step": [0, 0],
                          "max_num_batched_tokens": None, "shrink": False},
                checks={"prefill_decode": "off", "prefix_cache": "off"})
            assert report.config["model"] == "preset:tiny-qwen3" and report.config["engine"]["kind"] == "native"
            assert report.check("invariance").verdict == "pass"
            assert report.check("invariance").evidence["trials_batched"] == 2
    """)
    inner.runpytest_subprocess().assert_outcomes(passed=1)  # the native engine loads more of torch


def _write_word_tokenizer(model: Path) -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    words = ["[UNK]", "The", "capital", "of", "France", "is", "def", "fibonacci", "(", "n", "):"]
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()  # type: ignore[assignment]
    tok.save(str(model / "tokenizer.json"))


def test_docs_pytest_snippet_works_as_pasted(inner: pytest.Pytester, fake_model: Path) -> None:
    """The README's pytest snippet (docs/pytest.md shows the same), over the fake engine (given a word
    tokenizer) as the base config."""
    section = DOCS.read_text().split("\n## pytest\n")[1].split("\n## ")[0]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    assert code in (DOCS.parent / "docs" / "pytest.md").read_text()
    assert "oracle.assert_batch_invariant" in code and "@pytest.mark.oracle(" in code
    _write_word_tokenizer(fake_model)
    cfg = fake_config(fake_model)
    inner.makefile(".yaml", fake=yaml.safe_dump(cfg))
    inner.makepyfile(test_determinism=code)
    result = inner.runpytest("--oracle-config", "fake.yaml", "--oracle-trials", "4", "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines_random(["*test_default_model_is_batch_invariant PASSED*",
                                        "*test_token_id_prompts PASSED*"])


def test_an_engine_that_calls_os_exit_0_fails_the_pytest_run(inner: pytest.Pytester, fake_model: Path) -> None:
    """os._exit(0) would end pytest with exit 0 before any report: under the plugin it is an engine error,
    the test fails and the session goes on; never a green session."""
    inner.makepyfile(f"""
        def test_exits(oracle):
            oracle.assert_batch_invariant([[1, 2, 3], [4, 5, 6, 7]],
                                          engine={engine_arg(fault_after_calls=2, fault="os_exit")},
                                          model={str(fake_model)!r}, trials=4, checks={QUIET_CHECKS!r})
    """)
    result = inner.runpytest_subprocess("--oracle-report-dir", str(inner.path / "reports"))
    assert result.ret != 0, result.stdout.str()
    (report,) = reports_under(inner.path / "reports").values()
    assert report["complete"] is False and report["exit_code"] == 3
    assert "os._exit(0)" in report["error"], report["error"]  # the run's own engine error: pytest went on
    assert "1 failed" in result.stdout.str()


def test_sigterm_to_a_pytest_run_never_leaves_an_earlier_pass(inner: pytest.Pytester, fake_model: Path) -> None:
    """The run's folder holds an earlier session's passing report; SIGTERM while this session's run is under
    way (pytest dies at once: it has no SIGTERM handler) leaves this run's "started" report, not the pass."""
    import signal
    import subprocess
    import sys
    import time

    root = inner.path / "reports"
    stale = root / "oracle-slow.yaml"
    stale.mkdir(parents=True)
    (stale / "report.json").write_text(json.dumps({"complete": True, "exit_code": 0, "error": None}))
    started = inner.path / "started"
    inner.makepyfile(started_flag=f"open({str(started)!r}, 'w').close()\n")
    cfg = fake_config(fake_model, trials=200, sleep_s=0.05)
    cfg["engine"]["preload"] = ["started_flag"]
    inner.makefile(".yaml", **{"oracle-slow": yaml.safe_dump(cfg)})
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--oracle-report-dir", str(root)],
                            cwd=inner.path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not started.exists():  # the engine is being built: the run is under way
            assert proc.poll() is None and time.monotonic() < deadline, "the run never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) != 0
    finally:
        proc.kill()
    report = json.loads((stale / "report.json").read_text())
    assert report["complete"] is False and report["exit_code"] == 3


def test_the_terminal_summary_uses_the_clis_words(inner: pytest.Pytester, fake_model: Path) -> None:
    """A report-only check that found divergences is `reported` (not `pass`) in pytest's summary too, as in the
    CLI, summary.md and report.html."""
    inner.makefile(".yaml", **{"oracle-drifts": yaml.safe_dump(fake_config(
        fake_model, diverge_from_batch=2, diverge_mode="production",
        checks={"drift": "report", "negative_control": "off", "fidelity": "off"}))})
    result = inner.runpytest()
    result.stdout.fnmatch_lines(["oracle-drifts.yaml: passed (exit 0), seed *: *drift reported*"])


def test_a_report_level_gate_that_fails_is_a_warning(inner: pytest.Pytester, fake_model: Path) -> None:
    """A report-only check whose gate failed warns (the item passes), as the headline `passed with warnings`,
    summary.md and the Action's annotations say."""
    drift = {"requirement": "report", "max_divergent_fraction": 0.0}
    inner.makefile(".yaml", **{"oracle-gated": yaml.safe_dump(fake_config(
        fake_model, diverge_from_batch=2, diverge_mode="production",
        checks={"drift": drift, "negative_control": "off", "fidelity": "off"}))})  # type: ignore[dict-item]
    result = inner.runpytest("-v")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("warnings") == 1, outcomes
    result.stdout.fnmatch_lines(["*oracle-gated.yaml::drift PASSED*", "*OracleWarning: oracle: drift fail (seed *, exit 0)*"])
    result.stdout.fnmatch_lines(["oracle-gated.yaml: passed with warnings (exit 0), seed *: *drift fail*"])


@pytest.mark.slow
def test_the_readme_pytest_example_is_clean_on_the_default_config(pytester: pytest.Pytester,
                                                                    model_cache: Path) -> None:
    """The first example a user copies passes without a warning (no vacuous prefix_cache: its prompts are
    longer than a KV block, so the warm runs hit the cache), on the fixture's real default config."""
    section = DOCS.read_text().split("\n## pytest\n")[1].split("\n## ")[0]
    pytester.makepyfile(test_determinism=re.findall(r"```python\n(.*?)```", section, re.S)[0])
    result = pytester.runpytest_subprocess("--oracle-trials", "10", "--oracle-seed", "1", "-W", "error::UserWarning",
                                           "-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    assert "OracleWarning" not in result.stdout.str() and "prefix_cache vacuous" not in result.stdout.str()
