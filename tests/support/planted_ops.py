"""One-op faults planted in the native decoder, each the shape of a real kernel bug, for localization tests.

Every planted op is a `torch.library` custom op that writes an argument (`out=`-style, as vLLM's
`_C.rms_norm(out, ...)` or its KV-cache writes) and moves its result by one float step when the
pass holds more than `min_tokens` tokens: exact alone, off beside other requests.

`PlantedDecoder(config, weights, fault=..., module=..., min_tokens=...)`:
- `norm_out`: the norm of `module` computed into a fresh `empty_like` buffer by `planted::rms_norm_out`
  (an op that writes its `out` argument, downstream of a fresh allocation);
- `norm_into`: the same through `planted::rms_norm_into(c, ...)`, whose written buffer is not named `out`;
- `overwritten`: the norm of `module` is exact, but first a perturbed copy is written into the buffer
  by `planted::noisy_copy` and then overwritten whole by `copy_`: a difference nothing reads;
- `kv_write`: the layer's keys written into the KV cache by `planted::kv_write`, perturbed;
- `norm_split`: the norm of `module` by `planted::rms_norm_split`, a kernel that splits each row's
  reduction in two halves whenever it has two rows or more (as a kernel picks another split by M): its
  bits follow its own input's shape, so run alone on the trial's input it moves again (input-keyed).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from oracle.engines.native.model import Decoder, ModelConfig


def _nudge(t: torch.Tensor) -> torch.Tensor:
    return torch.nextafter(t, torch.full_like(t, float("inf")))


@torch.library.custom_op("planted::rms_norm_out", mutates_args=("out",))
def rms_norm_out(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float, min_tokens: int) -> None:
    y = weight * F.rms_norm(x.to(torch.float32), (x.shape[-1],), eps=eps).to(x.dtype)
    out.copy_(_nudge(y) if x.shape[0] > min_tokens else y)


@torch.library.custom_op("planted::rms_norm_into", mutates_args=("c",))
def rms_norm_into(c: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float, min_tokens: int) -> None:
    """As rms_norm_out, with the written buffer first and not named `out` (vLLM's `_C.onednn_mm(c, ...)`)."""
    rms_norm_out(c, x, weight, eps, min_tokens)


@torch.library.custom_op("planted::noisy_copy", mutates_args=("out",))
def noisy_copy(out: torch.Tensor, x: torch.Tensor, min_tokens: int) -> None:
    out.copy_(_nudge(x) if x.shape[0] > min_tokens else x)


@torch.library.custom_op("planted::kv_write", mutates_args=("cache",))
def kv_write(cache: torch.Tensor, slots: torch.Tensor, values: torch.Tensor, min_tokens: int) -> None:
    cache[slots] = _nudge(values) if values.shape[0] > min_tokens else values


@torch.library.custom_op("planted::rms_norm_split", mutates_args=())
def rms_norm_split(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.to(torch.float32)  # [M, hidden]
    if xf.shape[0] >= 2:  # rows to spare: the sum of squares in two halves, added
        h = xf.shape[-1] // 2
        ms = (xf[:, :h].pow(2).sum(-1, keepdim=True) + xf[:, h:].pow(2).sum(-1, keepdim=True)) / xf.shape[-1]
    else:
        ms = xf.pow(2).mean(-1, keepdim=True)
    return weight * (xf * torch.rsqrt(ms + eps)).to(x.dtype)


class PlantedDecoder(Decoder):
    """The native decoder with one planted fault (see the module docstring)."""

    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], *, fault: str, module: str = "",
                 layer: int = 0, min_tokens: int = 40) -> None:
        super().__init__(config, weights)
        self.fault, self.module, self.layer, self.min_tokens = fault, module, layer, min_tokens
        self._layer_writes = 0

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        here = self.scopes.path[-1] if self.scopes.path else ""
        if here != self.module or self.fault not in ("norm_out", "norm_into", "overwritten", "norm_split"):
            return super()._rms_norm(x, weight)
        if self.fault == "norm_split":
            return rms_norm_split(x, weight, self.config.rms_norm_eps)
        out = torch.empty_like(x)
        if self.fault in ("norm_out", "norm_into"):
            write = rms_norm_out if self.fault == "norm_out" else rms_norm_into
            write(out, x, weight, self.config.rms_norm_eps, self.min_tokens)
            return out
        exact = super()._rms_norm(x, weight)
        noisy_copy(out, exact, self.min_tokens)  # differs in a big pass ...
        out.copy_(exact)  # ... and is overwritten before anything reads it
        return out

    def _write_kv(self, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                  k: torch.Tensor, v: torch.Tensor) -> None:
        layer = self._layer_writes % self.config.num_layers
        self._layer_writes += 1
        if self.fault != "kv_write" or layer != self.layer:
            return super()._write_kv(k_cache, v_cache, slot_mapping, k, v)
        c = self.config
        kv_write(k_cache.view(-1, c.num_kv_heads, c.head_dim), slot_mapping, k, self.min_tokens)
        v_cache.view(-1, c.num_kv_heads, c.head_dim)[slot_mapping] = v
        return None


def planted_decoder(base: Decoder, **fault: Any) -> PlantedDecoder:
    return PlantedDecoder(base.config, base.w, **fault)
