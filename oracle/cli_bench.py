"""`oracle bench`: its arguments and what each asks for (the kernels, a config's modes, a named workload with vLLM's
rows beside it, or its profile, the memory of a long run). Imports nothing heavy until a benchmark runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oracle.errors import ConfigError


def add_parser(sub: Any, trials_type: Callable[[str], int]) -> None:
    """The `bench` subcommand's parser, under `sub` (the CLI's subparsers)."""
    b = sub.add_parser("bench", help="benchmarks: the invariant kernels against torch's, or a config's modes")
    b.add_argument("what", nargs="*", default=[],
                   help="'kernels', 'memory' (peak RSS of 1,000 trials at a 152k vocabulary), 'verdict CONFIG[@SEED] "
                        "...' (whole `oracle run`s to a verdict, timed; its options after the configs), or a config file to "
                        "time in both modes (omit with --workload)")
    b.add_argument("--workload", default=None, help="a named native-engine workload instead of a config: 'seed'")
    b.add_argument("--warmup", type=int, default=1, help="untimed rounds per mode (default 1)")
    b.add_argument("--rounds", type=int, default=3, help="timed rounds per mode (default 3)")
    b.add_argument("--device", default=None, help="--workload: cuda or cpu (default: cuda when available)")
    b.add_argument("--preset", default=None, help="--workload: another model preset (smaller smoke runs)")
    b.add_argument("--sequences", type=int, default=None, help="--workload: fewer sequences (smoke runs)")
    b.add_argument("--no-cuda-graphs", action="store_true", help="--workload: decode steps run eagerly")
    b.add_argument("--no-fused-kernels", dest="fused_kernels", action="store_false",
                   help="--workload: the native engine's option fused_kernels off (invariant mode's composed ops)")
    b.add_argument("--fused-kernels", dest="fused_kernels", action="store_true",
                   help="--workload: fused_kernels on (the default; kept for earlier command lines)")
    b.add_argument("--no-overlap-steps", dest="overlap_steps", action="store_false",
                   help="--workload: the native engine's option overlap_steps off (one step at a time)")
    b.add_argument("--profile", action="store_true", help="--workload: where the native engine's time goes "
                   "(host phases, forward by kind, decode graph coverage, host syncs, kernels by op class) instead "
                   "of timed rounds")
    b.add_argument("--no-vllm", action="store_true", help="--workload: leave out vLLM's rows (default, "
                   "VLLM_BATCH_INVARIANT=1, oracle_kernels), which run where vLLM is installed and a GPU is")
    b.add_argument("--vllm-rows", default=None, metavar="ROWS",
                   help="--workload: which of vLLM's rows run, comma-separated: default, batch_invariant, "
                        "oracle_kernels (default: all; vLLM default always runs, every ratio is to it)")
    b.add_argument("--vllm-row-timeout", type=float, default=None, metavar="S",
                   help="--workload: seconds one vLLM row may take, its engine start included (default 900)")
    b.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here")
    b.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    b.add_argument("--quick", action="store_true", help="fewer shapes (a smoke run)")
    b.add_argument("--trials", type=trials_type, default=None, help="memory: trials to run (default 1000)")
    b.add_argument("--runs", type=int, default=2, help="verdict: runs of each config, in turn (default 2: the second "
                   "on the caches the first left)")
    b.add_argument("--run-timeout", type=float, default=None, metavar="S",
                   help="verdict: seconds one run may take before it is stopped with SIGTERM (default 600)")
    b.add_argument("--set", dest="settings", action="append", default=[], metavar="FIELD=VALUE",
                   help="verdict: passed to every `oracle run` (repeatable)")
    b.add_argument("--keep", type=Path, default=None, metavar="DIR",
                   help="verdict: keep each run's report folder and log under DIR (default: a temporary folder)")


def _bench_workload(args: argparse.Namespace) -> int:
    """The native engine's rows, then vLLM's beside them where vLLM is installed and a GPU ran them."""
    import tempfile

    from oracle import bench_vllm
    from oracle.bench import bench_workload

    if args.profile:
        from oracle.bench_profile import profile_workload

        return profile_workload(args.workload, args.json, warmup=args.warmup, device=args.device, preset=args.preset,
                                num_seqs=args.sequences, cuda_graphs=False if args.no_cuda_graphs else None,
                                fused_kernels=args.fused_kernels, overlap_steps=args.overlap_steps)
    try:
        names = bench_vllm.chosen_rows(args.vllm_rows)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    if args.vllm_row_timeout is not None and args.vllm_row_timeout <= 0:
        raise ConfigError(f"bench --vllm-row-timeout: must be > 0, got {args.vllm_row_timeout:g}")
    with tempfile.TemporaryDirectory(prefix="oracle-bench-") as tmp:
        json_path = args.json or Path(tmp) / "bench.json"
        rc = bench_workload(args.workload, json_path, warmup=args.warmup, rounds=args.rounds, device=args.device,
                            preset=args.preset, num_seqs=args.sequences,
                            cuda_graphs=False if args.no_cuda_graphs else None, fused_kernels=args.fused_kernels,
                            overlap_steps=args.overlap_steps)
        if rc != 0 or args.no_vllm:
            return rc
        return bench_vllm.extend(json_path, args.warmup, args.rounds, names,
                                 bench_vllm.ROW_TIMEOUT_S if args.vllm_row_timeout is None else args.vllm_row_timeout)


def command(args: argparse.Namespace) -> int:
    from oracle.bench import bench_config, bench_kernels

    if args.workload is not None:
        if args.what:
            raise ConfigError("bench: give a config or --workload, not both")
        return _bench_workload(args)
    if not args.what:
        raise ConfigError("bench: give 'kernels', 'memory', 'verdict CONFIG...', a config file, or --workload NAME")
    what, *more = args.what
    if what == "verdict":
        from oracle.bench_verdict import RUN_TIMEOUT_S, bench_verdict

        return bench_verdict(more, runs=args.runs,
                             timeout_s=RUN_TIMEOUT_S if args.run_timeout is None else args.run_timeout,
                             settings=args.settings, json_path=args.json, keep=args.keep)
    if more:
        raise ConfigError(f"bench {what}: takes no further arguments, got {' '.join(more)!r}")
    if what == "kernels":
        return bench_kernels(args.dtype, args.json, quick=args.quick)
    if what == "memory":
        from oracle.bench import bench_memory

        return bench_memory(args.json, trials=args.trials if args.trials is not None else 1000,
                            device=args.device or "cpu")
    return bench_config(what, args.json, warmup=args.warmup, rounds=args.rounds)
