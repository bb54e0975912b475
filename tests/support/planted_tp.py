"""The native engine at tensor parallel > 1 with one planted fault, for localization tests on the CPU.

Two faults, each in one rank and one layer, only in invariant mode:

- `TokenOrderedAllReduce` (fault "all_reduce"): one all-reduce (by default layer 0's `down_proj`, rank 1)
  sums in an order that follows the number of tokens in the pass. Its partials and the residual it is fused
  with are added `residual + (p_0 + p_1)` in passes of up to `min_tokens` tokens, and `(residual + p_own)
  + p_other` above (as a fused all-reduce + residual kernel that switches algorithm by message size would):
  with two ranks a + b == b + a in IEEE, so the change of association is what moves the bits. Alone (a
  one-token decode pass) the target gets the fixed order; beside others it does not.
- `RankMatmulFault` (fault "matmul"): oracle's `PlantedFault` (tests/support/planted.py) in one rank's passes,
  one op of one module nudged by `ulps` float steps above `min_tokens` tokens.

Usable from a config as `engine.kind: planted_tp:PlantedTPEngine` (tests/support is on sys.path, and the
ranks inherit it), the fault in `engine.options`; the other options are the native engine's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from oracle.config import EngineConfig
from oracle.engines.contract import Mode
from oracle.engines.native import NativeEngine
from oracle.engines.native.parallel import Reducer


class TokenOrderedAllReduce(Reducer):
    def __init__(self, name: str, rank: int, min_tokens: int) -> None:
        self.name, self.rank, self.min_tokens = name, rank, min_tokens

    def reduce(self, parts: Sequence[torch.Tensor], residual: torch.Tensor, name: str, rank: int) -> torch.Tensor:
        if name != self.name or rank != self.rank or parts[0].shape[0] <= self.min_tokens:
            return super().reduce(parts, residual, name, rank)
        out = residual + parts[rank]
        for q, p in enumerate(parts):
            if q != rank:
                out = out + p
        return out

    def describe(self) -> str:
        return (f"planted: {self.name} in rank {self.rank} adds the residual to its own partial first above "
                f"{self.min_tokens} tokens")


class RankMatmulFault(Reducer):
    def __init__(self, module: str, op: str, rank: int, min_tokens: int, ulps: int) -> None:
        self.module, self.op, self.rank, self.min_tokens, self.ulps = module, op, rank, min_tokens, ulps

    def around_pass(self, rank: int, scope: Any) -> contextlib.AbstractContextManager[None]:
        if rank != self.rank:
            return contextlib.nullcontext()
        from planted import PlantedFault

        return PlantedFault(lambda: scope.path[-1] if scope.path else "", self.module, self.op, self.min_tokens,
                            self.ulps)

    def describe(self) -> str:
        return f"planted: {self.module} {self.op} in rank {self.rank} +{self.ulps} ULP above {self.min_tokens} tokens"


class PlantedTPEngine(NativeEngine):
    """A sharded NativeEngine whose invariant mode carries one planted fault (module docstring)."""

    def __init__(self, model: Path, mode: Mode, *, fault: str = "all_reduce",
                 fault_module: str = "model.layers.0.mlp.down_proj", fault_op: str = "aten.mm.default",
                 fault_rank: int = 1, min_tokens: int = 1, ulps: int = 1, **kwargs: Any) -> None:
        reducer: Reducer | None = None
        if mode == "invariant" and fault == "all_reduce":
            reducer = TokenOrderedAllReduce(fault_module, fault_rank, min_tokens)
        elif mode == "invariant":
            reducer = RankMatmulFault(fault_module, fault_op, fault_rank, min_tokens, ulps)
        super().__init__(model, mode, EngineConfig.of("native", **kwargs), reducer=reducer)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "engine": "planted"}


class NoKernelsInRank(Reducer):
    """Rank `rank` turns oracle_kernels off in its process as it starts: invariant mode is not in force there."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def start(self, rank: int) -> None:
        if rank == self.rank:
            import oracle_kernels

            oracle_kernels.disable()


class DyingRank(Reducer):
    """Rank `rank`'s process exits inside an all-reduce of a pass of more than `min_tokens` tokens."""

    def __init__(self, rank: int, min_tokens: int) -> None:
        self.rank, self.min_tokens = rank, min_tokens

    def reduce(self, parts: Sequence[torch.Tensor], residual: torch.Tensor, name: str, rank: int) -> torch.Tensor:
        if rank == self.rank and parts[0].shape[0] > self.min_tokens:
            import os

            os._exit(7)
        return super().reduce(parts, residual, name, rank)
