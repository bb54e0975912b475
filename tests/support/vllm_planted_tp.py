"""A vLLM general plugin for tests only: a planted fault in vLLM CPU's rank 1 at tensor parallel 2.

Never in oracle's package: `install(folder)` writes a dist-info with its `vllm.general_plugins` entry point
beside a copy of this module, and a test puts `folder` on the worker's PYTHONPATH (the ranks inherit it), so
vLLM loads it in every process it runs, as it loads oracle's own plugin. It acts only in an invariant-mode worker
with oracle_kernels (ORACLE_VLLM_KERNELS=1) whose environment names a fault file (ORACLE_PLANTED_TP); the
file's text picks the fault at each call, so one engine serves every case:

- `all_reduce`: the tensor-parallel all-reduce of every rank becomes an all-gather and a sum in rank order
  (`p_0 + p_1`, the bits gloo's sum of two gives), except in rank 1 in passes of more than one token, where it
  adds the other rank's partial in two halves after its own, `(p_1 + p_0/2) + p_0/2`: another order of the same
  real numbers (with two ranks `a + b == b + a`, so only a change of association moves bits).
- `matmul`: in rank 1, aten::mm over layer down_proj's shard (K 1536, N 1024 for small-qwen3) with more than
  one row is split over K in two halves, `a[:, :K/2] @ b[:K/2] + a[:, K/2:] @ b[K/2:]`, each half on
  oracle_kernels' own mm: a matmul whose reduction order follows M, as a split-K kernel chosen by size.
- anything else (`none`): both paths as vLLM's and oracle_kernels' own, bit for bit.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

ENV = "ORACLE_PLANTED_TP"
RANK = 1
DOWN_PROJ_SHARD = (1536, 1024)  # small-qwen3's down_proj at TP 2: b = W.t() is [K, N]


def install(folder: Path) -> Path:
    """This module and its entry point's dist-info in `folder` (put it on PYTHONPATH)."""
    info = folder / "oracle_vllm_planted_tp-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: oracle-vllm-planted-tp\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[vllm.general_plugins]\noracle_vllm_planted_tp = "
                                           "oracle_vllm_planted_tp:register\n")
    shutil.copy(__file__, folder / "oracle_vllm_planted_tp.py")
    return folder


def _fault() -> str:
    try:
        return Path(os.environ[ENV]).read_text().strip()
    except OSError:
        return "none"


def register() -> None:
    if os.environ.get("ORACLE_VLLM_KERNELS") != "1" or not os.environ.get(ENV):
        return
    from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator
    from vllm.v1.worker.cpu_worker import CPUWorker

    CpuCommunicator.all_reduce = _all_reduce  # type: ignore[method-assign]
    original = CPUWorker.load_model

    def load_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        if self.rank == RANK:
            _plant_matmul()
        return out

    CPUWorker.load_model = load_model  # type: ignore[method-assign]


def _all_reduce(self: Any, input_: Any) -> Any:
    import torch
    import torch.distributed as dist

    parts = [torch.empty_like(input_) for _ in range(self.world_size)]
    dist.all_gather(parts, input_.contiguous(), group=self.device_group)
    me = self.rank_in_group
    if me == RANK and input_.dim() and input_.shape[0] > 1 and _fault() == "all_reduce":
        out = parts[me]
        for q, p in enumerate(parts):
            if q != me:
                out = (out + 0.5 * p) + 0.5 * p
    else:
        out = parts[0]
        for p in parts[1:]:
            out = out + p
    input_.copy_(out)
    return input_


_LIBRARY: list[Any] = []  # kept alive: the registration lasts the process's life


def _plant_matmul() -> None:
    import torch
    from oracle_kernels.cpu.matmul import mm_adapter

    def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if a.shape[0] > 1 and tuple(b.shape) == DOWN_PROJ_SHARD and _fault() == "matmul":
            h = b.shape[0] // 2
            return mm_adapter(a[:, :h], b[:h]) + mm_adapter(a[:, h:], b[h:])
        return mm_adapter(a, b)

    lib = torch.library.Library("aten", "IMPL")
    lib.impl("mm", mm, "CPU")
    _LIBRARY.append(lib)
