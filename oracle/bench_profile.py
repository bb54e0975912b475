"""`python -m oracle.bench_profile` (or `oracle bench --workload NAME --profile`): where the native engine's time goes on a bench workload.

Per mode, after `warmup` untimed rounds (compilation, CUDA-graph captures), one round with a
`StepProfile` attached (oracle/engines/native/profile.py): host time per step phase, device time of
the forward passes by kind (eager prefill, decode graph replay, eager decode) and of sampling, the
share of decode steps replayed from a CUDA graph with the batch sizes that ran eagerly, and the host
syncs torch's sync debug mode reports (CUDA). Then, unless `op_table` is off, one more round under
torch.profiler: kernels (CUDA) or aten ops (CPU) by op class, with counts and time, and the kernel
launches the host made. Printed as tables and written as JSON; nothing is asserted.
"""

from __future__ import annotations

import re
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from oracle.bench import _write, prepared_workload
from oracle.errors import ConfigError

# First match wins; names lowercased. Rotary embedding, residual adds, silu * up and casts are plain
# elementwise kernels whose names do not say which op of the model they serve: they are `elementwise`. Of the
# fused chains (kernels/triton/fused.py), add_rms_norm_kernel is `norm`, qk_norm_rope_kernel and silu_mul_kernel
# `elementwise`.
OP_CLASSES: tuple[tuple[str, str], ...] = (
    ("attention", r"partition_kernel|merge_kernel|paged_attention|flash|attn"),
    ("matmul", r"matmul_kernel|gemm|nvjet|cutlass|xmma|cublas|aten::(mm|addmm|bmm|linear|matmul|einsum)\b"),
    ("sampling", r"sampled_rows|softmax|argmax|topk|sort|cumsum|gather|aten::max\b|exponential|uniform"),
    ("norm", r"rms_norm|layer_norm|norm_kernel|aten::(mean|rsqrt|pow)\b|sum_kernel|reduce"),
    ("kv_write", r"index_put|scatter|indexput"),
    ("copy", r"memcpy|memset|aten::(copy_|_to_copy|to|fill_|zero_|zeros|empty|empty_strided|new_empty|new_zeros|"
             r"clone|contiguous|as_strided|unsqueeze|squeeze|t|transpose|expand|permute|select|arange|"
             r"scalar_tensor)\b"),
    ("elementwise", r"elementwise|vectorized|unary_kernel|silu|rope_kernel|aten::(mul|add|sub|neg|cat|cos|sin|where|"
                    r"masked_fill|div|exp|log|embedding|index|index_select|slice|view|reshape|mul_|add_|div_|eq|"
                    r"le|lt|ge|gt|bitwise_\w+|floor_divide|remainder|amax|sum|nonzero|repeat_interleave)\b"),
)
_CLASS_RES = tuple((name, re.compile(pattern)) for name, pattern in OP_CLASSES)
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC", "cudaGraphLaunch")


def op_class(name: str) -> str:
    """The op class of a kernel or aten op name (`OP_CLASSES`), else `other`."""
    lowered = name.lower()
    return next((cls for cls, pattern in _CLASS_RES if pattern.search(lowered)), "other")


def _time_of(event: Any, device: bool) -> float:
    """Self time in microseconds, as torch names it in this version."""
    value: Any = event.self_cpu_time_total
    if device:
        value = getattr(event, "self_device_time_total", None)
        if value is None:
            value = getattr(event, "self_cuda_time_total", 0.0)
    return float(value or 0.0)


TOP_KERNELS = 20  # the op table's list of the kernels (or aten ops) that took the most time


