"""Opaque handles among an op's arguments: what a repro rebuilds them from, one row per op.

Some engine kernels take a pointer to a C++ object of the engine's process instead of a tensor they
read: vLLM's CPU GEMM `_C::onednn_mm(c, a, bias, handler_tensor)` gets `handler_tensor`, an int64
holding the address of a oneDNN matmul handle built at load from the layer's weight (which vLLM then
drops). In the engine's process the confirmation re-runs the op with the same handle; a repro, in
another process, must build a new one. Each `HandleRecipe` says which argument is the handle, how to
read back what it was built from (here the weight, by running the handle on an identity matrix: each
product is one weight times 1.0 plus zeros, exact), and how to build it again; the writer checks that
the rebuilt handle gives the op's bits on both captured inputs before the repro relies on it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from oracle.capture.copies import named_args


@dataclass(frozen=True)
class HandleRecipe:
    """How one op's opaque handle argument is read back and rebuilt (`build` runs in repro.py too)."""

    arg: str  # the handle's argument name in the op's schema
    read: Callable[[dict[str, Any]], dict[str, torch.Tensor]]  # the call's named args -> tensors to build from
    build: Callable[[dict[str, torch.Tensor]], torch.Tensor]  # those tensors -> a new handle argument
    recipe: str  # the name repro.py knows the build by (REPRO_BUILDS there)


# vLLM builds its oneDNN handles with a primitive cache of 32 (vllm/model_executor/layers/utils.py).
ONEDNN_PRIMITIVE_CACHE = 32


def _onednn_weight(named: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The [N, K] weight a `_C::onednn_mm` handle was built from: the handle run on I_K gives W^T, row by row."""
    out, a, handle = named["c"], named["a"], named["handler_tensor"]
    k, n = int(a.shape[-1]), int(out.shape[-1])
    weight_t = torch.empty(k, n, dtype=a.dtype)  # [K, N]
    step = 256  # rows of the identity per call: bounded memory for a large K
    for lo in range(0, k, step):
        hi = min(k, lo + step)
        eye = torch.zeros(hi - lo, k, dtype=a.dtype)
        eye[:, lo:hi] = torch.eye(hi - lo, dtype=a.dtype)
        part = torch.empty(hi - lo, n, dtype=a.dtype)
        torch.ops._C.onednn_mm(part, eye, None, handle)
        weight_t[lo:hi] = part
    return {"weight": weight_t.t().contiguous()}  # [N, K], as the layer held it


def _onednn_build(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    # vLLM passes the layer's [N, K] weight transposed: a [K, N] view (strides as oneDNN reads them).
    ptr = torch.ops._C.create_onednn_mm_handler(tensors["weight"].t(), ONEDNN_PRIMITIVE_CACHE)
    return torch.tensor(ptr, dtype=torch.int64)


HANDLES: dict[str, HandleRecipe] = {
    "_C::onednn_mm": HandleRecipe("handler_tensor", _onednn_weight, _onednn_build, "onednn_mm_handler"),
}


def recipe_for(func: Any) -> HandleRecipe | None:
    return HANDLES.get(str(func._schema.name))


def suspect_handles(func: Any, args: Any, kwargs: dict[str, Any]) -> list[str]:
    """Arguments that look like an opaque handle no recipe covers: a 0-dim int64 tensor named like one."""
    recipe = recipe_for(func)
    return [name for name, v in named_args(func, args, kwargs).items()
            if isinstance(v, torch.Tensor) and v.dim() == 0 and v.dtype == torch.int64
            and any(w in name.lower() for w in ("handle", "handler", "ptr", "workspace"))
            and (recipe is None or recipe.arg != name)]
