"""Which batch-variant ops does a piece of model code reach, and are they covered?

`audit(fn, ...)` runs `fn` under a TorchDispatchMode that sees every op call, and lists the ones
our kernels ran (covered) and the ones that can change a row's result with the batch but ran on
torch's kernels (uncovered). Ops that cannot vary (views, copies, indexing, cat, exact
elementwise arithmetic, max/argmax) are not listed. What can vary is an explicit list, kept below with the
reason for each group, not a guess from op names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .registry import covered_names, is_enabled

# A floating-point sum whose order torch's kernel picks from the shapes of the call.
_REDUCING_OPS = frozenset({
    # Matrix products: BLAS blocks the K loop differently by M (MKL: M=1, M<4, M>=4).
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::mv", "aten::addmv",
    "aten::dot", "aten::vdot", "aten::_addmm_activation", "aten::convolution",
    # Reductions: split over threads when there are few output rows.
    "aten::sum", "aten::sum.dim_IntList", "aten::nansum", "aten::mean", "aten::mean.dim",
    "aten::prod", "aten::prod.dim_int", "aten::var.correction", "aten::std.correction",
    "aten::var_mean.correction", "aten::std_mean.correction", "aten::linalg_vector_norm",
    "aten::norm.ScalarOpt_dim", "aten::logsumexp", "aten::cumsum", "aten::cumprod",
    # Fused ops with a reduction inside.
    "aten::_softmax", "aten::_log_softmax", "aten::_safe_softmax", "aten::native_layer_norm",
    "aten::native_group_norm", "aten::native_batch_norm", "aten::_native_batch_norm_legit_no_training",
    "aten::nll_loss_forward", "aten::mse_loss", "aten::_embedding_bag",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    # Our attention op: its default (production) path splits the KV range by batch size.
    "oracle_kernels::paged_attention",
    # Our fused decoder chains (kernels/fused.py): their default path is the composition on torch's kernels.
    "oracle_kernels::rms_norm", "oracle_kernels::add_rms_norm", "oracle_kernels::qk_norm_rope",
    "oracle_kernels::silu_mul",
})

# Elementwise ops whose CPU kernel runs a vectorised function on whole vectors and a scalar one
# on the tail of each thread's chunk, and the two round differently; chunk ends move with the
# element count. Measured on torch 2.13 (AVX-512); exp, log, sin, cos, tanh, erf, sqrt and exact
# arithmetic agreed in both paths and are not listed.
_TAIL_ROUNDING_OPS = frozenset({
    "aten::silu", "aten::sigmoid", "aten::exp2", "aten::softplus", "aten::mish",
})


def _scalar_arg(args: Sequence[Any], kwargs: Mapping[str, Any], index: int, name: str, default: Any) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else default


def _is_fractional(x: Any) -> bool:
    if isinstance(x, (bool, int)):
        return False
    return not (isinstance(x, float) and x.is_integer())


def _is_half(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype in (torch.bfloat16, torch.float16)


# Ops that vary only for some arguments: (args, kwargs) -> whether this call can vary.
_VARIES_WHEN: dict[str, Callable[[Sequence[Any], Mapping[str, Any]], bool]] = {
    # Integer exponents (x * x for rms_norm's pow 2) are exact; pow(x, 1.5) is not.
    "aten::pow.Tensor_Scalar": lambda a, k: _is_fractional(_scalar_arg(a, k, 1, "exponent", 2)),
    "aten::gelu": lambda a, k: _scalar_arg(a, k, 1, "approximate", "none") == "tanh",
    "aten::rsqrt": lambda a, k: _is_half(a[0]),
    "aten::add.Tensor": lambda a, k: _is_half(a[0]) and _scalar_arg(a, k, 2, "alpha", 1) != 1,
}

BATCH_VARIANT_OPS: frozenset[str] = _REDUCING_OPS | _TAIL_ROUNDING_OPS | frozenset(_VARIES_WHEN)


def can_vary_with_batch(name: str, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None) -> bool:
    """Whether a call of op `name` ("aten::mm") with these arguments can give a row a result that depends on the batch."""
    when = _VARIES_WHEN.get(name)
    if when is not None:
        return when(args, kwargs or {})
    return name in BATCH_VARIANT_OPS


@dataclass(frozen=True)
class AuditResult:
    """The ops a call reached, by name ("aten::mm"), sorted, each listed once.

    covered: every op that ran through the batch-invariant kernels. uncovered: the batch-variant
    ops (`BATCH_VARIANT_OPS`) that ran through torch's own kernels, so a row's result may depend on
    the rest of the batch. Other ops (views, copies, exact arithmetic) are not listed.
    """

    covered: tuple[str, ...]
    uncovered: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """True when no batch-variant op ran uncovered."""
        return not self.uncovered


class _OpRecorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.covered: set[str] = set()
        self.uncovered: set[str] = set()

    def __torch_dispatch__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        name = func.name()
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd"):
            # Reached only where autograd is off (inference_mode): look inside, as the CPU would.
            with self:
                return func.decompose(*args, **kwargs)
        device = next((x.device for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)), None)
        if device is not None and is_enabled() and name in covered_names(device.type):
            self.covered.add(name)
        elif can_vary_with_batch(name, args, kwargs):
            self.uncovered.add(name)
        return func(*args, **kwargs)


def audit(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> AuditResult:
    """Run `fn(*args, **kwargs)` once and report the batch-variant ops it reached.

    The call runs for real (with whatever kernels are enabled now); its result is discarded.
    """
    recorder = _OpRecorder()
    with recorder:
        fn(*args, **kwargs)
    return AuditResult(tuple(sorted(recorder.covered)), tuple(sorted(recorder.uncovered)))
