"""Tensor parallelism of the native decoder: Megatron-style shards and the all-reduce between them.

Rank r of N holds, per layer:
- q_proj, k_proj, v_proj: its rows (heads `r*H/N .. (r+1)*H/N`, kv heads likewise): column-parallel;
- gate_proj, up_proj: its rows of the intermediate size: column-parallel;
- o_proj, down_proj: the matching columns: row-parallel, each followed by an all-reduce of the partial
  products, fused with the residual add that follows it (as fused all-reduce + residual kernels do):
  `h = residual + (p_0 + p_1 + ... + p_{N-1})`, the partials added in rank order, the same in every rank;
- the norms, the embedding and lm_head: replicated whole (every rank computes the logits; rank 0's are the
  engine's). An o_proj bias (Llama with attention_bias) is kept in rank 0 only, so it is added once.

The all-reduce is one op, `oracle_tp::all_reduce(partial, residual, name)`: the per-op capture sees it as
an op like the others (its class `communication`), inside its layer's `o_proj` or `down_proj` scope. Its
kernel gathers every rank's partial over the rank group's gloo communicator, then hands them to the group's
`Reducer` (`FixedOrderSum` unless a test plants another), which is also what a confirmation re-runs alone.
The sum is elementwise and its order is fixed, so the op is batch invariant.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

from oracle.engines.native.model import ModelConfig

ALL_REDUCE_OP = "oracle_tp.all_reduce.default"

_lib = torch.library.Library("oracle_tp", "DEF")
_lib.define("all_reduce(Tensor partial, Tensor residual, str name) -> Tensor")


class Reducer:
    """How an all-reduce combines the ranks' partials: `residual + (parts[0] + parts[1] + ...)`, in rank order.

    Subclassed only by tests (a planted fault). `around_pass(rank)` wraps each forward pass of a rank;
    `start(rank)` runs once in each rank's process after its kernels are set (both do nothing here).
    """

    def reduce(self, parts: Sequence[torch.Tensor], residual: torch.Tensor, name: str, rank: int) -> torch.Tensor:
        total = parts[0]
        for p in parts[1:]:
            total = total + p
        return residual + total

    def start(self, rank: int) -> None:
        return None

    def around_pass(self, rank: int, scope: Any) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def describe(self) -> str:
        return "gloo all-gather, partials summed in rank order, then the residual"


class Communicator(Protocol):
    """What the all-reduce needs of a rank group: its rank, its size, an all-gather."""

    rank: int
    size: int

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]: ...


@dataclass
class _Binding:
    comm: Communicator
    reducer: Reducer


# The rank group of this process while a forward pass runs (set by `bound`, restored in finally).
_BOUND: list[_Binding] = []


@contextlib.contextmanager
def bound(comm: Communicator, reducer: Reducer) -> Iterator[None]:
    """The all-reduce op talks to `comm` and reduces with `reducer` inside this block."""
    _BOUND.append(_Binding(comm, reducer))
    try:
        yield
    finally:
        _BOUND.pop()


def _all_reduce_cpu(partial: torch.Tensor, residual: torch.Tensor, name: str) -> torch.Tensor:
    if not _BOUND:
        raise RuntimeError("oracle_tp::all_reduce called outside a rank group's pass")
    b = _BOUND[-1]
    parts = b.comm.all_gather(partial.contiguous())
    return b.reducer.reduce(parts, residual, name, b.comm.rank)


_lib.impl("all_reduce", _all_reduce_cpu, "CPU")


def all_reduce(partial: torch.Tensor, residual: torch.Tensor, name: str) -> torch.Tensor:
    """`residual + sum over ranks of partial` ([T, hidden] each), through the `oracle_tp::all_reduce` op."""
    out: torch.Tensor = torch.ops.oracle_tp.all_reduce(partial, residual, name)
    return out


def divisibility_problem(config: ModelConfig, size: int) -> str | None:
    """Why `size` ranks cannot split this model evenly, or None."""
    for what, n in (("attention heads", config.num_heads), ("kv heads", config.num_kv_heads),
                    ("intermediate size", config.intermediate_size)):
        if n % size:
            return f"tensor_parallel_size {size} does not divide the model's {what} ({n})"
    return None


def shard(config: ModelConfig, weights: dict[str, torch.Tensor], rank: int,
          size: int) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Rank `rank`'s config (its heads and intermediate size) and weights, Megatron-style (module docstring)."""
    c = config
    hq, hkv, inter = c.num_heads // size, c.num_kv_heads // size, c.intermediate_size // size
    d = c.head_dim
    rows = {"self_attn.q_proj": hq * d, "self_attn.k_proj": hkv * d, "self_attn.v_proj": hkv * d,
            "mlp.gate_proj": inter, "mlp.up_proj": inter}
    cols = {"self_attn.o_proj": hq * d, "mlp.down_proj": inter}
    out: dict[str, torch.Tensor] = {}
    for name, t in weights.items():
        module, _, kind = name.rpartition(".")
        local = module.split(".", 3)[-1] if module.startswith("model.layers.") else ""
        if local in rows:  # weight [out, in] or bias [out]: this rank's rows
            n = rows[local]
            out[name] = t.narrow(0, rank * n, n).contiguous()
        elif local in cols and kind == "weight":
            n = cols[local]
            out[name] = t.narrow(1, rank * n, n).contiguous()
        elif local in cols:  # a row-parallel bias: added once, in rank 0
            if rank == 0:
                out[name] = t
        else:
            out[name] = t
    return replace(c, num_heads=hq, num_kv_heads=hkv, intermediate_size=inter), out
