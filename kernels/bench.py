"""Speed of the batch-invariant CUDA kernels against torch's: `python -m oracle_kernels.bench`.

    python -m oracle_kernels.bench --json bench.json            # matmul + attention, Qwen3-8B shapes
    python -m oracle_kernels.bench --quick --json bench.json    # a few shapes, a minute or so
    python -m oracle_kernels.bench --sweep --json sweep.json    # candidate matmul tiles (for tuning config.py)

Matmul: the invariant mm (kernels/triton/matmul.py, which sends the products that cuBLASLt
without split-K computes with the same bits to cuBLASLt: kernels/cublaslt.py) against cuBLAS
(`aten::mm.out` with torch's default flags, split-K allowed) on the Qwen3-8B projection shapes,
x [M, K] @ w.t() with w [N, K] as F.linear passes it. Two timings each: `*_graph_ms`, the GPU time
of the kernel alone (replayed in a CUDA graph), and `*_eager_ms`, a plain call including the
host's launch cost. `speed_vs_cublas` is cublas time / invariant time on the graph timings: 1.0 is
parity, the target is >= 0.9; `triton_speed_vs_cublas` is the same for the Triton kernel alone.

Attention: the invariant decode (kernels/triton/attention.py, fixed 512-position partitions)
against the same kernel with a batch-sized split as production split-KV kernels choose it
(`splitkv`), and optionally against the native engine's production path in plain torch
(`--torch-attention`, slow for big batches). Eager timings: the invariant launcher reads the step
layout on the host once per step, which the engine pays too.

The sweep times candidate tiles and checks that each gives the same bits as the configured tier
(the premise of config.py: tile shapes that keep the K loop and the instruction do not change an
element's bits). Speed is reported, never asserted. Needs a CUDA device and triton.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import platform
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from .triton.config import MatmulTiles, attention_tiles, matmul_config  # plain data: no triton import

# (K, N) of the Qwen3-8B projections: qkv, o, gate+up, down, lm head.
QWEN3_8B_PROJECTIONS: tuple[tuple[int, int], ...] = (
    (4096, 6144), (4096, 4096), (4096, 24576), (12288, 4096), (4096, 151936),
)
BATCH_SIZES: tuple[int, ...] = (1, 8, 32, 64, 128, 256, 512, 1024, 4096)
ATTENTION_BATCHES: tuple[int, ...] = (1, 8, 32, 64, 128, 256)
ATTENTION_CONTEXTS: tuple[int, ...] = (1024, 2048, 4096, 8192)


def _require_cuda() -> torch.device:
    if not torch.cuda.is_available():
        raise SystemExit("oracle_kernels.bench needs a CUDA device")
    return torch.device("cuda")


def _time_ms(fn: Callable[[], object], graph: bool) -> float:
    import triton.testing

    torch.cuda.synchronize()  # the inputs were made on the default stream; do_bench_cudagraph runs on its own
    if graph:
        return float(triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median"))
    return float(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"))


def _sms(device: torch.device) -> int:
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def _tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12 if ms > 0 else math.nan


def _env() -> dict[str, Any]:
    import triton

    return {
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "triton": triton.__version__, "python": platform.python_version(),
    }


def bench_matmul(
    shapes: Sequence[tuple[int, int]] = QWEN3_8B_PROJECTIONS,
    ms: Sequence[int] = BATCH_SIZES,
    dtype: torch.dtype = torch.bfloat16,
) -> list[dict[str, Any]]:
    """Invariant mm vs cuBLAS for x [M, K] @ w.t(), w [N, K]; one row per (K, N, M).

    `invariant_*` is the invariant mm as the enabled kernels run it (cuBLASLt without split-K where
    kernels/cublaslt.py admits the problem, else Triton; `path` says which), `triton_*` the Triton
    kernel alone (the portable path). cuBLAS is torch's default: split-K allowed.
    """
    from . import cublaslt
    from .triton import matmul

    device = _require_cuda()
    g = torch.Generator(device=device).manual_seed(0)
    rows: list[dict[str, Any]] = []
    for k, n in shapes:
        w = torch.randn(n, k, device=device, generator=g).to(dtype)
        for m in ms:
            x = torch.randn(m, k, device=device, generator=g).to(dtype)
            b = w.t()
            out = torch.empty(m, n, device=device, dtype=dtype)
            cublas = functools.partial(torch.ops.aten.mm.out, x, b, out=out)
            cublas_graph, cublas_eager = _time_ms(cublas, graph=True), _time_ms(cublas, graph=False)
            ref = torch.ops.aten.mm.out(x, b, out=torch.empty_like(out))
            saved = cublaslt.flags_on()  # as enable() sets them
            try:
                ours = functools.partial(matmul.mm, x, b)
                path = "cublaslt" if cublaslt.use_cublaslt(x, b, matmul.triton_mm) else "triton"
                same_as_triton = torch.equal(ours(), matmul.triton_mm(x, b))
                ours_graph, ours_eager = _time_ms(ours, graph=True), _time_ms(ours, graph=False)
                triton_graph = _time_ms(functools.partial(matmul.triton_mm, x, b), graph=True)
                diff = float((ours().float() - ref.float()).abs().max())
            finally:
                cublaslt.flags_restore(saved)
            flops = 2.0 * m * n * k
            rows.append({
                "op": "mm", "dtype": str(dtype).removeprefix("torch."), "m": m, "k": k, "n": n, "path": path,
                "tiles": asdict(matmul_config(dtype).tiles_for(m, n, _sms(device))),
                "cublas_graph_ms": cublas_graph, "invariant_graph_ms": ours_graph, "triton_graph_ms": triton_graph,
                "cublas_eager_ms": cublas_eager, "invariant_eager_ms": ours_eager,
                "cublas_tflops": _tflops(flops, cublas_graph), "invariant_tflops": _tflops(flops, ours_graph),
                "speed_vs_cublas": cublas_graph / ours_graph, "triton_speed_vs_cublas": cublas_graph / triton_graph,
                "bitwise_equal_to_triton": same_as_triton, "max_abs_diff_vs_cublas": diff,
            })
            print(_matmul_line(rows[-1]), file=sys.stderr, flush=True)
    return rows


def _matmul_line(r: dict[str, Any]) -> str:
    return (f"mm M={r['m']} K={r['k']} N={r['n']}: cuBLAS {r['cublas_graph_ms'] * 1e3:.1f} us, "
            f"invariant {r['invariant_graph_ms'] * 1e3:.1f} us ({r['speed_vs_cublas']:.2f}x, {r['path']}), "
            f"Triton alone {r['triton_speed_vs_cublas']:.2f}x")


def default_sweep_candidates() -> list[MatmulTiles]:
    """Tile candidates for bf16/fp16: BLOCK_K 64 and 128, wgmma-eligible shapes (BLOCK_M 64 or 128, 4 or 8 warps)."""
    shapes = (
        (64, 32, 64, 4, 8), (64, 32, 128, 4, 8), (64, 64, 64, 4, 8), (64, 64, 128, 4, 6), (64, 128, 64, 4, 4),
        (64, 128, 128, 4, 3), (64, 256, 64, 4, 3), (128, 64, 64, 4, 4), (128, 128, 64, 8, 4),
        (128, 128, 128, 8, 3), (128, 256, 64, 8, 3), (128, 256, 64, 8, 4),
    )
    return [MatmulTiles(bm, bn, bk, 8, warps, stages) for bm, bn, bk, warps, stages in shapes]


def best_tiles_by_m(sweep: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per M, the candidate with the best geometric-mean speed over the shapes, among those with the configured bits."""
    by_m: dict[int, dict[str, list[float]]] = {}
    for r in sweep:
        if r["bitwise_equal_to_configured"] and not math.isnan(r["graph_ms"]):
            by_m.setdefault(r["m"], {}).setdefault(json.dumps(r["tiles"]), []).append(r["speed_vs_cublas"])
    best = []
    for m, per_tiles in sorted(by_m.items()):
        tiles, speeds = max(per_tiles.items(), key=lambda kv: math.fsum(map(math.log, kv[1])) / len(kv[1]))
        best.append({"m": m, "tiles": json.loads(tiles), "geomean_speed_vs_cublas": math.exp(
            math.fsum(map(math.log, speeds)) / len(speeds)), "min_speed_vs_cublas": min(speeds)})
    return best


