"""The checks' rows (oracle.judge.CHECKS): one module of oracle/checks per field of `checks:` (its verdict, its runs, its
row, its view section), and every check that runs targets of its
own declares those runs in its row, so the execution runs them and a shard's results carry them with no other
edit (a check added without a part fails here, never reads as `vacuous` in a merged run)."""

from __future__ import annotations

import typing

import pytest
from test_shard_codec import full_result

from oracle.checks.base import CheckRun
from oracle.config import ChecksConfig, parse_config
from oracle.judge import CHECKS, check_data, check_runs
from oracle.mode_result import ModeResult
from oracle.shards.results import MODE_RETYPE


def test_every_field_of_checks_has_a_row_and_every_row_a_field() -> None:
    assert list(CHECKS) == list(ChecksConfig.model_fields)


def test_a_shards_results_carry_every_checks_own_runs_by_its_declared_type() -> None:
    declared = typing.get_type_hints(MODE_RETYPE[(ModeResult, "checks")])
    assert declared == check_data()
    assert set(declared) == {"prefill_decode", "prefix_cache", "seeded_sampling", "cross_instance", "tp_parity"}
    # The round-trip sample (test_shard_codec) holds a value for each: a new check's runs get one there.
    assert set(full_result().checks) == set(declared)


def test_check_runs_are_the_enabled_checks_own_runs_in_table_order() -> None:
    config = parse_config({"model": "preset:tiny-qwen3", "prompts": {"random": {"count": 1}},
                           "checks": {"prefill_decode": "warn", "prefix_cache": "off", "seeded_sampling": "required",
                                      "cross_instance": "off", "tp_parity": "off"}})
    runs = check_runs(config)
    assert list(runs) == ["prefill_decode", "seeded_sampling"]
    assert all(isinstance(r, CheckRun) for r in runs.values())
    assert runs["prefill_decode"] is CHECKS["prefill_decode"].runs


def test_a_check_whose_runs_keep_a_type_with_no_encoding_fails_when_the_codec_is_built() -> None:
    from typing import TypedDict

    from oracle.shards.codec import codec_for

    grown = TypedDict("grown", {**check_data(), "new_check": set[int]}, total=False)  # type: ignore[misc]
    with pytest.raises(TypeError, match=r"ModeResult\.checks\.new_check: type set\[int\] has no JSON encoding"):
        codec_for(ModeResult, retype={**MODE_RETYPE, (ModeResult, "checks"): grown})


def test_each_check_is_one_module_holding_its_verdict_its_runs_and_its_row() -> None:
    """oracle/checks/NAME.py per row, listed once; no check module is left out of the list."""
    import importlib
    from pathlib import Path

    import oracle.checks

    shared = {"__init__", "base", "solo", "strength"}  # what the checks share, not checks
    modules = {p.stem for p in Path(oracle.checks.__file__).parent.glob("*.py")} - shared
    assert modules == set(CHECKS), "a module under oracle/checks/ is a check and needs its line in judge.CHECKS"
    for name, row in CHECKS.items():
        module = importlib.import_module(f"oracle.checks.{name}")
        assert module.ROW is row and row.name == name
        assert row.judge.__module__ == module.__name__, f"{name}: its verdict function lives in its module"
        if row.runs is not None:
            assert row.runs.run.__module__ == module.__name__, f"{name}: its runs live in its module"


def test_a_check_that_writes_divergence_records_names_its_view_section() -> None:
    """The views list divergence records by the sections the rows name (oracle.judge.sections): a check whose
    module makes records and names no section would have its records shown nowhere."""
    import inspect

    from oracle.checks.base import SECTIONS
    from oracle.judge import sections

    for name, row in CHECKS.items():
        source = inspect.getsource(inspect.getmodule(row.judge))  # type: ignore[arg-type]
        writes = "record(runs" in source or "solo import against_solo" in source
        assert bool(row.section) == writes, f"{name}: section {row.section!r}"
        assert not row.section or row.section in SECTIONS
    assert [title for title, _ in sections()] == list(SECTIONS)
    assert sum(len(names) for _, names in sections()) == sum(bool(r.section) for r in CHECKS.values())


def test_a_checks_runs_on_the_modes_engine_name_their_phase() -> None:
    """A hang in a check's runs names the check (its `CheckRun.phase`), never a request id decoded back."""
    for name, row in CHECKS.items():
        if row.runs is not None and not row.runs.after_close:
            assert row.runs.phase.endswith("check"), name
