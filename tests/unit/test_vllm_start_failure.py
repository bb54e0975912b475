"""vLLM's own invariant mode on a CPU (VLLM_BATCH_INVARIANT=1) crashes at start in Triton, which has no driver
there: the error says so and names the alternative, `invariance: oracle_kernels`."""

from __future__ import annotations

import pytest

from oracle.engines.vllm_engine import start_failure_reason

# As Triton words it (triton/runtime/driver.py), as the worker's reply and as the tail of its log.
TRITON = "RuntimeError: 0 active drivers ([]). There should only be one."
LOG_TAIL = ("\n--- worker log /tmp/oracle-vllm-x.log (last 40 lines) ---\n"
            '  File ".../triton/runtime/driver.py", line 8, in _create_driver\n'
            "    raise RuntimeError(f\"{len(actives)} active drivers ({actives}). There should only be one.\")\n"
            f"{TRITON}")


@pytest.mark.parametrize("text", [TRITON, LOG_TAIL, "RuntimeError: no active driver found"])
def test_a_triton_launch_without_a_driver_is_explained(text: str) -> None:
    reason = start_failure_reason(text)
    assert "VLLM_BATCH_INVARIANT=1" in reason and "Triton has no driver" in reason
    assert "invariance: oracle_kernels" in reason and "\n" not in reason


@pytest.mark.parametrize("text", ["", "RuntimeError: CUDA out of memory", "ValueError: unknown model architecture"])
def test_other_start_failures_get_no_invented_reason(text: str) -> None:
    assert start_failure_reason(text) == ""
