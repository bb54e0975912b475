"""CLI paths not covered elsewhere."""

from __future__ import annotations

import pytest

from oracle.cli import main


def test_bench_kernels_without_cuda_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: `oracle bench kernels` would run")
    assert main(["bench", "kernels"]) == 2
    assert "no CUDA device" in capsys.readouterr().err
