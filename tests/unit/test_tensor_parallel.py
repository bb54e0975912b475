"""Tensor parallel on the vllm engine, without starting vLLM: the plugin's gate, the per-rank in-force rule,
the parallel sizes as engine fields, the all-reduce reader, and hazards matched on what the ranks reported.

The same paths with real vLLM ranks are in tests/integration/test_vllm_tp.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import oracle_kernels
import pytest

from oracle.config import EngineConfig, parse_config
from oracle.engine_options import VllmOptions
from oracle.engines import vllm_plugin
from oracle.engines.contract import Request, RunSpec, SamplingParams
from oracle.engines.kinds import declared_posture
from oracle.engines.vllm_engine import VllmEngine, check_host_runs, parallel_sizes
from oracle.engines.vllm_plugin import all_reduce_of, not_in_force
from oracle.engines.vllm_worker import WorkerSpec
from oracle.errors import ConfigError
from oracle.plan import plan_run
from oracle.posture import FIELDS, UNKNOWN, posture_digest
from oracle.posture.hazards import match_hazards
from oracle.runner import declared_hazards

ATEN = {"torch F.linear (aten mm)": 18}


def _rank(rank: int, **change: Any) -> dict[str, Any]:
    return {"rank": rank, "pid": 100 + rank, "device": "cpu", "kernels": True, "plugin": True,
            "linear_counts": ATEN, "ops": {"batch_variant_covered": ["aten::mm"], "batch_variant_uncovered": []},
            **change}


def test_the_plugin_does_nothing_where_oracle_did_not_ask(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM runs every installed general plugin in every process: a user's own vLLM must not get our kernels."""
    monkeypatch.delenv(vllm_plugin.ENV, raising=False)
    oracle_kernels.disable()
    vllm_plugin.register()
    assert not oracle_kernels.is_enabled()
    assert vllm_plugin._LOADED["kernels"] is False
    monkeypatch.setenv(vllm_plugin.ENV, "0")
    vllm_plugin.register()
    assert not oracle_kernels.is_enabled()


def test_the_plugin_is_registered_as_a_vllm_general_plugin() -> None:
    import tomllib

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    plugins = project["project"]["entry-points"]["vllm.general_plugins"]
    assert plugins == {vllm_plugin.PLUGIN_NAME: "oracle.engines.vllm_plugin:register"}


def test_in_force_in_every_rank_names_nothing() -> None:
    assert not_in_force([_rank(0), _rank(1)], 2) == []


@pytest.mark.parametrize(("rank1", "said"), [
    ({"kernels": False, "plugin": False}, "oracle_kernels are not registered in its process; oracle's vLLM plugin"),
    ({"linear_counts": {"oneDNN (_C::onednn_mm)": 18}}, "oneDNN (_C::onednn_mm) x18"),
    ({"ops": {"batch_variant_covered": [], "batch_variant_uncovered": ["aten::mm"]}}, "reached no oracle_kernels op"),
])
def test_a_rank_running_default_kernels_is_named(rank1: dict[str, Any], said: str) -> None:
    why = not_in_force([_rank(0), _rank(1, **rank1)], 2)
    assert len(why) == 1 and why[0].startswith("rank 1") and said in why[0]


def test_a_rank_that_never_answered_is_named() -> None:
    assert not_in_force([_rank(0)], 2) == ["rank 1: did not report (no rank answered for it)"]


def test_parallel_sizes_are_fields_and_engine_args_say_the_same() -> None:
    assert parallel_sizes(VllmOptions(tensor_parallel_size=2))[:2] == (2, 1)
    tp, pp, rest = parallel_sizes(VllmOptions(engine_args={"tensor_parallel_size": 2, "seed": 3}))
    assert (tp, pp, rest) == (2, 1, {"seed": 3})
    with pytest.raises(ConfigError, match=r"engine.options.tensor_parallel_size is 4 but .*engine_args"):
        parallel_sizes(VllmOptions(tensor_parallel_size=4, engine_args={"tensor_parallel_size": 2}))
    with pytest.raises(ConfigError, match=r"engine_args.pipeline_parallel_size: expected an integer >= 1"):
        parallel_sizes(VllmOptions(engine_args={"pipeline_parallel_size": "2"}))


def test_a_zero_size_is_a_config_error_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"engine.options.tensor_parallel_size"):
        parse_config({"model": str(tmp_path), "engine": {"kind": "vllm", "options": {"tensor_parallel_size": 0}}})


@pytest.mark.parametrize(("tp", "pp", "field"), [(4096, 1, "tensor_parallel_size"), (1, 4096, "pipeline_parallel_size")])
def test_a_size_the_host_cannot_run_is_a_config_error_before_any_worker(fake_model: Path, tp: int, pp: int,
                                                                      field: str) -> None:
    with pytest.raises(ConfigError, match=rf"^engine.options.{field}: .* needs 4096 .* this host has \d+"):
        VllmEngine(fake_model, "invariant",
                   EngineConfig.of("vllm", tensor_parallel_size=tp, pipeline_parallel_size=pp))
    check_host_runs(1, 1)


def test_the_plugin_is_asked_for_in_the_invariant_oracle_kernels_worker_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(vllm_plugin.ENV, "1")  # the caller's shell never decides it
    options = VllmOptions()
    assert VllmEngine._worker_env("invariant", options, None)[vllm_plugin.ENV] == "1"
    assert vllm_plugin.ENV not in VllmEngine._worker_env("production", options, None)
    assert vllm_plugin.ENV not in VllmEngine._worker_env("invariant", VllmOptions(invariance="vllm"), None)
    # An allowlist of vLLM plugins keeps its entries and lets ours in.
    env = VllmEngine._worker_env("invariant", VllmOptions(env={"VLLM_PLUGINS": "lora_filesystem_resolver"}), None)
    assert env["VLLM_PLUGINS"] == "lora_filesystem_resolver,oracle_kernels"


