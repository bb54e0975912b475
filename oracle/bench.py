"""`oracle bench`: the cost of invariance.

`oracle bench kernels` times the batch-invariant kernels against torch's own on this machine's
device (the Triton set against cuBLAS on a GPU); `oracle bench CONFIG.yaml` times one engine
generating the config's whole schedule in each mode; `oracle bench --workload seed` times the
native engine on a fixed workload (`WORKLOADS`) with random weights made on the device. Each mode
runs `warmup` untimed rounds (compilation, CUDA-graph capture, first-call checks), then `rounds`
timed ones; the table gives the median, the spread (min, max) and, for the native engine, the
share of wall time spent inside forward passes. Figures are printed as a Markdown table and
optionally written as JSON; nothing here asserts a speed.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from oracle.engines.contract import Engine, TimesForwardPasses, capabilities
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


@dataclass(frozen=True)
class Workload:
    """A fixed generation workload: random prompts and output lengths from one seed, greedy, no logits."""

    name: str
    preset: str  # model preset (oracle/models/presets.py); weights are random, made on the device
    dtype: str
    num_seqs: int
    prompt_len: tuple[int, int]  # inclusive range
    output_len: tuple[int, int]  # inclusive range (max_tokens; EOS does not stop the sequence)
    max_num_seqs: int
    max_num_batched_tokens: int
    seed: int = 0
    description: str = ""


WORKLOADS: dict[str, Workload] = {
    "seed": Workload(
        name="seed", preset="qwen3-8b-shape", dtype="bfloat16", num_seqs=1000, prompt_len=(16, 48),
        output_len=(90, 110), max_num_seqs=1024, max_num_batched_tokens=16384,
        description="the vLLM batch-invariance blog's workload: Qwen3-8B shapes, bf16, greedy, 1000 sequences "
                    "of 16-48 prompt tokens and 90-110 output tokens; the scheduler limits are vLLM's defaults "
                    "on an 80 GB+ GPU (1024 sequences, 16384 tokens per step)",
    ),
}


@dataclass(frozen=True)
class Round:
    seconds: float
    forward_seconds: float | None
    tokens: int


def _summary(rounds: list[Round]) -> dict[str, Any]:
    walls = [r.seconds for r in rounds]
    fwd = [r.forward_seconds for r in rounds if r.forward_seconds is not None]
    median = statistics.median(walls)
    return {
        "rounds": [round(w, 4) for w in walls],
        "median_s": round(median, 4),
        "min_s": round(min(walls), 4),
        "max_s": round(max(walls), 4),
        "stdev_s": round(statistics.stdev(walls), 4) if len(walls) > 1 else 0.0,
        "forward_median_s": round(statistics.median(fwd), 4) if fwd else None,
        "forward_share": round(statistics.median(f / w for f, w in zip(fwd, walls, strict=True)), 4) if fwd else None,
        "tokens": rounds[-1].tokens,
        "tokens_per_s": round(rounds[-1].tokens / median, 1) if median else None,
    }


def _time_rounds(
    run_once: Callable[[], int], engine: Engine, warmup: int, rounds: int, label: str
) -> tuple[list[Round], float]:
    """`warmup` untimed runs, then `rounds` timed ones; returns the rounds and the warm-up seconds. An engine
    that times its forward passes (oracle.engines.contract.TimesForwardPasses) gives each round's share."""
    t0 = time.perf_counter()
    for _ in range(warmup):
        run_once()
    warm = time.perf_counter() - t0
    print(f"{label}: warm-up {warm:.2f} s", flush=True)
    out = []
    timer = engine if capabilities(engine).forward_timing and isinstance(engine, TimesForwardPasses) else None
    for _ in range(rounds):
        if timer is not None:
            timer.timed, timer.forward_seconds = True, 0.0
        t0 = time.perf_counter()
        tokens = run_once()
        seconds = time.perf_counter() - t0
        forward = timer.forward_seconds if timer is not None else None
        if timer is not None:
            timer.timed = False
        out.append(Round(seconds, forward, tokens))
        print(f"{label}: round {len(out)} {seconds:.3f} s" + (f", forward {forward:.3f} s" if forward else ""),
              flush=True)
    return out, warm


