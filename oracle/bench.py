"""`oracle bench`: the cost of invariance.

`oracle bench kernels` times the batch-invariant kernels against torch's own on this machine's
device (the Triton set against cuBLAS on a GPU); `oracle bench CONFIG.yaml` times one engine
generating the config's whole schedule in each mode and prints the ratio. Figures are printed
as a Markdown table and optionally written as JSON; nothing here asserts a speed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from oracle.errors import ConfigError


def _write(path: Path | None, data: Any) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2) + "\n")


def bench_kernels(dtype: str, json_path: Path | None, quick: bool = False) -> int:
    """`oracle bench kernels`: `python -m oracle_kernels.bench` (Triton vs cuBLAS and split-KV attention)."""
    import torch

    if not torch.cuda.is_available():
        raise ConfigError("bench kernels: no CUDA device; the kernel benchmark compares Triton against cuBLAS")
    from oracle_kernels import bench

    argv = ["--dtype", dtype] + (["--json", str(json_path)] if json_path else []) + (["--quick"] if quick else [])
    return bench.main(argv)


def bench_config(config_path: str, json_path: Path | None) -> int:
    """Generate every trial of the config once per mode on one engine and report the wall times."""
    from oracle.config import load_config
    from oracle.engines import build_engine
    from oracle.execute import generate
    from oracle.plan import plan_run, trial_requests

    config = load_config(config_path)
    plan = plan_run(config)
    rows: dict[str, Any] = {"config": config_path, "trials": len(plan.trials), "modes": {}}
    for mode in ("production", "invariant"):
        engine = build_engine(config.engine, plan.model_dir, mode)
        try:
            first, at = trial_requests(plan, plan.trials[0])
            generate(engine, first)  # warm-up: compilation, allocation
            t0 = time.perf_counter()
            tokens = 0
            for trial in plan.trials:
                requests, _ = trial_requests(plan, trial)
                outs = generate(engine, requests, trial.max_num_batched_tokens)
                tokens += sum(len(o.token_ids) for o in outs)
            seconds = time.perf_counter() - t0
        finally:
            engine.close()
        rows["modes"][mode] = {"seconds": round(seconds, 3), "tokens": tokens,
                               "tokens_per_s": round(tokens / seconds, 1) if seconds else None}
    prod, inv = rows["modes"]["production"]["seconds"], rows["modes"]["invariant"]["seconds"]
    rows["invariant_over_production"] = round(inv / prod, 3) if prod else None
    print("| mode | seconds | generated tokens | tokens/s |\n| --- | ---: | ---: | ---: |")
    for mode, r in rows["modes"].items():
        print(f"| {mode} | {r['seconds']} | {r['tokens']} | {r['tokens_per_s']} |")
    print(f"\ninvariant / production wall time: {rows['invariant_over_production']}x")
    _write(json_path, rows)
    return 0
