"""The vLLM worker's logprob rows on one CUDA GPU: read from vLLM's engine core outputs (the worker hands vLLM's output
processor none), they are what vLLM's own lists hold, bit for bit, on the model runner vLLM picks there (0.26 runs a
dense model on its second runner, vllm/v1/worker/gpu/, whose logprobs come from a Triton kernel). The CPU's twin of
this test is tests/integration/test_vllm_cpu.py::test_the_workers_rows_are_vllms_own_logprobs; both run
tests/support/vllm_own_lists.py in a process of its own.

Needs a CUDA device and vLLM: `pytest -m gpu tests/gpu/test_vllm_worker_rows_cuda.py`. Not yet run on a GPU.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def small_qwen3(model_cache: Path) -> Path:
    from oracle.models import ensure_model

    return ensure_model("small-qwen3", cache_dir=model_cache)


def test_the_workers_rows_are_vllms_own_logprobs_on_cuda(small_qwen3: Path, tmp_path: Path) -> None:
    script = Path(__file__).parents[1] / "support" / "vllm_own_lists.py"
    out = tmp_path / "rows.pkl"
    done = subprocess.run([sys.executable, str(script), str(small_qwen3), str(out), "0.2"], timeout=900,
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got = pickle.loads(out.read_bytes())
    worker, own = got["worker"], got["vllm"]
    assert worker.keys() == own.keys() and len(worker) == 12
    assert sum(len(w["rows"]) for w in worker.values()) == 6 and len(worker["digest"]["digests"]) == 5
    for rid, w in worker.items():
        assert len(w["tokens"]) > 0
        assert w == own[rid], rid
