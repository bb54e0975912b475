"""oracle's vLLM plugin: invariant mode's kernels in every process that runs the model, and each rank's account of them.

vLLM calls every `vllm.general_plugins` entry point once in each process it runs: the process that builds
the engine and every worker it starts (each tensor-parallel rank, each pipeline stage), however they are
started (in-process, `multiprocessing`, Ray). oracle registers `register` there (pyproject.toml), so its
kernels reach the ranks vLLM starts itself, not only the first process.

`register` does nothing unless `ORACLE_VLLM_KERNELS=1` is in the process's environment, which only the vllm
engine adapter sets, and only for an invariant-mode worker configured with `invariance: oracle_kernels`
(`oracle.engines.vllm_engine`): a user's unrelated vLLM is never affected by having oracle installed.

The rest are functions for `LLMEngine.collective_rpc`: each runs in every rank, on its worker, and answers
what that rank really runs (`rank_report`) and which ops its forward passes reached (`audit_begin` /
`audit_end`). The parent checks the claim with them before any trial runs (`not_in_force`).

Importing this module imports neither torch nor vllm (vLLM imports every plugin in every process).
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

ENV = "ORACLE_VLLM_KERNELS"
PLUGIN_NAME = "oracle_kernels"  # the entry point's name, as `VLLM_PLUGINS` lists it

# What this process's plugin did; read back by `rank_report` in the same process.
_LOADED: dict[str, bool] = {"kernels": False}


def register() -> None:
    """vLLM's general-plugin hook: with ORACLE_VLLM_KERNELS=1, turn oracle_kernels on for this process's life
    and bind vLLM's CPU linear layers to aten (`F.linear`) so the overrides reach them.

    Process-wide and not restored: the process exists to run this one invariant-mode engine and ends with it
    (a plugin has no scope to restore in). Calling it twice is harmless.
    """
    if os.environ.get(ENV) != "1":
        return
    import oracle_kernels
    from vllm.model_executor.layers import utils as layer_utils

    oracle_kernels.enable()
    _pin_triton_attention()
    # vLLM's CPU backend binds each linear layer to oneDNN (`_C::onednn_mm`) at load time (vLLM looks the
    # function up in this module when a layer loads); oneDNN never passes through aten, so no override
    # could reach it.
    layer_utils.dispatch_cpu_unquantized_gemm = _aten_gemm
    _LOADED["kernels"] = True


# vLLM's Triton attention reads this module flag at each call: set, it never launches its split-KV (3D) decode
# kernel, whose number of KV segments follows the batch, and runs its one-pass kernel for every pass.
_TRITON_ATTENTION = ("vllm.v1.attention.ops.triton_unified_attention", "is_batch_invariant")


def _pin_triton_attention() -> None:
    """On CUDA, pin vLLM's TRITON_ATTN backend to the launch its own batch-invariant mode picks (one pass over the
    KV range, no split), before any graph is captured; the other backends read VLLM_BATCH_INVARIANT itself, which
    would also swap vLLM's own kernels in for ours, so they stay unpinned (oracle.engines.vllm_coverage)."""
    import importlib

    from vllm.platforms import current_platform  # reads the platform without starting CUDA in this process

    if not current_platform.is_cuda():
        return
    module, flag = _TRITON_ATTENTION
    try:
        setattr(importlib.import_module(module), flag, True)
    except ImportError:  # a vLLM without this kernel: attention reads as unpinned in rank_report
        return


def attention_pinned() -> bool | None:
    """Whether this process runs vLLM's Triton attention pinned (None: that kernel's module is not loaded)."""
    import sys

    module, flag = _TRITON_ATTENTION
    loaded = sys.modules.get(module)
    return None if loaded is None else bool(getattr(loaded, flag, False))


def _aten_gemm(layer: Any, remove_weight: bool) -> None:
    import torch

    layer.cpu_linear = torch.nn.functional.linear


def linear_kernels(model: Any) -> dict[str, int]:
    """How many layers of `model` run each linear kernel, read from the loaded layers (vLLM's CPU backend binds
    one per layer at load, `layer.cpu_linear`): the path really taken, not the one expected. Empty on CUDA."""
    counts: Counter[str] = Counter()
    for module in model.modules():
        fn = getattr(module, "cpu_linear", None)
        if fn is None:
            continue
        code = getattr(getattr(fn, "__code__", None), "co_names", ())
        name = getattr(fn, "__name__", "")
        if "onednn_mm" in code:
            counts["oneDNN (_C::onednn_mm)"] += 1
        elif "weight_packed_linear_cpu" in code:
            counts["sgl-kernel weight_packed_linear"] += 1
        elif "zentorch_linear_unary" in code:
            counts["zentorch"] += 1
        elif name == "linear" or "linear" in code:
            counts["torch F.linear (aten mm)"] += 1
        else:
            counts[name or "other"] += 1
    return dict(counts)


