"""`python -m oracle.bench_profile`: the native engine's per-phase profile, on the CPU with the tiny preset.

The figures are not asserted, only that every field is there and consistent, that the op classes name
what they should, and that a profiled run gives bitwise the outputs of an unprofiled one.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from oracle.bench import WORKLOADS, Workload, random_decoder, workload_requests
from oracle.bench_profile import main as profile_main
from oracle.bench_profile import op_class
from oracle.engines.native.profile import FORWARD_KINDS, PHASES, StepProfile

SMALL = Workload(**{**asdict(WORKLOADS["seed"]), "name": "small", "preset": "tiny-qwen3", "dtype": "float32",
                    "num_seqs": 5, "prompt_len": (4, 12), "output_len": (2, 5), "max_num_seqs": 4,
                    "max_num_batched_tokens": 24})


@pytest.mark.parametrize(("name", "cls"), [
    ("matmul_kernel", "matmul"), ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT", "matmul"), ("aten::mm", "matmul"),
    ("partition_kernel", "attention"), ("merge_kernel", "attention"), ("oracle_kernels::paged_attention", "attention"),
    ("rms_norm_kernel", "norm"), ("softmax_kernel", "sampling"), ("sampled_rows_kernel", "sampling"),
    ("aten::argmax", "sampling"),
    ("aten::index_put_", "kv_write"), ("Memcpy HtoD (Pageable -> Device)", "copy"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>", "elementwise"),
    ("aten::cat", "elementwise"), ("something_new", "other"),
])
def test_op_classes(name: str, cls: str) -> None:
    assert op_class(name) == cls


def test_profile_of_a_small_workload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(WORKLOADS, "small", SMALL)
    out = tmp_path / "profile.json"
    assert profile_main(["--workload", "small", "--warmup", "0", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    for mode in ("invariant", "production"):
        r = rows["modes"][mode]
        assert set(r["host_s"]) == set(PHASES) and set(r["forward_s"]) == set(FORWARD_KINDS)
        assert sum(r["host_s"].values()) <= r["round_s"] * 1.05
        assert r["generated_tokens"] > 0 and r["steps"]["prefill"] >= 1
        assert r["steps"]["decode_graph"] == 0 and r["decode_graph_coverage"] == 0.0  # no graphs on the CPU
        assert sum(r["eager_decode_batch_sizes"].values()) == r["steps"]["decode_eager"]
        assert r["ops"]["classes"]["matmul"]["count"] > 0
        top = r["ops"]["top"]
        assert 0 < len(top) <= 20 and [k["ms"] for k in top] == sorted((k["ms"] for k in top), reverse=True)
        assert {k["class"] for k in top} <= set(r["ops"]["classes"])


def test_a_profiled_run_gives_the_same_bits() -> None:
    from oracle.config import EngineConfig
    from oracle.engines.native import NativeEngine

    decoder = random_decoder(SMALL.preset, SMALL.dtype, "cpu")
    requests = workload_requests(SMALL, decoder.config.vocab_size)
    engine = NativeEngine(decoder, "invariant", EngineConfig.of("native", dtype="float32", max_num_seqs=4,
                                                                 max_num_batched_tokens=24))
    plain = engine.generate(requests)
    engine.profile = StepProfile(engine.device)
    profiled = engine.generate(requests)
    assert [(o.token_ids, o.logprobs) for o in plain] == [(o.token_ids, o.logprobs) for o in profiled]
    assert sum(engine.profile.steps.values()) > 0
