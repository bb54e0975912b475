"""An engine written against the earlier contract reads `RunSpec.budget`: it keeps working for a release, with a
DeprecationWarning naming the new field."""

from __future__ import annotations

import pytest

from oracle.engines.contract import Request, RunSpec, SamplingParams


def test_budget_reads_max_num_batched_tokens_with_a_deprecation_warning() -> None:
    spec = RunSpec((Request("r0", (1, 2, 3), SamplingParams(max_tokens=2)),), 0, 64)
    with pytest.warns(DeprecationWarning, match="RunSpec.max_num_batched_tokens"):
        assert spec.budget == 64
    with pytest.warns(DeprecationWarning):
        assert RunSpec(spec.requests, 0).budget is None
