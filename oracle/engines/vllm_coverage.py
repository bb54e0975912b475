"""What runs each class of ops in a vLLM invariant-mode worker, read from its ranks (`oracle.op_coverage`).

The inputs are what the worker read at start: its posture (device, graphs, sampler, all-reduce), each rank's
`vllm_plugin.rank_report` (attention backend of every layer, whether oracle's plugin pinned the Triton
attention launch, the audit's opaque ops) and the invariance mechanism. Nothing is assumed from the config.

`vllm` mode: vLLM's own batch-invariant mode claims every class, and the trials test that claim.
`oracle_kernels`: our aten overrides take the matmuls (and the norms where vLLM runs them in torch code); what
vLLM runs outside aten is classed by what is known of it:
- attention on CUDA: every backend picks a KV split from the batch unless pinned. TRITON_ATTN is pinned by
  oracle's plugin (its one-pass kernel, the launch `VLLM_BATCH_INVARIANT=1` picks); any other is uncovered.
- RMS norm on CUDA in vLLM's custom kernels (`_C::rms_norm`, `_C::fused_add_rms_norm`): their block size follows
  the number of tokens in the pass, so uncovered; in torch code, ours.
- a compiled CUDA graph: Inductor may lower the matmuls to kernels of its own, which no aten override reaches,
  and a replay dispatches nothing an audit could see, so the matmuls are not shown to be ours: uncovered.
- the FlashInfer top-k/top-p sampler and the custom all-reduces (one-shot or two-shot by message size):
  uncovered. NCCL, vLLM's CPU kernels and its PyTorch sampler: unclaimed.

On CUDA, `oracle_kernels_args` is what invariant mode asks of vLLM so that the claim holds: the Triton attention
(pinned by the plugin), RMS norm in torch code, and CUDA graphs of whole decode steps captured from eager code
(no Inductor), where our kernels are what the graph records. A setting the user gave in `engine_args` wins, and
the coverage then says what it leaves uncovered.

Imports nothing heavy: the worker and the tests call it with plain dicts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

OURS = "oracle_kernels"
_PINNED_ATTENTION = "TRITON_ATTN"
_VARIANT_ALL_REDUCE = ("custom all-reduce", "quick all-reduce", "symm mem", "flashinfer")


def _entry(status: str, by: str, why: str = "") -> dict[str, str]:
    return {"status": status, "by": by, "why": why}


def _opaque(ranks: Sequence[Mapping[str, Any]]) -> set[str] | None:
    """The union of the ranks' audited opaque ops, or None where a rank was not audited."""
    found: set[str] = set()
    for r in ranks:
        ops = r.get("ops")
        if not isinstance(ops, Mapping):
            return None
        found.update(str(o) for o in ops.get("opaque") or ())
    return found


def _matmul(cuda: bool, compiled: bool, audited: bool) -> dict[str, str]:
    if cuda and compiled:
        return _entry("uncovered", "torch.compile graph (Inductor)",
                      "Inductor may lower aten.mm to its own kernels, which the aten overrides do not reach, and a "
                      "graph replay dispatches nothing an audit could see; set enforce_eager: true")
    return _entry("covered", f"{OURS} (aten mm/addmm/bmm overrides, {'audited' if audited else 'not audited'} "
                  "in every rank)")


def _norm(cuda: bool, opaque: set[str] | None) -> dict[str, str]:
    custom = sorted(o for o in opaque or () if "rms_norm" in o)
    if custom and cuda:
        return _entry("uncovered", f"vLLM {', '.join(custom)}",
                      "its block size follows the number of tokens in the pass; set kernel_config.ir_op_priority "
                      "rms_norm and fused_add_rms_norm to [native]")
    if custom:
        return _entry("unclaimed", f"vLLM {', '.join(custom)}")
    if opaque is None:
        return _entry("unclaimed", "not audited (audit: false): which RMS norm kernel runs was not read")
    return _entry("covered", f"{OURS} (torch code: aten mean/rsqrt)")


def _attention(cuda: bool, ranks: Sequence[Mapping[str, Any]], env: Mapping[str, Any]) -> dict[str, str]:
    names = sorted({n.strip() for r in ranks for n in str(r.get("attention_backend", "unknown")).split(",")})
    backends = ", ".join(names)
    if not cuda:
        if str(env.get("VLLM_CPU_ATTN_SPLIT_KV")) == "0":
            return _entry("covered", f"vLLM {backends}, KV split off (VLLM_CPU_ATTN_SPLIT_KV=0)")
        return _entry("unclaimed", f"vLLM {backends}")
    if names == [_PINNED_ATTENTION] and ranks and all(r.get("attention_pinned") is True for r in ranks):
        return _entry("covered", f"vLLM {_PINNED_ATTENTION}, pinned by oracle's plugin to its one-pass kernel "
                      "(no KV split, the launch VLLM_BATCH_INVARIANT=1 picks)")
    return _entry("uncovered", f"vLLM {backends}",
                  "its KV split is chosen from the batch and only VLLM_BATCH_INVARIANT=1 pins it; use "
                  f"attention_backend: {_PINNED_ATTENTION} (which oracle's plugin pins) or invariance: vllm")