def bench_matmul_tiles(
    shapes: Sequence[tuple[int, int]] = QWEN3_8B_PROJECTIONS,
    ms: Sequence[int] = BATCH_SIZES,
    dtype: torch.dtype = torch.bfloat16,
    candidates: Sequence[MatmulTiles] | None = None,
) -> list[dict[str, Any]]:
    """Every candidate tile config on every (K, N, M): graph time and bitwise equality with the configured tier."""
    from .triton import matmul

    device = _require_cuda()
    g = torch.Generator(device=device).manual_seed(0)
    rows: list[dict[str, Any]] = []
    for k, n in shapes:
        w = torch.randn(n, k, device=device, generator=g).to(dtype)
        for m in ms:
            x = torch.randn(m, k, device=device, generator=g).to(dtype)
            b = w.t()
            configured = matmul.triton_mm(x, b)
            cublas_ms = _time_ms(functools.partial(torch.ops.aten.mm.out, x, b, out=configured.clone()), graph=True)
            for tiles in candidates if candidates is not None else default_sweep_candidates():
                error: str | None = None
                try:
                    same = torch.equal(matmul.mm(x, b, tiles), configured)
                    t_ms = _time_ms(functools.partial(matmul.mm, x, b, tiles), graph=True)
                except Exception as e:  # a candidate that does not compile (shared memory) is reported
                    same, t_ms, error = False, math.nan, f"{type(e).__name__}: {e}"[:200]
                rows.append({
                    "m": m, "k": k, "n": n, "tiles": asdict(tiles),
                    "configured": asdict(matmul_config(dtype).tiles_for(m, n, _sms(device))),
                    "graph_ms": t_ms, "speed_vs_cublas": cublas_ms / t_ms,
                    "bitwise_equal_to_configured": same, "error": error,
                })
            print(f"sweep M={m} K={k} N={n} done", file=sys.stderr, flush=True)
    return rows


