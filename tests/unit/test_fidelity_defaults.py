"""Fidelity's default tolerances fit engine.dtype: a healthy bfloat16 run (max |dlogprob| about 0.1 on an
H200) passes, float32 keeps its tight defaults, and a tolerance the config gives wins."""

from __future__ import annotations

from typing import Any

import pytest

from oracle.config import FIDELITY_DEFAULTS, parse_config


def _config(dtype: str, checks: dict[str, Any] | None = None) -> Any:
    return parse_config({"model": "m", "engine": {"dtype": dtype}, "prompts": {"random": {"count": 1}},
                         **({"checks": checks} if checks is not None else {})})


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_defaults_follow_the_dtype(dtype: str) -> None:
    f = _config(dtype).checks.fidelity
    assert (f.max_logprob_diff, f.max_kl, f.near_tie) == tuple(FIDELITY_DEFAULTS[dtype].values())


def test_a_healthy_bf16_run_fits_the_bf16_default_and_not_the_fp32_one() -> None:
    assert _config("bfloat16").checks.fidelity.max_logprob_diff > 0.097 > _config("float32").checks.fidelity.max_logprob_diff


@pytest.mark.parametrize("fidelity", ["warn", False, {"max_kl": 0.5}])
def test_given_values_and_shorthands_keep_the_rest_by_dtype(fidelity: Any) -> None:
    f = _config("bfloat16", {"fidelity": fidelity}).checks.fidelity
    assert f.max_logprob_diff == 0.25
    assert f.max_kl == (0.5 if isinstance(fidelity, dict) else 0.05)
    assert f.requirement == ("warn" if fidelity == "warn" else "off" if fidelity is False else "required")
