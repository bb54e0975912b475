"""The vLLM worker's logprob rows on one CUDA GPU: read from vLLM's engine core outputs (the worker hands vLLM's output
processor none), they are what vLLM's own lists hold, bit for bit, on the model runner vLLM picks there (0.26 runs a
dense model on its second runner, vllm/v1/worker/gpu/, whose logprobs come from a Triton kernel). The CPU's twin of
this test is tests/integration/test_vllm_cpu.py::test_the_workers_rows_are_vllms_own_logprobs; both run
tests/support/vllm_own_lists.py in a process of its own.

Needs a CUDA device and vLLM: `pytest -m gpu tests/gpu/test_vllm_worker_rows_cuda.py`. Not yet run on a GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
pytest.importorskip("vllm")


def test_the_workers_rows_are_vllms_own_logprobs_on_cuda(small_qwen3: Path, tmp_path: Path) -> None:
    from vllm_own_lists import assert_rows_are_vllms

    assert_rows_are_vllms(small_qwen3, tmp_path, gpu_share=0.2)