# The all-reduce paths of vLLM's CUDA communicator, in the order its `all_reduce` tries them (each one takes
# a message only under its own size and dtype gates, so which one a pass uses follows the batch's size).
_CUDA_ALL_REDUCE = (
    ("fi_pcie_ipc_ar_comm", "flashinfer pcie all-reduce"), ("fi_ar_comm", "flashinfer all-reduce"),
    ("qr_comm", "quick all-reduce"), ("aiter_ar_comm", "aiter custom all-reduce"),
    ("ca_comm", "custom all-reduce"), ("symm_mem_comm", "symm mem all-reduce"), ("pynccl_comm", "pynccl (NCCL)"),
)


def all_reduce_of(group: Any) -> str:
    """The all-reduce a process group's ranks really use, read from its device communicator: on vLLM's CPU
    build the shared-memory all-reduce or torch.distributed (gloo); on CUDA every enabled path in the order
    tried, then NCCL through torch.distributed. "none" for a group of one; "unknown" for what it cannot read."""
    if group is None:
        return "unknown"
    if getattr(group, "world_size", None) == 1:
        return "none"
    comm = getattr(group, "device_communicator", None)
    kind = type(comm).__name__
    if kind == "CpuCommunicator":
        module = getattr(comm, "dist_module", None)
        if type(module).__name__ == "_CPUSHMDistributed":
            return "cpu shm all-reduce (vLLM _CPUSHMDistributed)"
        backend = "unknown"
        try:
            import torch.distributed as dist

            backend = str(dist.get_backend(getattr(comm, "device_group", None)))
        except Exception:  # noqa: BLE001 - posture only: a backend this reader cannot name stays unknown
            pass
        return f"torch.distributed ({backend})"
    if kind == "CudaCommunicator":
        paths = [label for attr, label in _CUDA_ALL_REDUCE
                 if getattr(comm, attr, None) is not None and not getattr(getattr(comm, attr), "disabled", False)]
        return ", then ".join([*paths, "torch.distributed (NCCL)"])
    return "unknown"


def attention_backends(vllm_config: Any) -> str:
    """The attention backends of the process's attention layers (vLLM registers them in its config's
    static forward context when the model loads); "unknown" where none are registered."""
    context = getattr(getattr(vllm_config, "compilation_config", None), "static_forward_context", None)
    names: set[str] = set()
    for layer in (context.values() if isinstance(context, dict) else ()):
        backend = getattr(layer, "attn_backend", None)
        try:
            names.add(str(backend.get_name()))  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - a layer without a backend this reader knows
            continue
    return ", ".join(sorted(names)) or "unknown"


def _inner(worker: Any) -> Any:
    """vLLM hands collective_rpc functions its WorkerWrapperBase; the worker is inside it."""
    return getattr(worker, "worker", None) or worker


def _model(worker: Any) -> Any:
    runner = getattr(_inner(worker), "model_runner", None)
    model = getattr(runner, "model", None)
    if model is None and runner is not None and hasattr(runner, "get_model"):
        model = runner.get_model()
    return model


def rank_report(worker: Any) -> dict[str, Any]:
    """What this rank runs (in the rank's process, by collective_rpc): its ranks, device, whether
    oracle_kernels are registered here and whether this process's plugin did it, its linear layers' kernels,
    the all-reduce of its tensor-parallel group, its attention backends."""
    import oracle_kernels

    inner = _inner(worker)
    tp_group = pp_rank = None
    try:
        from vllm.distributed import parallel_state

        tp_group = parallel_state.get_tp_group()
        pp_rank = parallel_state.get_pp_group().rank_in_group
    except Exception:  # noqa: BLE001 - a vLLM without these groups: the fields stay unknown
        pass
    model = _model(worker)
    linear = linear_kernels(model) if model is not None else {}
    return {
        "rank": getattr(inner, "rank", None),
        "tp_rank": getattr(tp_group, "rank_in_group", None), "pp_rank": pp_rank,
        "pid": os.getpid(), "device": str(getattr(inner, "device", "unknown")),
        "kernels": oracle_kernels.is_enabled(), "plugin": _LOADED["kernels"],
        "linear_kernel": ", ".join(f"{k} x{n}" for k, n in sorted(linear.items())) or "unknown",
        "linear_counts": linear,
        "all_reduce": all_reduce_of(tp_group),
        "attention_backend": attention_backends(getattr(inner, "vllm_config", None)),
        "attention_pinned": attention_pinned(),
    }


