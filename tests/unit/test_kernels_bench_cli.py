"""`python -m oracle_kernels.bench` without a GPU: the CLI loads, explains itself and stops cleanly.

The measurements themselves need CUDA and run on the GPU machine (see kernels/bench.py).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from oracle_kernels import bench


def test_help_needs_neither_cuda_nor_triton() -> None:
    proc = subprocess.run([sys.executable, "-m", "oracle_kernels.bench", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "--json" in proc.stdout and "--sweep" in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_without_cuda_it_says_so() -> None:
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        bench.main(["--quick"])


def test_markdown_table() -> None:
    rows = [{"m": 1, "speed": 0.91234, "note": None}, {"m": 4096, "speed": float("nan")}]
    assert bench.markdown_table(rows, ["m", "speed", "note"]).splitlines() == [
        "| m | speed | note |",
        "|---|---|---|",
        "| 1 | 0.912 | None |",
        "| 4096 | nan | None |",
    ]


def test_production_splits_follow_the_engine() -> None:
    from oracle.engines.native.engine import num_kv_splits_for

    assert [bench.production_splits(b) for b in (1, 2, 3, 8, 16, 256)] == [
        num_kv_splits_for(b) for b in (1, 2, 3, 8, 16, 256)
    ]


def test_sweep_summary_keeps_only_candidates_with_the_configured_bits() -> None:
    def row(m: int, bn: int, speed: float, same: bool = True) -> dict[str, object]:
        return {"m": m, "tiles": {"block_n": bn}, "graph_ms": 1.0, "speed_vs_cublas": speed,
                "bitwise_equal_to_configured": same}

    sweep = [row(1, 64, 0.5), row(1, 64, 2.0), row(1, 32, 0.9), row(1, 32, 1.0), row(1, 16, 9.0, same=False),
             row(8, 64, 0.7)]
    best = bench.best_tiles_by_m(sweep)
    assert [(b["m"], b["tiles"]) for b in best] == [(1, {"block_n": 64}), (8, {"block_n": 64})]
    assert best[0]["geomean_speed_vs_cublas"] == pytest.approx(1.0) and best[0]["min_speed_vs_cublas"] == 0.5


def test_tables_print_the_worst_ratio_first_and_name_the_misses() -> None:
    rows = [{"m": 1, "k": 8, "n": 8, "speed_vs_cublas": 1.02}, {"m": 8, "k": 8, "n": 8, "speed_vs_cublas": 0.86},
            {"m": 64, "k": 8, "n": 8, "speed_vs_cublas": float("nan")}, {"m": 32, "k": 8, "n": 8, "speed_vs_cublas": 0.95}]
    assert [r["m"] for r in bench.worst_first(rows, "speed_vs_cublas")] == [8, 32, 1, 64]
    assert [r["m"] for r in bench.misses(rows, *bench.TARGETS["matmul"])] == [8]  # 0.95 itself meets the target
    line = bench._misses_line("matmul", rows, ("m", "k", "n"))
    assert line.startswith("1 of 4 below 0.95x (speed_vs_cublas): (m=8 k=8 n=8) 0.86x")
    assert bench.TARGETS["attention"] == ("speed_vs_splitkv", 0.9)