def _sampler(sampler: str) -> dict[str, str]:
    if "flashinfer" in sampler.lower():
        return _entry("uncovered", f"vLLM {sampler}", "FlashInfer's sampling kernel is not batch-invariant; set "
                      "VLLM_USE_FLASHINFER_SAMPLER=0")
    return _entry("unclaimed", f"vLLM {sampler}")


def _all_reduce(all_reduce: str) -> dict[str, str]:
    if all_reduce == "none":
        return _entry("covered", "none (one rank)")
    if any(v in all_reduce.lower() for v in _VARIANT_ALL_REDUCE):
        return _entry("uncovered", f"vLLM {all_reduce}", "it picks its algorithm (one-shot, two-shot) from the "
                      "message size, which follows the batch")
    return _entry("unclaimed", f"vLLM {all_reduce}")


def coverage(invariance: str, posture: Mapping[str, Any], ranks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Invariant mode's coverage by op class (`oracle.op_coverage.OP_CLASSES`) for `describe()["coverage"]`; empty
    where invariant mode claims nothing (`invariance: none`)."""
    if invariance == "vllm":
        mode = "vLLM's own batch-invariant mode (VLLM_BATCH_INVARIANT=1)"
        return {op: _entry("covered", mode) for op in ("matmul", "norm", "attention", "sampler", "all_reduce")}
    if invariance != OURS:
        return {}
    cuda = str(posture.get("device", "")).startswith("cuda")
    mode = str(posture.get("compile_mode", "none")).lower()
    compiled = not any(word in mode for word in ("none", "unknown")) and mode != "0"
    given = posture.get("env")
    env: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
    opaque = _opaque(ranks)
    return {
        "matmul": _matmul(cuda, compiled, opaque is not None),
        "norm": _norm(cuda, opaque),
        "attention": _attention(cuda, ranks, env),
        "sampler": _sampler(str(posture.get("sampler", "unknown"))),
        "all_reduce": _all_reduce(str(posture.get("all_reduce", "unknown"))),
    }


# vLLM's largest CUDA graph by default: min(2 * max_num_seqs, this); above 256 its sizes go in this step.
VLLM_MAX_CAPTURE = 512
VLLM_CAPTURE_STEP = 16


def oracle_kernels_args(engine_args: Mapping[str, Any], enforce_eager: bool,
                        max_num_seqs: int | None = None) -> dict[str, Any]:
    """`engine_args` with the settings `invariance: oracle_kernels` needs of vLLM on CUDA, where the user left them
    unset: TRITON_ATTN, vLLM's custom ops off and RMS norm in torch code, and (unless eager) full CUDA graphs of
    decode steps without torch.compile, up to `max_num_seqs` sequences: a decode step above vLLM's largest graph
    (512 sequences by default) would run eagerly, where no compiled code stands in for the graph."""
    out = dict(engine_args)
    out.setdefault("attention_backend", _PINNED_ATTENTION)
    compilation = dict(out.get("compilation_config") or {})
    compilation.setdefault("custom_ops", ["none"])
    if not enforce_eager:
        compilation.setdefault("mode", 0)  # CompilationMode.NONE: eager code, no Inductor
        compilation.setdefault("cudagraph_mode", "FULL_DECODE_ONLY")
        sizes_given = "cudagraph_capture_sizes" in compilation or "max_cudagraph_capture_size" in compilation
        seqs = out.get("max_num_seqs", max_num_seqs)  # engine_args win over the config's, as in the worker
        if isinstance(seqs, int) and seqs > VLLM_MAX_CAPTURE and not sizes_given:
            # vLLM's sizes above 256 go in steps of 16 and it truncates a maximum off that grid to the size
            # below it: rounded up, so the largest graph holds max_num_seqs.
            compilation["max_cudagraph_capture_size"] = -(-seqs // VLLM_CAPTURE_STEP) * VLLM_CAPTURE_STEP
    out["compilation_config"] = compilation
    kernel = dict(out.get("kernel_config") or {})
    kernel.setdefault("ir_op_priority", {"rms_norm": ["native"], "fused_add_rms_norm": ["native"]})
    out["kernel_config"] = kernel
    return out
