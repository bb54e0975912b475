"""vLLM's rows beside the native engine's in `oracle bench --workload NAME`: the same requests through
`LLM.generate`, in vLLM's default mode, its own batch-invariant mode and with oracle_kernels, all on this machine in
one run, each row in a process of its own (VLLM_BATCH_INVARIANT is read at start, our kernels are process-wide).

The model is the workload's preset with vLLM's dummy weights (`load_format: dummy`: random values, no checkpoint
on disk); the prompts are token ids, greedy, EOS ignored, so every row generates the same number of tokens.
`python -m oracle.bench_vllm ROW WORKLOAD_JSON OUT_JSON` times one row (the parent runs it).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oracle.engines.vllm_plugin import ENV as KERNELS_ENV


@dataclass(frozen=True)
class VllmRow:
    env: dict[str, str] = field(default_factory=dict)
    oracle_kernels: bool = False  # the engine_args `invariance: oracle_kernels` sets on CUDA


# The rows, in the order shown; the first is the baseline of every ratio.
ROWS: dict[str, VllmRow] = {
    "vllm default": VllmRow(),
    "vllm VLLM_BATCH_INVARIANT=1": VllmRow(env={"VLLM_BATCH_INVARIANT": "1"}),
    "vllm oracle_kernels": VllmRow(env={KERNELS_ENV: "1"}, oracle_kernels=True),
}
BASELINE = "vllm default"
# `oracle bench --vllm-rows` names for the rows (the baseline always runs: every ratio is to it).
ROW_NAMES = {"default": "vllm default", "batch_invariant": "vllm VLLM_BATCH_INVARIANT=1",
             "oracle_kernels": "vllm oracle_kernels"}
ROW_TIMEOUT_S = 900.0  # a row's process (vLLM's start, its warm-up and timed rounds) past this is stopped


def chosen_rows(names: str | None) -> list[str]:
    """The rows `--vllm-rows` names (comma-separated ROW_NAMES keys; None: all), the baseline first.
    ValueError naming an unknown one."""
    if names is None:
        return list(ROWS)
    asked = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in asked if n not in ROW_NAMES]
    if unknown:
        raise ValueError(f"--vllm-rows: unknown row {unknown[0]!r} (one of: {', '.join(ROW_NAMES)})")
    wanted = {ROW_NAMES[n] for n in asked} | {BASELINE}
    return [name for name in ROWS if name in wanted]


def available() -> bool:
    """Whether vLLM can be imported here (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def machine_line() -> str:
    """GPU, driver, torch, Triton and vLLM versions: the line every figure is quoted with."""
    import importlib.metadata

    import torch

    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "absent"

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    driver = "unknown"
    with contextlib.suppress(OSError, IndexError, subprocess.SubprocessError):
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    return (f"{gpu}, driver {driver}, torch {torch.__version__}, triton {version('triton')}, "
            f"vllm {version('vllm')}")


def _model_dir(preset_name: str, directory: Path) -> Path:
    """The preset's config and tokenizer files, no weights (vLLM makes dummy ones)."""
    from oracle.models.hf_config import dump_json, make_config_dict, make_generation_config_dict
    from oracle.models.presets import get_preset
    from oracle.models.tokenizer import make_tokenizer_config_dict, tokenizer_json

    preset = get_preset(preset_name)
    for name, text in {"config.json": dump_json(make_config_dict(preset)),
                       "generation_config.json": dump_json(make_generation_config_dict(preset)),
                       "tokenizer_config.json": dump_json(make_tokenizer_config_dict(preset)),
                       "tokenizer.json": tokenizer_json(preset.vocab_size)}.items():
        (directory / name).write_text(text, encoding="utf-8")
    return directory


def _time_row(name: str, workload: dict[str, Any], warmup: int, rounds: int) -> dict[str, Any]:
    """In this process: build vLLM for row `name` and time `rounds` generations of the workload."""
    from vllm import LLM, SamplingParams, TokensPrompt

    from oracle.bench import Round, Workload, _summary, workload_requests
    from oracle.engines.vllm_coverage import oracle_kernels_args
    from oracle.models.presets import get_preset

    row = ROWS[name]
    w = Workload(**{**workload, "prompt_len": tuple(workload["prompt_len"]),
                    "output_len": tuple(workload["output_len"])})
    requests = workload_requests(w, get_preset(w.preset).vocab_size)
    args: dict[str, Any] = (oracle_kernels_args({}, enforce_eager=False, max_num_seqs=w.max_num_seqs)
                            if row.oracle_kernels else {})
    prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_token_ids)) for r in requests]
    params = [SamplingParams(max_tokens=r.sampling.max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)
              for r in requests]
    with tempfile.TemporaryDirectory(prefix="oracle-bench-vllm-") as tmp:
        llm = LLM(model=str(_model_dir(w.preset, Path(tmp))), load_format="dummy", skip_tokenizer_init=True,
                  dtype=w.dtype, seed=w.seed, max_num_seqs=w.max_num_seqs,
                  max_num_batched_tokens=w.max_num_batched_tokens, **args)

        def run_once() -> int:
            outs = llm.generate(prompts, params, use_tqdm=False)
            return sum(len(o.outputs[0].token_ids) for o in outs)

        t0 = time.perf_counter()
        for _ in range(warmup):
            run_once()
        warm = time.perf_counter() - t0
        timed = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            tokens = run_once()
            timed.append(Round(time.perf_counter() - t0, None, tokens))
            print(f"{name}: round {len(timed)} {timed[-1].seconds:.3f} s", flush=True)
    return {**_summary(timed), "warmup_s": round(warm, 3), "engine_args": args, "env": row.env}


