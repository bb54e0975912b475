"""The vendor-path routing of kernels/cublaslt.py and the tile choice of kernels/triton/config.py, off the GPU.

The premise itself (cuBLASLt without split-K gives the Triton kernel's bits) needs a GPU:
tests/gpu/test_kernels_cublaslt_cuda.py. Here: what the routing refuses without one, and the tiles.
"""

from __future__ import annotations

import oracle_kernels
import pytest
import torch
from oracle_kernels import cublaslt
from oracle_kernels.triton.config import CUBLASLT_MIN_M, matmul_config


def _never_called(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    raise AssertionError("no comparison may run for a product cuBLASLt is not tried for")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
def test_without_cuda_the_vendor_path_is_off_and_enable_leaves_torchs_flags() -> None:
    assert not cublaslt.available()
    assert cublaslt.flags_on() is None
    before = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    with oracle_kernels.batch_invariant():
        assert torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction == before
    assert oracle_kernels.matmul_paths() == {
        "available": False, "min_m": CUBLASLT_MIN_M, "admitted_problems": 0, "barred": []}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_products_off_cuda_never_reach_cublaslt(dtype: torch.dtype) -> None:
    a, b = torch.randn(64, 32).to(dtype), torch.randn(32, 16).to(dtype)
    assert not cublaslt.use_cublaslt(a, b, _never_called)


def test_the_triton_setting_turns_the_vendor_path_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORACLE_KERNELS_MATMUL", "triton")
    assert not cublaslt.available()
    assert cublaslt.flags_on() is None
    cublaslt.flags_restore(None)  # nothing to restore


def test_decode_tiles_narrow_when_n_leaves_sms_idle() -> None:
    config = matmul_config(torch.bfloat16)
    decode = config.tiers[0][1]
    assert config.narrow is not None
    # N = 4096 makes 64 column tiles of 64: fewer than an H200's 132 SMs.
    assert config.tiles_for(1, 4096, 132) == config.narrow
    assert config.tiles_for(64, 4096, 132) == config.narrow
    # N = 6144 makes 96, but 192 narrow ones would take two waves; N = 24576 makes 384: enough.
    assert config.tiles_for(8, 6144, 132) == decode
    assert config.tiles_for(1, 24576, 132) == decode
    # Past the first tier the narrow tiles never apply.
    assert config.tiles_for(65, 4096, 132) == config.tiers[1][1]
    assert config.tiles_for(10**6, 4096, 132) == config.tiers[-1][1]
    # Without the SM count (reports), the tier by M.
    assert config.tiles_for(1) == decode


def test_every_half_tier_issues_wgmma_shaped_tiles() -> None:
    """BLOCK_M a multiple of 64 and warps a multiple of 4 keep Triton on wgmma (config.py)."""
    config = matmul_config(torch.float16)
    for tiles in [t for _, t in config.tiers] + [config.narrow]:
        assert tiles is not None
        assert tiles.block_m % 64 == 0 and tiles.num_warps % 4 == 0 and tiles.block_k % 16 == 0
