"""Known hazards drive the schedule: a matched hazard adds its probes, and one no trial crossed cannot pass.

The planted hazard: the native engine (tests/support/hazard_engine.py) moves `aten.mm` of layer 1's
down_proj by one ULP, in invariant mode, in forward passes of more than 48 tokens. A hazards file of
the test declares exactly that threshold with the probe that crosses it (`pass_tokens: 48`). The
config's random ranges never reach it: at most 4 requests of at most 8 prompt tokens, so no pass
holds more than 32 prompt tokens (and 4 decode tokens).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from oracle.cli import main
from oracle.config import parse_config
from oracle.errors import ConfigError
from oracle.plan import plan_run
from oracle.posture.hazards import load_hazards, load_user_hazards
from oracle.runner import run

HAZARD = {
    "id": "native-mm-over-48-tokens",
    "title": "down_proj's matmul takes another path in passes of more than 48 tokens (planted)",
    "engine": "native",
    "when": {"device": "cpu"},
    "threshold": "a forward pass of more than 48 tokens",
    "references": ["tests/support/hazard_engine.py"],
    "probes": [{"pass_tokens": 48}],
}


def hazard_config(model: Path, tmp_path: Path, hazards: list[dict[str, Any]] | None = None,
                  probes: Any = None, budget: int = 256) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "model": str(model),
        "engine": {"kind": "hazard_engine:HazardEngine", "device": "cpu", "max_num_batched_tokens": budget,
                   "options": {"min_tokens": 48}},
        "prompts": {"random": {"count": 3, "min_len": 4, "max_len": 8}},
        "sampling": {"max_tokens": 4},
        "schedule": {"trials": 6, "batch_size": [1, 4], "filler_len": [1, 8], "filler_max_tokens": [1, 4],
                     "repeat_trials": 0, "shrink": False},
        "checks": {"invariance": {"requirement": "required", "localize": "off"}, "repeatability": "off",
                   "fidelity": "off", "drift": "off", "negative_control": "off", "prefill_decode": "off",
                   "prefix_cache": "off"},
        "report_dir": str(tmp_path / "report"),
    }
    if hazards is not None:
        path = tmp_path / "my-hazards.yaml"
        path.write_text(yaml.safe_dump(hazards))
        cfg["hazards"] = str(path)
    if probes is not None:
        cfg["schedule"]["probes"] = probes
    return cfg


def _invariance(report: Any) -> Any:
    return next(c for c in report.checks if c.name == "invariance")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_declared_hazard_is_probed_and_its_planted_fault_found(tiny_qwen3: Path, tmp_path: Path,
                                                                  seed: int) -> None:
    report = run(parse_config(hazard_config(tiny_qwen3, tmp_path, [HAZARD])), seed=seed,
                 report_dir=tmp_path / f"r{seed}")
    inv = _invariance(report)
    assert inv.verdict == "fail"
    probe = {t.trial_id: t.probe for t in report.schedule}
    failing = {probe[d.trial_id] for d in report.divergences if d.check == "invariance"}  # type: ignore[index]
    assert failing == {"pass_tokens=48:above"}  # the side at the threshold (48 tokens) holds
    assert {t.probe for t in report.schedule if t.probe} == {"pass_tokens=48:below", "pass_tokens=48:above"}
    (h,) = report.hazard_probes
    assert h.id == "native-mm-over-48-tokens" and h.match == "matches" and h.untested == ""
    assert h.crossed_by == [t.trial_id for t in report.schedule if t.probe == "pass_tokens=48:above"]
    assert "pass_tokens=48:above" in (tmp_path / f"r{seed}" / "report.json").read_text()


def test_without_the_hazard_the_same_config_passes(tiny_qwen3: Path, tmp_path: Path) -> None:
    report = run(parse_config(hazard_config(tiny_qwen3, tmp_path)), seed=1)
    assert _invariance(report).verdict == "pass"
    assert not any(t.probe for t in report.schedule) and report.hazard_probes == []


def test_with_probes_none_an_untested_matched_hazard_is_vacuous_not_pass(tiny_qwen3: Path, tmp_path: Path) -> None:
    report = run(parse_config(hazard_config(tiny_qwen3, tmp_path, [HAZARD], probes="none")), seed=1)
    inv = _invariance(report)
    assert inv.verdict == "vacuous" and report.exit_code() == 1
    assert "native-mm-over-48-tokens" in inv.message and "schedule.probes is none" in inv.message
    assert set(inv.evidence["untested_hazards"]) == {"native-mm-over-48-tokens"}
    assert not any(t.probe for t in report.schedule)


def test_a_probe_the_engines_budget_rules_out_is_reported_with_the_limit(tiny_qwen3: Path, tmp_path: Path) -> None:
    from oracle.runner import declared_hazards

    lines = declared_hazards(plan_run(parse_config(hazard_config(tiny_qwen3, tmp_path, [HAZARD], budget=40)), seed=1))
    assert lines[0].startswith("invariance claimed, known not to hold: native-mm-over-48-tokens")
    assert "hazard probe pass_tokens=48:above not formed: engine.max_num_batched_tokens 40 < 49" in "\n".join(lines)
    report = run(parse_config(hazard_config(tiny_qwen3, tmp_path, [HAZARD], budget=40)), seed=1)
    inv = _invariance(report)
    assert inv.verdict == "vacuous"
    assert "engine.max_num_batched_tokens 40 < 49" in inv.message
    (h,) = report.hazard_probes
    assert [(n.probe, n.limit.split(":")[0]) for n in h.not_formed] == [
        ("pass_tokens=48:below", "engine.max_num_batched_tokens 40 < 49"),
        ("pass_tokens=48:above", "engine.max_num_batched_tokens 40 < 49")]


def test_a_crossing_seen_in_the_evidence_counts_without_a_probe(tiny_qwen3: Path, tmp_path: Path) -> None:
    """A hazard of passes over 20 tokens, probes none: drawn trials of up to 4 x 8 prompt tokens cross it, and
    the per-pass evidence says so (the fault stays at 48, so invariance passes)."""
    low = {**HAZARD, "id": "native-over-20", "probes": [{"pass_tokens": 20}]}
    cfg = hazard_config(tiny_qwen3, tmp_path, [low], probes="none")
    cfg["schedule"]["trials"] = 12
    report = run(parse_config(cfg), seed=1)
    assert _invariance(report).verdict == "pass"
    assert report.hazard_probes[0].crossed_by


@pytest.mark.parametrize(("change", "field"), [
    ({"probes": [{"pass_tokens": 0}]}, "probes: 0: a threshold probe"),
    ({"probes": ["fa4_everything"]}, "probes: 0: 'fa4_everything' is not a probe"),
    ({"thresold": "x"}, "thresold: unknown field"),
    ({"when": {"attention": "FA3"}}, "when: attention: not a posture setting"),
    ({"status": "maybe"}, "status: Input should be"),
    ({"references": []}, "references: List should have at least 1 item"),
])
def test_a_bad_user_hazards_file_is_exit_2_naming_the_file_and_field(
        tiny_qwen3: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, Any],
        field: str) -> None:
    bad = {k: v for k, v in {**HAZARD, **change}.items()}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(hazard_config(tiny_qwen3, tmp_path, [bad])))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"my-hazards.yaml: hazard 0 (native-mm-over-48-tokens): {field}" in err
    assert "Traceback" not in err


def test_a_missing_hazards_file_or_a_shipped_id_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"hazards: cannot read .*nowhere.yaml"):
        load_user_hazards(tmp_path / "nowhere.yaml")
    dup = tmp_path / "dup.yaml"
    dup.write_text(yaml.safe_dump([{**HAZARD, "id": "vllm-fa3-head-dim-64"}]))
    with pytest.raises(ConfigError, match=r"dup.yaml: vllm-fa3-head-dim-64: id: already a shipped hazard"):
        load_user_hazards(dup)


def test_the_docs_example_is_a_valid_hazards_file() -> None:
    text = (Path(__file__).parents[2] / "docs" / "hazards.md").read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    found = load_hazards(block, "docs/hazards.md")
    assert found and all(h.probes for h in found)


def test_every_shipped_hazard_names_probes() -> None:
    assert all(h.probes for h in load_hazards())


def test_a_shipped_vllm_gpu_config_crosses_fa3_without_a_probes_line(fake_model: Path,
                                                                    monkeypatch: pytest.MonkeyPatch, vllm_package: None) -> None:
    """configs/vllm-gpu.yaml with its `probes:` line removed, on a model of head_dim 64 (vLLM 0.26 on a GPU, as
    the config would see it): the FA3 hazard is possible, so its probes are in the plan."""
    import json

    import torch

    import oracle.posture

    monkeypatch.setattr(oracle.posture, "installed_version", lambda *names: "0.26.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = json.loads((fake_model / "config.json").read_text())
    cfg.update(hidden_size=256, num_attention_heads=4, num_key_value_heads=1)
    (fake_model / "config.json").write_text(json.dumps(cfg))
    data = yaml.safe_load((Path(__file__).parents[2] / "configs" / "vllm-gpu.yaml").read_text())
    data["schedule"].pop("probes", None)
    data["model"] = str(fake_model)
    data["prompts"] = {"random": {"count": 3, "min_len": 2, "max_len": 5}}
    plan = plan_run(parse_config(data), seed=1)
    assert [m.hazard.id for m in plan.hazards] == ["vllm-fa3-head-dim-64", "vllm-chunked-prefill-untested"]
    names = {t.probe.partition(":")[0] for t in plan.trials if t.probe}
    assert {"fa3_kv_128", "fa3_kv_256", "short_budget"} <= names


def test_pass_bytes_and_shared_pass_probes_are_built_from_the_model_and_engine(fake_model: Path) -> None:
    """`pass_bytes` divides by one token's hidden state (hidden 64 x float32's 4 bytes = 256 bytes a token);
    `shared_pass` puts one filler beside the target for its whole decode."""
    import json

    from oracle.models.facts import read_model_facts
    from oracle.posture.hazards import ProbeSpec
    from oracle.posture.probes import make_probes
    from oracle.prompts import Target

    raw = json.loads((fake_model / "config.json").read_text())
    (fake_model / "config.json").write_text(json.dumps({**raw, "hidden_size": 64}))
    config = parse_config({"model": str(fake_model), "engine": {"kind": "native", "max_num_batched_tokens": 64},
                           "prompts": {"texts": ["x"]}, "sampling": {"max_tokens": 4}})
    targets = [Target("t", (1, 2, 3, 4, 5))]
    made = make_probes(config, targets, read_model_facts(fake_model), 1, 0, 97,
                       [ProbeSpec("pass_bytes", 256 * 40), ProbeSpec("shared_pass"), ProbeSpec("pass_bytes", 256 * 64)])
    demand = {t.probe: 5 + sum(f.length for f in t.fillers) for t in made.trials if t.probe.startswith("pass_bytes")}
    assert demand == {"pass_bytes=10240:below": 40, "pass_bytes=10240:above": 41}
    (shared,) = [t for t in made.trials if t.probe == "shared_pass:above"]
    assert len(shared.fillers) == 1 and shared.fillers[0].max_tokens == 4 and shared.fillers[0].arrival_step == 0
    assert made.unformed == (("pass_bytes=16384:below", "engine.max_num_batched_tokens 64 < 65: no pass holds the "
                              "threshold's tokens"), ("pass_bytes=16384:above", "engine.max_num_batched_tokens 64 "
                                                      "< 65: no pass holds the threshold's tokens"))