def _print_table(rows: dict[str, Any]) -> None:
    print("| mode | median s | min s | max s | stdev s | forward share | generated tokens | tokens/s | warm-up s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for mode, r in rows["modes"].items():
        share = "" if r["forward_share"] is None else f"{100 * r['forward_share']:.1f}%"
        print(f"| {mode} | {r['median_s']} | {r['min_s']} | {r['max_s']} | {r['stdev_s']} | {share} | "
              f"{r['tokens']} | {r['tokens_per_s']} | {r['warmup_s']} |")
    print(f"\ninvariant / production median wall time: {rows['invariant_over_production']}x")


def _check_rounds(warmup: int, rounds: int) -> None:
    if warmup < 0:
        raise ConfigError(f"bench --warmup: must be >= 0, got {warmup}")
    if rounds < 1:
        raise ConfigError(f"bench --rounds: must be >= 1, got {rounds}")


def bench_config(config_path: str, json_path: Path | None, warmup: int = 1, rounds: int = 3) -> int:
    """Generate every trial of the config per round, in each mode on one engine, and report the wall times."""
    from oracle.config import load_config
    from oracle.execute import generate
    from oracle.lifecycle.watchdog import build_engine
    from oracle.plan import plan_run, trial_requests

    _check_rounds(warmup, rounds)
    config = load_config(config_path)
    plan = plan_run(config)
    rows: dict[str, Any] = {"config": config_path, "trials": len(plan.trials), "warmup": warmup, "modes": {}}
    for mode in ("production", "invariant"):
        engine = build_engine(config.engine, plan.model_dir, mode)

        def run_once(engine: Engine = engine) -> int:
            tokens = 0
            for trial in plan.trials:
                requests, _ = trial_requests(plan, trial)
                outs = generate(engine, requests, trial.max_num_batched_tokens)
                tokens += sum(len(o.token_ids) for o in outs)
            return tokens

        try:
            timed, warm = _time_rounds(run_once, engine, warmup, rounds, mode)
        finally:
            engine.close()
        rows["modes"][mode] = {**_summary(timed), "warmup_s": round(warm, 3)}
    return _finish(rows, json_path)


def _finish(rows: dict[str, Any], json_path: Path | None) -> int:
    prod, inv = rows["modes"]["production"]["median_s"], rows["modes"]["invariant"]["median_s"]
    rows["invariant_over_production"] = round(inv / prod, 3) if prod else None
    _print_table(rows)
    _write(json_path, rows)
    return 0


def workload_requests(w: Workload, vocab_size: int) -> list[Any]:
    """The workload's requests: prompt lengths, token ids and output lengths drawn from `w.seed`."""
    from oracle.engines.contract import Request, SamplingParams

    rng = random.Random(w.seed)
    out = []
    for i in range(w.num_seqs):
        prompt = tuple(rng.randrange(vocab_size) for _ in range(rng.randint(*w.prompt_len)))
        out.append(Request(f"w{i}", prompt, SamplingParams(rng.randint(*w.output_len), 0.0, 0, "none")))
    return out


def random_decoder(preset_name: str, dtype: str, device: str, seed: int = 0) -> Any:
    """A decoder with the preset's shapes and random weights made on `device` (no checkpoint on disk)."""
    import torch

    from oracle.engines.native.loader import DTYPES
    from oracle.engines.native.model import Decoder, ModelConfig
    from oracle.models.layout import tensor_layout
    from oracle.models.presets import get_preset
    from oracle.models.weights import _random_part_std

    preset = get_preset(preset_name)
    torch_dtype = DTYPES[dtype]
    g = torch.Generator(device=device).manual_seed(seed)
    weights = {}
    for spec in tensor_layout(preset):
        values = torch.randn(spec.shape, generator=g, dtype=torch.float32, device=device)
        values.mul_(_random_part_std(preset, spec))
        if spec.role in ("norm", "final_norm"):
            values.add_(1.0)
        weights[spec.name] = values.to(torch_dtype)
        del values
    config = ModelConfig(
        architecture=preset.architecture, vocab_size=preset.vocab_size, hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size, num_layers=preset.num_hidden_layers,
        num_heads=preset.num_attention_heads, num_kv_heads=preset.num_key_value_heads, head_dim=preset.head_dim,
        rms_norm_eps=preset.rms_norm_eps, rope_theta=preset.rope_theta,
        max_position_embeddings=preset.max_position_embeddings, tie_word_embeddings=preset.tie_word_embeddings,
    )
    return Decoder(config, weights)


def prepared_workload(command: str, name: str, num_seqs: int | None, preset: str | None,
                      device: str | None) -> tuple[Workload, str, Any, list[Any], dict[str, Any]]:
    """A named workload shrunk as asked (`preset`, `num_seqs`), its device, a decoder with random weights made
    there, its requests and the report's `workload` row; `command` names the command in its errors."""
    import torch

    if name not in WORKLOADS:
        raise ConfigError(f"{command} --workload: unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    w = WORKLOADS[name]
    if num_seqs is not None:
        if num_seqs < 1:
            raise ConfigError(f"{command} --sequences: must be >= 1, got {num_seqs}")
        w = Workload(**{**asdict(w), "num_seqs": num_seqs})
    if preset is not None:
        w = Workload(**{**asdict(w), "preset": preset})
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    decoder = random_decoder(w.preset, w.dtype, device, w.seed)
    row = {**asdict(w), "device": str(torch.cuda.get_device_name() if device == "cuda" else device),
           "torch": torch.__version__}
    return w, device, decoder, workload_requests(w, decoder.config.vocab_size), row


def bench_workload(
    name: str, json_path: Path | None, *, warmup: int = 1, rounds: int = 3, device: str | None = None,
    preset: str | None = None, num_seqs: int | None = None, cuda_graphs: bool | None = None, fused_kernels: bool = True,
    overlap_steps: bool = True,
) -> int:
    """Time the native engine on a named workload in both modes; `preset`/`num_seqs` shrink it (smoke runs)."""
    import torch

    from oracle.config import EngineConfig
    from oracle.engines.native import NativeEngine

    _check_rounds(warmup, rounds)
    w, device, decoder, requests, workload_row = prepared_workload("bench", name, num_seqs, preset, device)
    rows: dict[str, Any] = {"workload": workload_row, "warmup": warmup, "modes": {}}
    for mode in ("production", "invariant"):
        engine = NativeEngine(decoder, mode, EngineConfig.of(
            "native", device=device, dtype=w.dtype, max_num_seqs=w.max_num_seqs,
            max_num_batched_tokens=w.max_num_batched_tokens, cuda_graphs=cuda_graphs,
            fused_kernels=fused_kernels, overlap_steps=overlap_steps))

        def run_once(engine: NativeEngine = engine) -> int:
            return sum(len(o.token_ids) for o in engine.generate(requests))

        try:
            timed, warm = _time_rounds(run_once, engine, warmup, rounds, mode)
            rows["modes"][mode] = {**_summary(timed), "warmup_s": round(warm, 3),
                                   "cuda_graphs": engine.cuda_graphs,
                                   "fused_kernels": engine.describe()["fused_kernels"],
                                   "overlap_steps": engine.describe()["overlap_steps"]}
        finally:
            engine.close()
            if device == "cuda":
                torch.cuda.empty_cache()
    return _finish(rows, json_path)


# --- memory: peak RSS of a whole `oracle run` ---------------------------------------------------

MEMORY_VOCAB = 151936  # Qwen3's vocabulary: a full logits row is 608 KB of float32


def memory_config(model_dir: Path, report_dir: Path, trials: int, max_tokens: int, device: str) -> dict[str, Any]:
    """The memory benchmark's config: `trials` schedule trials of a target with full logits rows.

    Drift (and the negative control) only: production mode alone, whose default kernels run this
    tiny model fastest on a CPU; both modes keep a trial's outputs the same way. The schedule batches
    up to 8 requests so every trial is cheap and the figure is the harness's, not the model's.
    """
    return {
        "model": str(model_dir),
        "engine": {"kind": "native", "device": device, "dtype": "float32", "max_num_seqs": 64,
                   "max_num_batched_tokens": 256, "enable_chunked_prefill": True, "enable_prefix_caching": True,
                   "num_threads": 1},
        "prompts": {"random": {"count": 8, "min_len": 8, "max_len": 24, "seed": 0}},
        "sampling": {"max_tokens": max_tokens, "temperature": 0.0, "logits": "full"},
        "schedule": {"trials": trials, "seed": 1, "batch_size": [1, 8], "filler_len": [1, 24],
                     "filler_max_tokens": [1, max_tokens], "arrival_step": [0, 2], "repeat_trials": 8,
                     "shrink": False},
        "checks": {"invariance": "off", "repeatability": "off", "fidelity": "off", "drift": "report",
                   "negative_control": "warn", "prefill_decode": "off", "prefix_cache": "off"},
        "report_dir": str(report_dir),
    }


_MEMORY_CHILD = r"""
import json, resource, sys
from oracle.config import parse_config
from oracle.runner import run
config = json.loads(sys.argv[1])
report = run(parse_config(config))
peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
print(json.dumps({"peak_rss_mib": round(peak_kb / 1024, 1), "exit_code": report.exit_code(),
                  "checks": {c.name: [c.verdict, c.trials, c.divergent] for c in report.checks},
                  "divergences": [[d.check, d.trial_id, d.step, d.kind, d.ulp, d.max_abs_logits_diff]
                                  for d in report.divergences]}))
"""


def bench_memory(json_path: Path | None, *, trials: int = 1000, max_tokens: int = 16, device: str = "cpu",
                 work_dir: Path | None = None) -> int:
    """Peak RSS of `oracle run` over `trials` trials of a 152k-vocabulary model with `logits: full`.

    The model is tiny-qwen3 with Qwen3's vocabulary (151,936), random weights; the run happens in a
    fresh Python process so its peak RSS (`ru_maxrss`) is the run's alone. Prints the figure; asserts
    nothing.
    """
    import dataclasses
    import subprocess
    import sys
    import tempfile

    from oracle.models.make import make_model
    from oracle.models.presets import get_preset

    if trials < 1:
        raise ConfigError(f"bench memory --trials: must be >= 1, got {trials}")
    with tempfile.TemporaryDirectory(prefix="oracle-bench-memory-", dir=work_dir) as tmp:
        preset = dataclasses.replace(get_preset("tiny-qwen3"), name="tiny-qwen3-vocab152k", vocab_size=MEMORY_VOCAB,
                                     description="tiny-qwen3 with Qwen3's vocabulary (memory benchmark)")
        model_dir = make_model(preset, Path(tmp) / "model")
        config = memory_config(model_dir, Path(tmp) / "report", trials, max_tokens, device)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", _MEMORY_CHILD, json.dumps(config)], capture_output=True,
                              text=True, check=False)
        seconds = time.perf_counter() - t0
    if proc.returncode != 0 or not proc.stdout.strip():
        raise ConfigError(f"bench memory: the run failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    row_mib = MEMORY_VOCAB * 4 / 2**20
    rows = {"trials": trials, "vocab_size": MEMORY_VOCAB, "max_tokens": max_tokens, "device": device,
            "full_rows_per_trial_mib": round(row_mib * max_tokens, 2), "seconds": round(seconds, 1), **result}
    print(f"peak RSS {result['peak_rss_mib']} MiB: oracle run of {trials} trials, vocab {MEMORY_VOCAB}, "
          f"max_tokens {max_tokens}, logits full, {device} ({rows['seconds']} s; a trial's full rows are "
          f"{rows['full_rows_per_trial_mib']} MiB)", flush=True)
    _write(json_path, rows)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m oracle.bench memory [--trials N] [--max-tokens N] [--device D] [--json FILE]` (the profile is
    `python -m oracle.bench_profile`, or `oracle bench --workload NAME --profile`)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m oracle.bench")
    sub = parser.add_subparsers(dest="what", required=True)
    mem = sub.add_parser("memory", help="peak RSS of a run of N trials of a 152k-vocabulary config")
    mem.add_argument("--trials", type=int, default=1000)
    mem.add_argument("--max-tokens", type=int, default=16)
    mem.add_argument("--device", default="cpu")
    mem.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    return bench_memory(args.json, trials=args.trials, max_tokens=args.max_tokens, device=args.device)


if __name__ == "__main__":
    raise SystemExit(main())