class CpuCommunicator:
    def __init__(self, module: object) -> None:
        self.dist_module, self.device_group = module, None


class _CPUSHMDistributed:
    pass


class CudaCommunicator:
    def __init__(self, **paths: object) -> None:
        for attr, _ in vllm_plugin._CUDA_ALL_REDUCE:
            setattr(self, attr, paths.get(attr))


class _Path:
    def __init__(self, disabled: bool = False) -> None:
        self.disabled = disabled


class _Group:
    def __init__(self, comm: object, world_size: int = 2) -> None:
        self.device_communicator, self.world_size = comm, world_size


def test_the_all_reduce_is_read_from_the_groups_communicator() -> None:
    assert all_reduce_of(None) == UNKNOWN
    assert all_reduce_of(_Group(None, world_size=1)) == "none"
    assert all_reduce_of(_Group(object())) == UNKNOWN
    assert all_reduce_of(_Group(CpuCommunicator(_CPUSHMDistributed()))).startswith("cpu shm all-reduce")
    assert all_reduce_of(_Group(CpuCommunicator(object()))).startswith("torch.distributed (")
    cuda = CudaCommunicator(ca_comm=_Path(), symm_mem_comm=_Path(disabled=True), pynccl_comm=_Path())
    assert all_reduce_of(_Group(cuda)) == "custom all-reduce, then pynccl (NCCL), then torch.distributed (NCCL)"


TP2 = {"engine": "vllm", "engine_version": "0.32.0", "device": "cpu", "attention_backend": "CPU_ATTN",
       "invariance_mechanism": "oracle_kernels in every rank", "sequence_parallel": False, "async_scheduling": False,
       "tensor_parallel": 2, "all_reduce": "torch.distributed (gloo)", "sampler": "pytorch"}


def test_the_cuda_custom_all_reduce_hazard_matches_only_what_the_ranks_reported() -> None:
    ids = lambda posture: {m.hazard.id: m.match for m in match_hazards(posture, {"head_dim": 64}, {})}  # noqa: E731
    assert ids(TP2) == {}
    assert ids({**TP2, "all_reduce": "cpu shm all-reduce (vLLM _CPUSHMDistributed)"}) == {}
    cuda = {**TP2, "device": "cuda:0", "attention_backend": "FLASH_ATTN (FA2)"}
    assert ids({**cuda, "all_reduce": UNKNOWN}) == {"vllm-custom-all-reduce": "possible"}
    assert ids({**cuda, "all_reduce": "custom all-reduce, then pynccl (NCCL)"}) == {"vllm-custom-all-reduce": "matches"}
    assert ids({**cuda, "all_reduce": "pynccl (NCCL), then torch.distributed (NCCL)"}) == {}
    assert ids({**cuda, "tensor_parallel": 1, "all_reduce": "none"}) == {}


def _tp2_config(model: Path) -> dict[str, Any]:
    return {"model": str(model), "engine": {"kind": "vllm", "options": {"tensor_parallel_size": 2}},
            "prompts": {"random": {"count": 2, "min_len": 2, "max_len": 5}}, "sampling": {"max_tokens": 4},
            "schedule": {"trials": 2, "seed": 7}}


def test_declared_tp2_posture_guesses_no_all_reduce_and_warns_no_cuda_hazard_on_a_cpu(
        fake_model: Path, monkeypatch: pytest.MonkeyPatch, vllm_package: None) -> None:
    import torch

    import oracle.posture

    monkeypatch.setattr(oracle.posture, "installed_version", lambda *names: "0.32.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    plan = plan_run(parse_config(_tp2_config(fake_model)))
    declared = declared_posture(plan.config.engine, "invariant")
    assert declared["tensor_parallel"] == 2 and declared["all_reduce"] == UNKNOWN
    assert not any("custom-all-reduce" in line for line in declared_hazards(plan))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the plan matches hazards: plan again
    assert any(line.startswith("invariance claimed, may not hold: vllm-custom-all-reduce")
               for line in declared_hazards(plan_run(parse_config(_tp2_config(fake_model)))))


def test_rank_devices_and_tp_size_are_in_the_posture_and_its_digest() -> None:
    assert "rank_devices" in FIELDS and "tensor_parallel" in FIELDS
    one = {**TP2, "tensor_parallel": 1, "rank_devices": ["cpu"]}
    assert posture_digest({"invariant": one}) != posture_digest({"invariant": {**TP2, "rank_devices": ["cpu", "cpu"]}})


def test_localization_across_pipeline_stages_is_inconclusive_and_says_why() -> None:
    engine = VllmEngine.__new__(VllmEngine)  # no worker: across stages nothing is sent to one
    engine.spec = WorkerSpec(model="m", mode="invariant", invariance="oracle_kernels", dtype="float32", max_num_seqs=4,
                             max_num_batched_tokens=64, enable_chunked_prefill=True, enable_prefix_caching=False,
                             logprobs=5, enforce_eager=True, max_model_len=None, seed=0, audit=False,
                             tensor_parallel_size=2, pipeline_parallel_size=2)
    run = RunSpec((Request("t", (1, 2, 3), SamplingParams(max_tokens=2)),), 0)
    found = engine.localize(run, run)
    assert found is not None and found.status == "inconclusive"
    assert "2 pipeline stages" in found.note and "pipeline_parallel_size 2" in found.note
