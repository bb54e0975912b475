"""The CUDA backend's Triton kernels under Triton's CPU interpreter, on tiny shapes, in a child pytest.

TRITON_INTERPRET=1 must be set before triton decorates the kernels, and it would then hold for
the rest of the process: every Triton kernel imported later (a GPU test's, say) would run as
interpreted Python. So this test runs each case file (tests/unit/triton_interpreter_cases.py,
triton_interpreter_fused_cases.py for the fused decoder kernels and triton_interpreter_sampling_cases.py
for the sampler's) in a child pytest of its own with the
variable set (each patches the interpreter its own way), and passes when every case there passes.
Skipped without triton.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
@pytest.mark.parametrize("cases", [
    "triton_interpreter_cases.py", "triton_interpreter_fused_cases.py", "triton_interpreter_sampling_cases.py",
])
def test_triton_kernels_under_the_interpreter(cases: str) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "pytest", str(HERE / cases), "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-rfEs"]
    proc = subprocess.run(cmd, env=env, cwd=HERE.parents[1], capture_output=True, text=True, timeout=600)
    report = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, report
    assert " passed" in proc.stdout and " skipped" not in proc.stdout, report