Step = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _decode_step(
    batch: int, context: int, dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int,
    block_size: int, device: torch.device,
) -> Step:
    """One decode step's paged-attention inputs: every sequence has `context` positions, blocks shuffled."""
    g = torch.Generator(device=device).manual_seed(batch * 100003 + context)
    blocks_per_seq = -(-context // block_size)
    num_blocks = batch * blocks_per_seq
    q = torch.randn(batch, num_heads, head_dim, device=device, generator=g).to(dtype)
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, device=device, generator=g).to(dtype)
    v_cache = torch.randn_like(k_cache)
    perm = torch.randperm(num_blocks, device=device, generator=g)
    block_tables = perm.view(batch, blocks_per_seq).to(torch.int32)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    query_start_loc = torch.arange(batch + 1, dtype=torch.int32, device=device)
    return q, k_cache, v_cache, block_tables, seq_lens, query_start_loc


def production_splits(batch: int) -> int:
    """KV splits per sequence as the native engine's production path picks them (engine.num_kv_splits_for)."""
    return max(1, min(8, 16 // max(1, batch)))


def bench_attention(
    batches: Sequence[int] = ATTENTION_BATCHES,
    contexts: Sequence[int] = ATTENTION_CONTEXTS,
    dtype: torch.dtype = torch.bfloat16,
    num_heads: int = 32,
    num_kv_heads: int = 8,
    head_dim: int = 128,
    block_size: int = 16,
    torch_production: bool = False,
) -> list[dict[str, Any]]:
    """Invariant decode attention vs a batch-sized split-KV (and optionally the torch production path)."""
    from .attention import production_attention
    from .triton import attention

    device = _require_cuda()
    tiles = attention_tiles(dtype)
    rows: list[dict[str, Any]] = []
    for batch in batches:
        for context in contexts:
            inputs = _decode_step(batch, context, dtype, num_heads, num_kv_heads, head_dim, block_size, device)
            scale = head_dim**-0.5
            splits = production_splits(batch)
            split_len = -(-context // splits)
            split_len = -(-split_len // tiles.chunk) * tiles.chunk
            inv_ms = _time_ms(functools.partial(attention.paged_attention, *inputs, scale), graph=False)
            split_ms = _time_ms(
                functools.partial(attention.paged_attention, *inputs, scale, partition=split_len), graph=False)
            torch_ms = math.nan
            if torch_production:
                torch_ms = _time_ms(functools.partial(production_attention, *inputs, scale, splits), graph=False)
            kv_bytes = 2 * batch * context * num_kv_heads * head_dim * inputs[1].element_size()
            inv = attention.paged_attention(*inputs, scale)
            ref = production_attention(*inputs, scale, splits) if batch * context <= 64 * 8192 else None
            rows.append({
                "op": "paged_attention_decode", "dtype": str(dtype).removeprefix("torch."), "batch": batch,
                "context": context, "num_heads": num_heads, "num_kv_heads": num_kv_heads, "head_dim": head_dim,
                "invariant_ms": inv_ms, "splitkv_ms": split_ms, "splitkv_partition": split_len,
                "torch_production_ms": torch_ms, "speed_vs_splitkv": split_ms / inv_ms,
                "invariant_kv_gbps": kv_bytes / (inv_ms * 1e-3) / 1e9,
                "max_abs_diff_vs_production": float((inv.float() - ref.float()).abs().max()) if ref is not None else None,
            })
            r = rows[-1]
            print(f"attention B={batch} ctx={context}: invariant {inv_ms * 1e3:.1f} us, "
                  f"split-KV {split_ms * 1e3:.1f} us ({r['speed_vs_splitkv']:.2f}x)", file=sys.stderr, flush=True)
            del inputs
            torch.cuda.empty_cache()
    return rows


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A Markdown table of `columns` of `rows`; floats with 3 significant digits."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "nan" if math.isnan(v) else f"{v:.3g}"
        if isinstance(v, dict) and "block_m" in v:  # MatmulTiles: BMxBNxBK, warps, stages
            return f"{v['block_m']}x{v['block_n']}x{v['block_k']} w{v['num_warps']} s{v['num_stages']}"
        return str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


MATMUL_COLUMNS = ("m", "k", "n", "path", "cublas_graph_ms", "invariant_graph_ms", "cublas_tflops", "invariant_tflops",
                  "speed_vs_cublas", "triton_speed_vs_cublas", "bitwise_equal_to_triton", "invariant_eager_ms")
ATTENTION_COLUMNS = ("batch", "context", "invariant_ms", "splitkv_ms", "splitkv_partition", "speed_vs_splitkv",
                     "invariant_kv_gbps", "torch_production_ms")
SWEEP_COLUMNS = ("m", "k", "n", "tiles", "graph_ms", "speed_vs_cublas", "bitwise_equal_to_configured", "error")


# The targets: the invariant matmul at least 0.95x cuBLAS, decode attention at least 0.9x split-KV.
TARGETS = {"matmul": ("speed_vs_cublas", 0.95), "attention": ("speed_vs_splitkv", 0.9)}


def worst_first(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """The rows by `key` ascending (the slowest ratio first); rows without a number last."""
    def rank(r: dict[str, Any]) -> tuple[bool, float]:
        v: Any = r.get(key)
        missing = not isinstance(v, (int, float)) or math.isnan(v)
        return (missing, 0.0 if missing else float(v))

    return sorted(rows, key=rank)


def misses(rows: list[dict[str, Any]], key: str, target: float) -> list[dict[str, Any]]:
    """The rows whose `key` is a number below `target`, worst first."""
    return [r for r in worst_first(rows, key)
            if isinstance(r.get(key), (int, float)) and not math.isnan(r[key]) and r[key] < target]


def _misses_line(section: str, rows: list[dict[str, Any]], shape: tuple[str, ...]) -> str:
    key, target = TARGETS[section]
    below = misses(rows, key, target)
    named = ", ".join("(" + " ".join(f"{c}={r[c]}" for c in shape) + f") {r[key]:.3g}x" for r in below)
    return (f"{len(below)} of {len(rows)} below {target}x ({key})" + (f": {named}" if named else "")) + "\n\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oracle_kernels.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write every measurement to this JSON file")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--quick", action="store_true", help="a few shapes and sizes only")
    parser.add_argument("--sweep", action="store_true", help="also time candidate matmul tiles (slow)")
    parser.add_argument("--no-matmul", action="store_true")
    parser.add_argument("--no-attention", action="store_true")
    parser.add_argument("--torch-attention", action="store_true",
                        help="also time the native engine's production attention in plain torch (slow)")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    _require_cuda()
    shapes = QWEN3_8B_PROJECTIONS[:2] if args.quick else QWEN3_8B_PROJECTIONS
    ms = (1, 64, 512, 4096) if args.quick else BATCH_SIZES
    result: dict[str, Any] = {"environment": _env(), "dtype": args.dtype}
    sections: list[str] = []
    if not args.no_matmul:
        result["matmul"] = bench_matmul(shapes, ms, dtype)
        sections.append("## Matmul: invariant vs cuBLAS, worst ratio first\n\n"
                        + _misses_line("matmul", result["matmul"], ("m", "k", "n"))
                        + markdown_table(worst_first(result["matmul"], "speed_vs_cublas"), MATMUL_COLUMNS))
    if args.sweep:
        result["sweep"] = bench_matmul_tiles(shapes, ms, dtype)
        result["sweep_best"] = best_tiles_by_m(result["sweep"])
        sections.append("## Matmul tile sweep\n\n" + markdown_table(result["sweep"], SWEEP_COLUMNS))
        sections.append("## Fastest tiles per M (with the configured bits)\n\n" + markdown_table(
            result["sweep_best"], ("m", "tiles", "geomean_speed_vs_cublas", "min_speed_vs_cublas")))
    if not args.no_attention:
        batches = (1, 32, 256) if args.quick else ATTENTION_BATCHES
        contexts = (1024, 8192) if args.quick else ATTENTION_CONTEXTS
        result["attention"] = bench_attention(batches, contexts, dtype, torch_production=args.torch_attention)
        sections.append("## Decode attention: invariant vs split-KV, worst ratio first\n\n"
                        + _misses_line("attention", result["attention"], ("batch", "context"))
                        + markdown_table(worst_first(result["attention"], "speed_vs_splitkv"), ATTENTION_COLUMNS))
    result["misses"] = {section: misses(result[section], *TARGETS[section]) for section in TARGETS if section in result}
    env = result["environment"]
    print(f"# oracle_kernels bench ({env['gpu']}, torch {env['torch']}, triton {env['triton']}, {args.dtype})\n")
    print("\n\n".join(sections))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