def op_table(averages: Any, on_cuda: bool) -> dict[str, Any]:
    """torch.profiler's key averages -> time and count by op class, the `TOP_KERNELS` names that took the most
    (name cut to 120 characters, class, count, ms), and launch calls.

    CUDA: the kernels (device self time); CPU: the aten ops (host self time)."""
    classes: dict[str, dict[str, float]] = {}
    launches: dict[str, int] = {}
    names: list[tuple[float, str, str, int]] = []
    for e in averages:
        key = str(e.key)
        if key in LAUNCH_CALLS:
            launches[key] = launches.get(key, 0) + int(e.count)
            continue
        is_kernel = "cuda" in str(getattr(e, "device_type", "")).lower()
        if on_cuda != is_kernel or (not on_cuda and not key.startswith("aten::")):
            continue
        cls = op_class(key)
        row = classes.setdefault(cls, {"count": 0, "ms": 0.0})
        row["count"] += int(e.count)
        row["ms"] += _time_of(e, on_cuda) / 1000.0
        names.append((_time_of(e, on_cuda) / 1000.0, key[:120], cls, int(e.count)))
    total = sum(r["ms"] for r in classes.values()) or 1.0
    top = [{"name": name, "class": cls, "count": count, "ms": round(ms, 3)}
           for ms, name, cls, count in sorted(names, key=lambda n: -n[0])[:TOP_KERNELS]]
    table = {cls: {"count": int(r["count"]), "ms": round(r["ms"], 3), "share": round(r["ms"] / total, 4)}
             for cls, r in sorted(classes.items(), key=lambda kv: -kv[1]["ms"])}
    return {"what": "kernels, device time" if on_cuda else "aten ops, host self time", "classes": table,
            "top": top, "launch_calls": launches}


@contextmanager
def counting_syncs(on_cuda: bool) -> Iterator[list[int]]:
    """The host syncs torch's sync debug mode reports inside the block (CUDA; [0] elsewhere)."""
    count = [0]
    if not on_cuda:
        yield count
        return
    import torch

    before = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield count
        finally:
            torch.cuda.set_sync_debug_mode(before)
    count[0] = sum(1 for w in caught if "synchroniz" in str(w.message).lower())


def profile_mode(engine: Any, run_once: Callable[[], int], warmup: int, op_table_round: bool) -> dict[str, Any]:
    """One mode: warm-up rounds, a profiled round, and optionally a torch.profiler round."""
    import torch

    from oracle.engines.native.profile import StepProfile

    on_cuda = engine.device.type == "cuda"
    t0 = time.perf_counter()
    for _ in range(warmup):
        run_once()
    warm = time.perf_counter() - t0
    graphs_before = len(engine._graphs.graphs) if engine._graphs is not None else 0
    engine.profile = profile = StepProfile(engine.device)
    try:
        with counting_syncs(on_cuda) as syncs:
            t0 = time.perf_counter()
            tokens = run_once()
            if on_cuda:
                torch.cuda.synchronize()
            wall = time.perf_counter() - t0
    finally:
        engine.profile = None
    profile.captures = (len(engine._graphs.graphs) if engine._graphs is not None else 0) - graphs_before
    out: dict[str, Any] = {"warmup_s": round(warm, 3), "round_s": round(wall, 4), "generated_tokens": tokens,
                           **profile.as_dict()}
    num_steps = sum(profile.steps.values())
    out["host_syncs"] = syncs[0] if on_cuda else None
    out["host_syncs_per_step"] = round(syncs[0] / num_steps, 3) if on_cuda and num_steps else None
    if op_table_round:
        try:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if on_cuda:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            with torch.profiler.profile(activities=activities) as prof:
                run_once()
                if on_cuda:
                    torch.cuda.synchronize()
            out["ops"] = op_table(prof.key_averages(), on_cuda)
        except Exception as e:  # the phases above stand on their own
            out["ops"] = {"error": f"{type(e).__name__}: {e}"}
    return out


def _print(rows: dict[str, Any]) -> None:
    for mode, r in rows["modes"].items():
        fwd, host = r["forward_s"], r["host_s"]
        print(f"\n### {mode}: round {r['round_s']} s, {r['generated_tokens']} generated tokens "
              f"(forward clock: {r['forward_clock']})\n")
        print("| phase | s | share of round |")
        print("| --- | ---: | ---: |")
        round_s = r["round_s"] or 1.0
        for name, s in [*(("forward " + k, v) for k, v in fwd.items()),
                        *([("sampling (device)", r["sampling_device_s"])] if r["sampling_device_s"] is not None else []),
                        *(("host " + k, v) for k, v in host.items())]:
            print(f"| {name} | {s:.4f} | {100 * s / round_s:.1f}% |")
        steps = r["steps"]
        print(f"\nsteps {steps}; decode graph coverage {r['decode_graph_coverage']}; eager decode batch sizes "
              f"{r['eager_decode_batch_sizes'] or 'none'}; captures in this round {r['captures_while_profiling']}; "
              f"Python per step {r['python_per_step_ms']} ms; host syncs {r['host_syncs']} "
              f"({r['host_syncs_per_step']} per step)")
        ops = r.get("ops")
        if ops and "classes" in ops:
            print(f"\n| op class ({ops['what']}) | count | ms | share |")
            print("| --- | ---: | ---: | ---: |")
            for cls, c in ops["classes"].items():
                print(f"| {cls} | {c['count']} | {c['ms']} | {100 * c['share']:.1f}% |")
            print(f"\n| top {len(ops['top'])} by time | class | count | ms |")
            print("| --- | --- | ---: | ---: |")
            for k in ops["top"]:
                print(f"| `{k['name']}` | {k['class']} | {k['count']} | {k['ms']} |")
            print(f"\nlaunch calls: {ops['launch_calls'] or 'none seen'}")
        elif ops:
            print(f"\nop table: {ops['error']}")