# The audit of one rank between audit_begin and audit_end: op names seen per forward pass, unioned.
_AUDIT: dict[str, Any] = {}


def audit_begin(worker: Any) -> None:
    """Record, in this rank, the ops every forward pass and sampling step reaches until `audit_end`
    (`oracle_kernels.audit`: covered by our kernels, or batch-variant on torch's own; and vLLM's opaque ops)."""
    import oracle_kernels
    from torch.utils._python_dispatch import TorchDispatchMode

    inner = _inner(worker)
    seen: dict[str, set[str]] = {"covered": set(), "uncovered": set(), "opaque": set()}

    class Opaque(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            name = str(func.name())
            if not name.startswith("aten::"):
                seen["opaque"].add(name)
            return func(*args, **(kwargs or {}))

    def audited(original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            box: list[Any] = []
            with Opaque():
                result = oracle_kernels.audit(lambda: box.append(original(*args, **kwargs)))
            seen["covered"].update(result.covered)
            seen["uncovered"].update(result.uncovered)
            return box[0]
        return call

    names = [n for n in ("execute_model", "sample_tokens") if hasattr(inner, n)]
    _AUDIT.update(inner=inner, seen=seen, names=names)
    for n in names:
        setattr(inner, n, audited(getattr(inner, n)))


def audit_end(worker: Any) -> dict[str, Any]:
    """Stop recording (the worker's own methods back) and return what this rank's passes reached."""
    inner, seen, names = _AUDIT.pop("inner", None), _AUDIT.pop("seen", None), _AUDIT.pop("names", ())
    for n in names:
        if n in vars(inner):
            delattr(inner, n)  # the instance attribute set by audit_begin; the class's method shows again
    seen = seen or {"covered": set(), "uncovered": set(), "opaque": set()}
    return {"rank": getattr(_inner(worker), "rank", None), "batch_variant_covered": sorted(seen["covered"]),
            "batch_variant_uncovered": sorted(seen["uncovered"]), "opaque": sorted(seen["opaque"])}


def not_in_force(ranks: list[dict[str, Any]], world_size: int) -> list[str]:
    """Why invariant mode's oracle_kernels are not in force, one line per rank that runs default kernels (empty:
    in force in every rank). A rank fails when its reports are missing, the kernels are not registered in its
    process, any of its linear layers is bound to a kernel other than aten's, or (audited) its passes reached
    no op of ours."""
    seen = {r.get("rank") for r in ranks}
    why = [f"rank {r}: did not report (no rank answered for it)" for r in range(world_size) if r not in seen]
    return why + [problem for problem in map(_rank_default_kernels, ranks) if problem is not None]


def _unregistered(r: dict[str, Any]) -> str | None:
    if r.get("kernels"):
        return None
    hint = "" if r.get("plugin") else (f"; oracle's vLLM plugin did not run in it (entry point "
                                       f"vllm.general_plugins:{PLUGIN_NAME} not installed, or excluded by "
                                       "VLLM_PLUGINS): reinstall oracle")
    return (f"rank {r.get('rank')} (pid {r.get('pid')}, {r.get('device')}): oracle_kernels are not registered "
            f"in its process{hint}")


def _other_linears(r: dict[str, Any]) -> str | None:
    other = {k: n for k, n in (r.get("linear_counts") or {}).items() if k != "torch F.linear (aten mm)"}
    if not (other and str(r.get("device", "")).startswith("cpu")):
        return None
    return (f"rank {r.get('rank')}: linear layers run {', '.join(f'{k} x{n}' for k, n in sorted(other.items()))}"
            ", which no aten override reaches")


def _no_covered_op(r: dict[str, Any]) -> str | None:
    ops = r.get("ops")
    if not isinstance(ops, dict) or ops.get("batch_variant_covered"):
        return None
    return (f"rank {r.get('rank')}: its forward passes reached no oracle_kernels op (uncovered: "
            f"{', '.join(ops.get('batch_variant_uncovered') or []) or 'none'})")


# What shows a rank running default kernels, checked in this order; the first that holds is its line.
_DEFAULT_KERNELS = (_unregistered, _other_linears, _no_covered_op)


def _rank_default_kernels(r: dict[str, Any]) -> str | None:
    """Why one rank's report (`rank_report`, with the audit's `ops`) shows default kernels, or None."""
    for check in _DEFAULT_KERNELS:
        problem = check(r)
        if problem is not None:
            return problem
    return None
