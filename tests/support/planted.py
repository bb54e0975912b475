"""A native engine with one planted batch-variant fault: for localization tests on the CPU.

`PlantedEngine` is a `NativeEngine` that, in invariant mode, moves the output of one op in one
module (by default `aten.mm.default` in `model.layers.1.mlp.down_proj`) by `ulps` float steps
toward +inf, only in forward passes that hold more than `min_tokens` tokens. Alone the target
stays under that size and is exact; batched beside others it is not, exactly like a kernel that
switches configuration with the pass's size. Usable from a config as `engine.kind:
planted:PlantedEngine` (tests/support is on sys.path), with the fault in `engine.options`: the
keyword arguments it does not take itself are the native engine's (`EngineConfig.of`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from oracle.config import EngineConfig
from oracle.engines.contract import Completion, Mode
from oracle.engines.native import NativeEngine
from oracle.engines.native.model import Decoder
from oracle.engines.transformers_engine import TransformersEngine


class PlantedFault(TorchDispatchMode):
    """Perturbs `op`'s outputs inside `module` when their leading (token) dimension exceeds `min_tokens`.

    `module_path()` names the module the model is in now (the native decoder's scope stack, or
    hooks on a Hugging Face model). An in-place op that writes by index (`aten.index_put_`, a KV-cache
    write) has its written values perturbed instead, on its first call in `module` per pass, when the
    pass (counted from its token embedding) holds more than `min_tokens` tokens: in a one-token decode
    pass beside others' prefills too.
    """

    def __init__(self, module_path: Callable[[], str], module: str, op: str, min_tokens: int, ulps: int) -> None:
        super().__init__()
        self.module_path, self.module, self.op, self.min_tokens, self.ulps = module_path, module, op, min_tokens, ulps
        self.hits = 0
        self.pass_tokens = 0
        self.calls_in_pass = 0

    def _nudged(self, t: torch.Tensor) -> torch.Tensor:
        up = torch.full_like(t, float("inf"))
        for _ in range(self.ulps):
            t = torch.nextafter(t, up)
        return t

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.ops.aten.embedding.default:  # a new pass: its tokens
            self.pass_tokens, self.calls_in_pass = int(args[1].numel()), 0
        mine = str(func) == self.op and self.module_path() == self.module
        if mine and func is torch.ops.aten.index_put_.default:
            self.calls_in_pass += 1
            if self.calls_in_pass == 1 and self.pass_tokens > self.min_tokens:
                self.hits += 1
                args = (args[0], args[1], self._nudged(args[2]), *args[3:])
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if mine and isinstance(out, torch.Tensor) and out.dim() > 0 and out.shape[0] > self.min_tokens:
            self.hits += 1
            out = self._nudged(out)
        return out


class PlantedEngine(NativeEngine):
    """NativeEngine plus a `PlantedFault` around every `generate` in invariant mode."""

    def __init__(self, model: Path | Decoder, mode: Mode, *, fault_module: str = "model.layers.1.mlp.down_proj",
                 fault_op: str = "aten.mm.default", min_tokens: int = 48, ulps: int = 1, **kwargs: Any) -> None:
        super().__init__(model, mode, EngineConfig.of("native", **kwargs))
        scopes = self.decoder.scopes
        self.fault = PlantedFault(lambda: scopes.path[-1] if scopes.path else "", fault_module, fault_op,
                                  min_tokens, ulps)

    def describe(self) -> dict[str, Any]:
        f = self.fault
        return {**super().describe(), "engine": "planted",
                "planted_fault": f"{f.module} {f.op} +{f.ulps} ULP above {f.min_tokens} tokens"}

    def generate(self, requests: Any, max_num_batched_tokens: int | None = None) -> list[Completion]:
        if self.mode != "invariant":
            return super().generate(requests, max_num_batched_tokens)
        # Entered outside any capture's mode, so a capture (entered per pass, inside) sees the perturbed output.
        with self.fault:
            return super().generate(requests, max_num_batched_tokens)


class PlantedTransformersEngine(TransformersEngine):
    """The transformers engine with the same kind of fault, its module found by forward hooks.

    A flattened linear layer's matmul is `[B * S, out]`, so `min_tokens` counts the padded batch.
    """

    def __init__(self, model: Path, mode: Mode, *, fault_module: str = "model.layers.1.mlp.down_proj",
                 fault_op: str = "aten.mm.default", min_tokens: int = 48, ulps: int = 1, **kwargs: Any) -> None:
        super().__init__(model, mode, EngineConfig.of("transformers", **kwargs))
        inside: list[str] = []
        module = self.model.get_submodule(fault_module)
        module.register_forward_pre_hook(lambda m, a: inside.append(fault_module))
        module.register_forward_hook(lambda m, a, o: inside.pop() and None)
        self.fault = PlantedFault(lambda: inside[-1] if inside else "", fault_module, fault_op, min_tokens, ulps)

    def generate(self, requests: Any, max_num_batched_tokens: int | None = None) -> list[Completion]:
        if self.mode != "invariant":
            return super().generate(requests, max_num_batched_tokens)
        with self.fault:
            return super().generate(requests, max_num_batched_tokens)


class FlakyFault(PlantedFault):
    """`PlantedFault` that fires in one forward pass of every `period` (counted over the engine's life), whatever
    the pass holds: a run-to-run fault, not a batch-variant one."""

    def __init__(self, module_path: Callable[[], str], module: str, op: str, ulps: int, period: int) -> None:
        super().__init__(module_path, module, op, 0, ulps)
        self.period, self.passes = period, 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten.embedding.default:
            self.passes += 1
        if self.passes % self.period:
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


class FlakyEngine(PlantedEngine):
    """The native engine whose invariant mode moves `aten.mm` of layer 1's down_proj by `ulps` in one pass of every
    `period`: run to run, whatever the batch."""

    def __init__(self, model: Path | Decoder, mode: Mode, *, period: int = 7, **kwargs: Any) -> None:
        super().__init__(model, mode, **kwargs)
        scopes, f = self.decoder.scopes, self.fault
        self.fault = FlakyFault(lambda: scopes.path[-1] if scopes.path else "", f.module, f.op, f.ulps, period)


class SharedRngEngine(NativeEngine):
    """The native engine with a sampler fault in invariant mode: every seeded request of one `generate` call draws
    its noise from one generator (the first seeded request's), so a request's draws follow what else is in the
    call, while its logits stay bitwise those of its solo run. Production mode is the engine's own."""

    def generate(self, requests: Any, max_num_batched_tokens: int | None = None) -> list[Completion]:
        self._shared: torch.Generator | None = None
        return super().generate(requests, max_num_batched_tokens)

    def _generator(self, r: Any) -> torch.Generator | None:
        own = super()._generator(r)
        if own is None or self.mode != "invariant":
            return own
        if self._shared is None:
            self._shared = own
        return self._shared