def profile_workload(
    name: str, json_path: Path | None, *, warmup: int = 1, device: str | None = None, preset: str | None = None,
    num_seqs: int | None = None, cuda_graphs: bool | None = None, fused_kernels: bool = True,
    overlap_steps: bool = True, modes: tuple[str, ...] = ("invariant", "production"),
    op_table_round: bool = True,
) -> int:
    """Profile the native engine on a named workload (`oracle.bench.WORKLOADS`), per mode."""
    import torch

    from oracle.config import EngineConfig
    from oracle.engines.native import NativeEngine

    if warmup < 0:
        raise ConfigError(f"bench profile --warmup: must be >= 0, got {warmup}")
    w, device, decoder, requests, workload_row = prepared_workload("bench profile", name, num_seqs, preset, device)
    rows: dict[str, Any] = {"workload": workload_row, "warmup": warmup, "modes": {}}
    for mode in modes:
        engine = NativeEngine(decoder, mode, EngineConfig.of(  # type: ignore[arg-type]
            "native", device=device, dtype=w.dtype, max_num_seqs=w.max_num_seqs,
            max_num_batched_tokens=w.max_num_batched_tokens, cuda_graphs=cuda_graphs,
            fused_kernels=fused_kernels, overlap_steps=overlap_steps))

        def run_once(engine: NativeEngine = engine) -> int:
            return sum(len(o.token_ids) for o in engine.generate(requests))

        try:
            rows["modes"][mode] = {**profile_mode(engine, run_once, warmup, op_table_round),
                                   "cuda_graphs": engine.cuda_graphs,
                                   "fused_kernels": engine.describe()["fused_kernels"],
                                   "overlap_steps": engine.describe()["overlap_steps"]}
        finally:
            engine.close()
            if device == "cuda":
                torch.cuda.empty_cache()
    _print(rows)
    _write(json_path, rows)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m oracle.bench_profile [--workload seed] [--preset P] [--sequences N] [--mode M] [--json FILE]`."""
    import argparse

    prof = argparse.ArgumentParser(prog="python -m oracle.bench_profile",
                                   description="where the native engine's time goes on a workload")
    prof.add_argument("--workload", default="seed")
    prof.add_argument("--warmup", type=int, default=1)
    prof.add_argument("--device", default=None)
    prof.add_argument("--preset", default=None)
    prof.add_argument("--sequences", type=int, default=None)
    prof.add_argument("--mode", choices=["invariant", "production", "both"], default="both")
    prof.add_argument("--no-cuda-graphs", action="store_true")
    prof.add_argument("--fused-kernels", dest="fused_kernels", action="store_true", default=True)
    prof.add_argument("--no-fused-kernels", dest="fused_kernels", action="store_false")
    prof.add_argument("--no-overlap-steps", dest="overlap_steps", action="store_false")
    prof.add_argument("--no-op-table", action="store_true", help="skip the torch.profiler round")
    prof.add_argument("--json", type=Path, default=None)
    args = prof.parse_args(argv)
    return profile_workload(
        args.workload, args.json, warmup=args.warmup, device=args.device, preset=args.preset,
        num_seqs=args.sequences, cuda_graphs=False if args.no_cuda_graphs else None, fused_kernels=args.fused_kernels,
        overlap_steps=args.overlap_steps, modes=("invariant", "production") if args.mode == "both" else (args.mode,),
        op_table_round=not args.no_op_table)


if __name__ == "__main__":
    raise SystemExit(main())