def vllm_rows(workload: dict[str, Any], warmup: int, rounds: int, names: list[str] | None = None,
              timeout_s: float = ROW_TIMEOUT_S) -> dict[str, Any]:
    """The rows `names` of `ROWS` (all when None), each in a child process; a row whose child fails or runs past
    `timeout_s` holds its error instead."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="oracle-bench-vllm-") as tmp:
        spec = Path(tmp) / "workload.json"
        spec.write_text(json.dumps({"workload": workload, "warmup": warmup, "rounds": rounds}))
        for name in names or list(ROWS):
            row = ROWS[name]
            result = Path(tmp) / f"{len(out)}.json"
            env = {**os.environ, **row.env}
            if not row.oracle_kernels:
                env.pop(KERNELS_ENV, None)
            try:
                proc = subprocess.run([sys.executable, "-m", "oracle.bench_vllm", name, str(spec), str(result)],
                                      env=env, capture_output=True, text=True, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                out[name] = {"error": f"timed out after {timeout_s:g} s (vLLM's start and the rounds)"}
                print(f"{name}: {out[name]['error']}", flush=True)
                continue
            if proc.returncode == 0 and result.exists():
                out[name] = json.loads(result.read_text())
            else:
                out[name] = {"error": f"exit {proc.returncode}: {_cause(proc.stderr or proc.stdout)}"}
            print(f"{name}: {out[name].get('median_s', out[name].get('error'))}", flush=True)
    return out


def _cause(log: str) -> str:
    """The lines of a failed row's log that name errors (vLLM's engine core reports its root cause above its
    last line), at most three."""
    lines = [ln.strip() for ln in log.splitlines() if "Error" in ln or "error:" in ln]
    return " | ".join(lines[-3:] or log.strip().splitlines()[-3:])


def _free_device_memory() -> None:
    """Give the native rows' memory back to the driver: vLLM sizes its KV cache from the GPU's free memory."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def side_by_side(native: dict[str, Any], vllm: dict[str, Any]) -> dict[str, Any]:
    """Every row's median and its ratio to vLLM default, the native engine's modes included."""
    base = vllm.get(BASELINE, {}).get("median_s")
    rows = {f"native {m}": r for m, r in native.items()} | vllm
    table = {}
    for name, r in rows.items():
        median = r.get("median_s")
        table[name] = {"median_s": median, "min_s": r.get("min_s"), "error": r.get("error"),
                       "vs_vllm_default": round(median / base, 3) if median and base else None}
    return table


def print_side_by_side(table: dict[str, Any], machine: str) -> None:
    print(f"\nmachine: {machine}")
    print("| engine | median s | min s | vs vLLM default |")
    print("| --- | ---: | ---: | ---: |")
    for name, r in table.items():
        ratio = "" if r["vs_vllm_default"] is None else f"{r['vs_vllm_default']}x"
        shown = r["median_s"] if r["error"] is None else f"failed: {r['error']}"
        print(f"| {name} | {shown} | {r['min_s'] or ''} | {ratio} |")


def extend(json_path: Path, warmup: int, rounds: int, names: list[str] | None = None,
           timeout_s: float = ROW_TIMEOUT_S) -> int:
    """After the native rows of `oracle bench --workload` (written to `json_path`): vLLM's rows `names` (all when
    None) on the same workload when vLLM can be imported and the native rows ran on CUDA, the side-by-side table
    with the machine line, all written back to `json_path`. Nothing to add (no vLLM, the CPU): 0 and a line
    saying so."""
    rows = json.loads(json_path.read_text())
    workload = dict(rows["workload"])
    device = str(workload.pop("device", ""))
    workload.pop("torch", None)
    if not available() or device in ("cpu", ""):
        print("vllm rows: not run (" + ("vLLM is not installed" if not available() else "no GPU") + ")")
        return 0
    machine = machine_line()
    _free_device_memory()
    rows["vllm"] = vllm_rows(workload, warmup, rounds, names, timeout_s)
    rows["machine"] = machine
    rows["side_by_side"] = side_by_side(rows["modes"], rows["vllm"])
    print_side_by_side(rows["side_by_side"], machine)
    json_path.write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if all("error" not in r for r in rows["vllm"].values()) else 3


def main(argv: list[str]) -> int:
    name, spec, out = argv
    given = json.loads(Path(spec).read_text())
    result = _time_row(name, given["workload"], given["warmup"], given["rounds"])
    Path(out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
