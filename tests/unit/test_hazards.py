"""Known hazards (oracle/posture/hazards.yaml) matched to a posture and model; posture digests in reports and golden files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from oracle.cli import main
from oracle.config import parse_config
from oracle.golden import make_golden
from oracle.plan import plan_run
from oracle.posture import FIELDS, UNKNOWN, posture_digest, posture_of
from oracle.posture.hazards import load_hazards, match_hazards, version_in
from oracle.render.markdown import render_markdown
from oracle.runner import declared_hazards, run

FA3 = {"engine": "vllm", "engine_version": "0.26.0", "device": "cuda:0", "attention_backend": "FLASH_ATTN (FA3)",
       "invariance_mechanism": "VLLM_BATCH_INVARIANT=1", "sequence_parallel": False, "async_scheduling": False,
       "tensor_parallel": 1, "all_reduce": "none", "sampler": "pytorch", "chunked_prefill": False,
       "prefix_caching": False}


def _ids(found: list[Any]) -> dict[str, str]:
    return {m.hazard.id: m.match for m in found}


def test_shipped_hazards_name_engine_versions_conditions_references_and_status() -> None:
    hazards = {h.id: h for h in load_hazards()}
    assert {"vllm-fa3-head-dim-64", "vllm-sequence-parallel", "vllm-custom-all-reduce", "vllm-async-scheduling",
            "vllm-flashinfer-sampler"} <= hazards.keys()
    assert any("51902" in r for r in hazards["vllm-fa3-head-dim-64"].references)
    assert any("47069" in r for r in hazards["vllm-fa3-head-dim-64"].references)
    assert any("56370" in r for r in hazards["vllm-sequence-parallel"].references)
    assert any("50136" in r for r in hazards["vllm-custom-all-reduce"].references)
    assert any("51187" in r for r in hazards["vllm-flashinfer-sampler"].references)
    assert all(h.when and h.status and h.engine for h in hazards.values())


def test_fa3_head_dim_64_matches_only_its_posture_and_model() -> None:
    assert _ids(match_hazards(FA3, {"head_dim": 64, "linear_attention": False}, {"temperature": 0.0})) == {"vllm-fa3-head-dim-64": "matches"}
    assert match_hazards(FA3, {"head_dim": 128, "linear_attention": False}, {"temperature": 0.0}) == []
    assert match_hazards({**FA3, "attention_backend": "FLASH_ATTN (FA2)"}, {"head_dim": 64, "linear_attention": False}, {}) == []
    assert match_hazards({**FA3, "engine_version": "0.9.2"}, {"head_dim": 64, "linear_attention": False}, {}) == []
    # Invariance not claimed (production's posture): nothing is known not to hold.
    assert match_hazards({**FA3, "invariance_mechanism": "none (vLLM's default kernels)"}, {"head_dim": 64, "linear_attention": False}, {}) == []


def test_unknown_settings_make_a_hazard_possible_never_a_match() -> None:
    found = match_hazards({**FA3, "attention_backend": UNKNOWN}, {"head_dim": 64, "linear_attention": False}, {})
    assert _ids(found) == {"vllm-fa3-head-dim-64": "possible"}
    assert found[0].unknown == ("attention_backend",)


@pytest.mark.parametrize(("change", "sampling", "hazard"), [
    ({"sequence_parallel": True}, {}, "vllm-sequence-parallel"),
    ({"async_scheduling": True}, {}, "vllm-async-scheduling"),
    ({"tensor_parallel": 2, "all_reduce": "custom all-reduce"}, {}, "vllm-custom-all-reduce"),
    ({"sampler": "flashinfer (top-k/top-p)"}, {"temperature": 0.7}, "vllm-flashinfer-sampler"),
])
def test_each_hazard_matches_its_condition(change: dict[str, Any], sampling: dict[str, Any], hazard: str) -> None:
    posture = {**FA3, "attention_backend": "FLASH_ATTN (FA2)", **change}
    assert _ids(match_hazards(posture, {"head_dim": 128, "linear_attention": False}, {"temperature": 0.0, **sampling})) == {hazard: "matches"}


def test_flashinfer_sampler_is_no_hazard_for_greedy_decoding() -> None:
    posture = {**FA3, "attention_backend": "FLASH_ATTN (FA2)", "sampler": "flashinfer (top-k/top-p)"}
    assert match_hazards(posture, {"head_dim": 128, "linear_attention": False}, {"temperature": 0.0}) == []


def test_version_ranges() -> None:
    assert version_in("0.26.1rc2+cu128", "0.10.0", "0.27") is True
    assert version_in("0.27.0", "0.10.0", "0.27") is False
    assert version_in(UNKNOWN, "0.10.0", None) is None


def test_posture_has_every_field_and_marks_unknowns() -> None:
    p = posture_of({"engine": "openai", "server_version": "0.26.0"})
    assert set(p) == set(FIELDS)
    assert p["engine_version"] == "0.26.0" and p["attention_backend"] == UNKNOWN
    native = posture_of({"engine": "native", "engine_version": "oracle", "device": "cpu", "dtype": "float32",
                         "invariance_mechanism": "oracle_kernels (...)", "enable_chunked_prefill": True,
                         "enable_prefix_caching": False})
    assert UNKNOWN not in native.values()
    assert posture_digest({"invariant": native}) != posture_digest({"invariant": {**native, "dtype": "bfloat16"}})


def _fa3_config(model: Path, tmp_path: Path, **options: Any) -> dict[str, Any]:
    cfg = json.loads((model / "config.json").read_text())
    # head_dim 64 (256 / 4), GQA ratio 4.
    cfg.update(hidden_size=256, num_attention_heads=4, num_key_value_heads=1)
    (model / "config.json").write_text(json.dumps(cfg))
    return {
        "model": str(model), "engine": {"kind": "posture_engine:PostureEngine", "options": options},
        "prompts": {"random": {"count": 3, "min_len": 2, "max_len": 5}}, "sampling": {"max_tokens": 4},
        "schedule": {"trials": 12, "seed": 7, "batch_size": [1, 12], "repeat_trials": 2},
        "report_dir": str(tmp_path / "report"),
    }


def test_report_carries_posture_hazard_and_divergences_cite_it(fake_model: Path, tmp_path: Path) -> None:
    report = run(parse_config(_fa3_config(fake_model, tmp_path, diverge_from_batch=5, diverge_step=1)))
    posture = report.posture
    assert posture is not None and posture.modes["invariant"].attention_backend == "FLASH_ATTN (FA3)"
    assert len(posture.digest) == 16 and set(posture.digests) == {"invariant", "production"}
    # vLLM's own flag with chunked prefill on: the chunked-prefill hazard (vLLM PR #55612) matches too.
    assert [h.id for h in report.hazards] == ["vllm-fa3-head-dim-64", "vllm-chunked-prefill-untested"]
    inv = [d for d in report.divergences if d.check == "invariance"]
    assert inv and all(any("51902" in c for c in d.evidence["known_hazards"]) for d in inv)
    summary = render_markdown(report)
    assert posture.digest in summary and "known not to hold: vllm-fa3-head-dim-64" in summary


def test_cli_summary_shows_posture_digest_and_hazard(fake_model: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    path = tmp_path / "fa3.yaml"
    path.write_text(yaml.safe_dump(_fa3_config(fake_model, tmp_path)))
    # Nothing diverges, but no trial crossed the matched hazard's threshold (the engine states no posture
    # before it starts, so no probe was planned): invariance is vacuous, the run fails closed.
    assert main(["run", str(path)]) == 1
    out = capsys.readouterr().out
    written = json.loads((tmp_path / "report" / "report.json").read_text())
    inv = next(c for c in written["checks"] if c["name"] == "invariance")
    assert inv["verdict"] == "vacuous" and "vllm-fa3-head-dim-64" in inv["evidence"]["untested_hazards"]
    digest = json.loads((tmp_path / "report" / "report.json").read_text())["environment"]["posture"]["digest"]
    assert f"posture {digest}" in out
    assert "invariance claimed, known not to hold: vllm-fa3-head-dim-64" in out


def test_a_vllm_fa3_config_is_warned_before_it_starts(fake_model: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch, vllm_package: None) -> None:
    """The config's own posture (before any engine starts): vLLM 0.26 on a GPU, head_dim 64; the backend is
    only known once the engine runs, so the FA3 hazard is named as possible."""
    import torch

    import oracle.posture

    monkeypatch.setattr(oracle.posture, "installed_version", lambda *names: "0.26.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = _fa3_config(fake_model, tmp_path)
    cfg["engine"] = {"kind": "vllm", "options": {"invariance": "vllm"}}
    lines = declared_hazards(plan_run(parse_config(cfg)))
    assert len(lines) == 2 and lines[0].startswith("invariance claimed, may not hold: vllm-fa3-head-dim-64")
    assert lines[1].startswith("invariance claimed, known not to hold: vllm-chunked-prefill-untested")
    assert "51902" in lines[0] and "attention_backend" in lines[0]
    cfg["engine"]["options"]["engine_args"] = {"attention_backend": "FLASH_ATTN", "compilation_config": {
        "pass_config": {"enable_sp": True}}}
    assert any("vllm-sequence-parallel" in line and "known not to hold" in line
               for line in declared_hazards(plan_run(parse_config(cfg))))


def test_golden_file_stores_the_invariant_posture_digest() -> None:
    env = {"posture": {"digests": {"invariant": "abc"}}}
    assert make_golden({}, {}, env, "0" * 64)["posture_digest"] == "abc"


def test_declared_posture_reads_typed_options_with_their_defaults() -> None:
    """The posture reads what the engine reads: an unset vLLM option is its default (enforce_eager: true ->
    no CUDA graphs), a started server's env and mode_env are the mode's environment."""
    from oracle.config import parse_config
    from oracle.engines.kinds import declared_posture

    base = {"model": "preset:tiny-qwen3", "prompts": {"random": {"count": 1}}}
    vllm = parse_config({**base, "engine": {"kind": "vllm", "options": {"invariance": "vllm", "env": {"X": "1"}}}})
    inv = declared_posture(vllm.engine, "invariant")
    assert inv["cuda_graphs"] == "off" and inv["env"]["X"] == "1" and inv["env"]["VLLM_BATCH_INVARIANT"] == "1"
    assert declared_posture(vllm.engine, "production")["env"].get("VLLM_BATCH_INVARIANT") != "1"
    server = parse_config({**base, "engine": {"kind": "openai", "options": {
        "command": ["serve", "{host}", "{port}"], "env": {"A": "1"},
        "mode_env": {"invariant": {"VLLM_BATCH_INVARIANT": "1"}}}}})
    inv_env, prod_env = (declared_posture(server.engine, m)["env"] for m in ("invariant", "production"))
    assert inv_env["A"] == prod_env["A"] == "1"
    assert inv_env["VLLM_BATCH_INVARIANT"] == "1" and prod_env.get("VLLM_BATCH_INVARIANT") != "1"
