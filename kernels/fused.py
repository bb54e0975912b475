"""The decoder's elementwise chains as ops of our own: RMS norm with the residual add, q/k norm with rope, silu * up.

Each op is a torch.library op in the `oracle_kernels` namespace whose default (and CPU) implementation is
the torch composition below, the code oracle/engines/native/model.py runs when the ops are not used. On
CUDA, `enable()` registers the fused Triton kernels of kernels/triton/fused.py over them, bitwise equal to
the composition run with the other kernels enabled, for bf16 and fp16 (other dtypes run the composition).

    rms_norm(x, weight, eps)                  weight * rms_norm(x.float()).to(dtype)
    add_rms_norm(x, residual, weight, eps)    (rms_norm(residual + x), residual + x)
    qk_norm_rope(x, weight?, cos, sin, eps)   rope(rms_norm(x) per head, or x): x [T, H, D], cos, sin [T, 1, D]
    silu_mul(gate, up)                        silu(gate) * up

Every half-precision step of the composition is its own torch kernel, computed in fp32 and rounded once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm_composed(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMS norm: in float32 over the last dim, cast back, then scaled by the weight."""
    xf = x.to(torch.float32)
    y = F.rms_norm(xf, (xf.shape[-1],), eps=eps)
    return weight * y.to(x.dtype)


def rope_composed(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rope as in HF Llama/Qwen: x [T, H, D]; cos, sin [T, 1, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return rms_norm_composed(x, weight, eps)


def _add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    h = residual + x
    return rms_norm_composed(h, weight, eps), h


def _qk_norm_rope(x: torch.Tensor, weight: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                  eps: float) -> torch.Tensor:
    return rope_composed(rms_norm_composed(x, weight, eps) if weight is not None else x, cos, sin)


def _silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


# (name, schema, composition): the compositions are the default kernels and `registry.py`'s CPU rows.
OPS = (
    ("rms_norm", "rms_norm(Tensor x, Tensor weight, float eps) -> Tensor", _rms_norm),
    ("add_rms_norm", "add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)",
     _add_rms_norm),
    ("qk_norm_rope", "qk_norm_rope(Tensor x, Tensor? weight, Tensor cos, Tensor sin, float eps) -> Tensor",
     _qk_norm_rope),
    ("silu_mul", "silu_mul(Tensor gate, Tensor up) -> Tensor", _silu_mul),
)
COMPOSED = {name: fn for name, _, fn in OPS}

# As kernels/attention.py does for paged_attention: a fragment, each op defined once per process (this file
# may be imported as `oracle_kernels` and as `kernels`).
_LIBRARY = torch.library.Library("oracle_kernels", "FRAGMENT")
for _name, _schema, _fn in OPS:
    if not hasattr(torch.ops.oracle_kernels, _name):
        _LIBRARY.define(_schema)
        _LIBRARY.impl(_name, _fn, "CompositeExplicitAutograd")
        # Shapes for tracing: each output is shaped as the first input.
        torch.library.register_fake(f"oracle_kernels::{_name}", _fn, lib=_LIBRARY)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`oracle_kernels::rms_norm`: weight * rms_norm(x in fp32).to(x.dtype), over the last dim."""
    out: torch.Tensor = torch.ops.oracle_kernels.rms_norm.default(x, weight, eps)
    return out


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """`oracle_kernels::add_rms_norm` -> (rms_norm(h, weight), h) for h = residual + x (rounded once)."""
    out, h = torch.ops.oracle_kernels.add_rms_norm.default(x, residual, weight, eps)
    return out, h


def qk_norm_rope(x: torch.Tensor, weight: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                 eps: float) -> torch.Tensor:
    """`oracle_kernels::qk_norm_rope`: rope(rms_norm(x, weight) per head, or x when weight is None).

    x [T, H, D]; weight [D]; cos, sin [T, 1, D] in x's dtype -> [T, H, D]."""
    out: torch.Tensor = torch.ops.oracle_kernels.qk_norm_rope.default(x, weight, cos, sin, eps)
    return out


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """`oracle_kernels::silu_mul`: silu(gate) * up, each step rounded to the dtype."""
    out: torch.Tensor = torch.ops.oracle_kernels.silu_mul.default(gate, up)
    return out
