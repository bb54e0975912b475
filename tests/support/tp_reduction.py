"""What a tensor-parallel run must say where two all-reduce paths sum in different orders: every failing invariance
trial named at the all-reduce (class `communication`), its confirmation truthful. Shared by the CPU test that CI
runs (tests/integration/test_vllm_tp_localize.py: vLLM CPU's shared-memory all-reduce against a planted order in
rank 1) and the two-GPU test (tests/gpu/test_vllm_tp_cuda.py: the custom all-reduce against NCCL)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

ALL_REDUCE = "oracle_vllm.all_reduce.default"


def assert_every_failure_names_the_all_reduce(divergences: Sequence[Mapping[str, Any]],
                                              rank: int | None = None) -> list[Mapping[str, Any]]:
    """Every invariance divergence is localized at the all-reduce of a layer (in `rank` where given); returns the
    ops. `confirmed` is asserted only with the note that says why where it is not."""
    found = [d for d in divergences if d["check"] == "invariance"]
    assert found, "invariance found no failing trial"
    ops = [d.get("localized_op") for d in found]
    assert all(op is not None for op in ops), "a failing trial was not localized"
    for op in ops:
        assert op is not None
        assert op["status"] == "localized", op
        assert op["op"] == ALL_REDUCE and op["op_class"] == "communication", op
        assert rank is None or op["rank"] == rank, op
        assert op["confirmation"] == "confirmed" or op["confirm_note"], op
    return [op for op in ops if op is not None]
