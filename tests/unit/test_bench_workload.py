"""`oracle bench --workload`: both modes timed in one run, rounds with median and spread, JSON out.

A smoke run on the CPU with the tiny preset and a few sequences; the figures are not asserted,
only that every field the results page quotes is there and consistent.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from oracle.bench import WORKLOADS, workload_requests
from oracle.cli import main


def test_seed_workload_has_the_blog_shape() -> None:
    w = WORKLOADS["seed"]
    reqs = workload_requests(w, 151936)
    assert (w.preset, w.dtype, len(reqs)) == ("qwen3-8b-shape", "bfloat16", 1000)
    assert all(16 <= len(r.prompt_token_ids) <= 48 and 90 <= r.sampling.max_tokens <= 110 for r in reqs)
    assert all(r.sampling.temperature == 0.0 for r in reqs)
    assert workload_requests(w, 151936) == reqs  # seeded


# A benchmark's smoke run (as test_bench_memory's): about 600 tokens a mode on the tiny model. The workload's
# shape and the usage errors are checked in the default run; both modes' engines by the native engine's tests.
@pytest.mark.slow
def test_bench_workload_smoke_run_writes_both_modes(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    code = main(["bench", "--workload", "seed", "--preset", "tiny-qwen3", "--sequences", "3", "--device", "cpu",
                 "--warmup", "0", "--rounds", "2", "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert set(data["modes"]) == {"production", "invariant"}
    expected_tokens = sum(r.sampling.max_tokens for r in workload_requests(replace(WORKLOADS["seed"], num_seqs=3), 512))
    for r in data["modes"].values():
        assert len(r["rounds"]) == 2 and r["min_s"] <= r["median_s"] <= r["max_s"]
        assert 0 < r["forward_share"] <= 1
        assert r["tokens"] == expected_tokens
    assert data["invariant_over_production"] > 0


@pytest.mark.parametrize("argv", [["bench", "--workload", "nope"], ["bench"], ["bench", "--workload", "seed",
                                                                            "--rounds", "0"]])
def test_bench_usage_errors_exit_2(argv: list[str]) -> None:
    assert main(argv) == 2


@pytest.mark.parametrize(("flags", "message"), [(["--vllm-rows", "default,nope"], "unknown row 'nope'"),
                                                (["--vllm-row-timeout", "0"], "must be > 0")])
def test_a_bad_vllm_row_option_is_refused_before_any_round(flags: list[str], message: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--workload", "seed", *flags]) == 2
    assert message in capsys.readouterr().err
