"""The checks' rows (oracle.judge.CHECKS): one per field of `checks:`, and every check that runs targets of its
own declares those runs in its row, so the execution runs them and a shard's results carry them with no other
edit (a check added without a part fails here, never reads as `vacuous` in a merged run)."""

from __future__ import annotations

import typing

import pytest
from test_shard_codec import full_result

from oracle.config import ChecksConfig, parse_config
from oracle.execute import CheckRun, ModeResult
from oracle.judge import CHECKS, check_data, check_runs
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
