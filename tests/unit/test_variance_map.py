"""The variance map: production's drifting trials localized and aggregated by module and op.

The native engine's production mode is batch-variant by design (torch's default matmuls, split-KV
decode attention whose split count follows the batch): each drifting trial names its first
diverging op, and the map counts them per module and op with the launch quantity each followed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from oracle.cli import main
from oracle.config import parse_config
from oracle.localized_op import LocalizedOp
from oracle.render.html import render_html
from oracle.render.markdown import render_markdown
from oracle.report import VarianceMap, load_report
from oracle.runner import run
from oracle.variance_map import map_changes, map_rows, module_pattern, pinned_ops


def native_config(model: Path, tmp_path: Path, localize: str = "all", golden: str | None = None) -> dict[str, Any]:
    checks: dict[str, Any] = {"invariance": "off", "repeatability": "off", "fidelity": "off",
                              "negative_control": "off", "prefill_decode": "off", "prefix_cache": "off",
                              "drift": {"requirement": "report", "localize": localize}}
    if golden is not None:
        checks["golden"] = {"requirement": "required", "file": golden}
    return {
        "model": str(model),
        "engine": {"kind": "native", "device": "cpu", "max_num_batched_tokens": 256, "num_threads": 1},
        "prompts": {"random": {"count": 4, "min_len": 8, "max_len": 24, "seed": 0}},
        "sampling": {"max_tokens": 4},
        "schedule": {"trials": 6, "seed": 1, "batch_size": [2, 12], "filler_len": [8, 40], "repeat_trials": 0},
        "checks": checks,
        "report_dir": str(tmp_path / "report"),
    }


@pytest.fixture(scope="module")
def mapped(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("mapped")
    return run(parse_config(native_config(tiny_qwen3, tmp)), report_dir=tmp / "report"), tmp


def test_native_production_drift_is_mapped_by_module_and_op(mapped: Any) -> None:
    report, tmp = mapped
    m = report.variance_map
    assert isinstance(m, VarianceMap) and m.localize == "all"
    drift = report.check("drift")
    assert drift is not None and m.drifting_trials == drift.divergent > 0
    # Every drifting trial is accounted for: localized to one op of the map, or said why not.
    assert m.localized + len(m.not_localized) == m.drifting_trials
    assert sorted(t for o in m.ops for t in o.trials) + sorted(int(t) for t in m.not_localized) == sorted(
        d.trial_id for d in report.divergences if d.check == "drift")  # type: ignore[type-var]
    by_trial = {d.trial_id: d.localized_op for d in report.divergences if d.check == "drift"}
    for o in m.ops:
        for t in o.trials:
            op = by_trial[t]
            assert op is not None and module_pattern(op.module) == o.module and op.op == o.op
    assert sum(m.classes.values()) == m.localized and {"attention", "matmul"} <= m.classes.keys()
    # Each op names the launch quantity its divergence followed: M for a matmul (every drifting M above the
    # solo runs'), the number of KV splits for the split-KV decode attention (fewer splits in a bigger batch).
    assert m.ops and all(o.first_at and o.confirmation for o in m.ops)
    for o in m.ops:
        if o.op_class == "matmul":
            assert o.first_at.startswith("M >= ")
            assert max(o.follows["rows"]["solo"]) < min(o.follows["rows"]["drifting"])
        if o.op_class == "attention":
            assert o.first_at.startswith("KV splits <= ")
            assert max(o.follows["num_kv_splits"]["drifting"]) < min(o.follows["num_kv_splits"]["solo"])
    print("\n".join(" | ".join(r) for r in map_rows(m)))


def test_every_view_shows_the_map(mapped: Any) -> None:
    report, tmp = mapped
    first = report.variance_map.ops[0]
    md, html = render_markdown(report), render_html(report)
    for text in (md, html):
        assert "variance map (production" in text and first.op in text
    assert f"| {first.module_class} | {first.op} | {first.op_class} |" in md
    assert f"<td>{first.module_class}</td><td>{first.op}</td>" in html
    assert first.first_at.replace(">", "&gt;").replace("<", "&lt;") in html
    from rich.console import Console

    from oracle.render.console import print_summary

    console = Console(record=True, width=240, color_system=None)
    print_summary(console, report, "report.json")
    shown = console.export_text()
    assert "variance map (production" in shown and f"{first.module_class} " in shown and first.first_at in shown
    written = load_report(tmp / "report" / "report.json")
    assert written.variance_map == report.variance_map
    assert map_rows(report.variance_map)[0][:2] == (first.module_class, first.op)


def test_localize_first_maps_one_trial_and_says_why_not_the_rest(tiny_qwen3: Path, tmp_path: Path) -> None:
    report = run(parse_config(native_config(tiny_qwen3, tmp_path, localize="first")))
    m = report.variance_map
    assert m is not None and m.localized + len(m.not_localized) == m.drifting_trials and m.drifting_trials > 1
    assert m.localized <= 1
    assert all("localize: first" in why for t, why in m.not_localized.items()
               if int(t) != min(int(x) for x in [*m.not_localized, *(str(t) for o in m.ops for t in o.trials)]))


def test_no_map_without_localize(tiny_qwen3: Path, tmp_path: Path) -> None:
    report = run(parse_config(native_config(tiny_qwen3, tmp_path, localize="off")))
    assert report.variance_map is None and "variance map" not in render_markdown(report)


def _op(module: str, op: str, op_class: str, rows: tuple[int, int]) -> LocalizedOp:
    return LocalizedOp(module, op, None, 0, None, (), (), None, None, True, op_class=op_class,
                       confirmation="confirmed", depends_on={"rows": list(rows)})


def test_a_new_batch_variant_op_is_a_named_change() -> None:
    from types import SimpleNamespace

    from oracle.schedule import Trial
    from oracle.variance_map import build_map

    trials = {i: Trial(i, 0, 0, 0, ()) for i in range(3)}

    def prod(localized: dict[int, Any]) -> Any:
        from oracle.engines.contract import Completion

        solo = Completion("s", [1, 2], [-0.5, -0.25])
        moved = Completion("t", [1, 2], [-0.5, -0.2500001])
        return SimpleNamespace(solo={0: solo}, trials={i: moved for i in trials}, localized=localized,
                               localize_notes=())

    before = build_map("all", trials, prod({i: _op("model.layers.0.mlp.down_proj", "_C.onednn_mm.default",
                                                    "matmul", (1, 62)) for i in trials}), list(trials))
    after = build_map("all", trials, prod({0: _op("model.layers.0.mlp.down_proj", "_C.onednn_mm.default", "matmul",
                                                  (1, 62)),
                                           1: _op("model.layers.3.self_attn.attn", "_C.paged_attention_v1",
                                                  "attention", (1, 40)),
                                           2: _op("model.layers.1.mlp.down_proj", "_C.onednn_mm.default",
                                                  "matmul", (1, 8))}), list(trials))
    assert [(o.module_class, o.first_at, len(o.trials)) for o in before.ops] == [("down_proj", "M >= 62", 3)]
    assert [o.layers for o in after.ops] == [[], []]  # no layer numbers in these records
    assert map_changes(pinned_ops(before), after) == (
        ["new batch-variant op: model.layers.*.self_attn.attn _C.paged_attention_v1 "
         "(1 of 3 drifting trials, first at rows >= 40)"], [])
    # An op pinned but not seen is no change (no drifting trial of this schedule may have reached it).
    assert map_changes(pinned_ops(after), before) == (
        [], ["pinned op not seen in this run: model.layers.*.self_attn.attn _C.paged_attention_v1"])
    assert map_changes(pinned_ops(before), before) == ([], [])


def test_golden_file_pins_the_map_and_the_golden_check_names_a_change(tiny_qwen3: Path, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    golden = tmp_path / "golden.json"
    data = native_config(tiny_qwen3, tmp_path, localize="first", golden=str(golden))
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["record", str(path), "--golden", str(golden)]) == 0
    assert main(["run", str(path)]) == 0
    assert main(["pin-map", str(tmp_path / "report" / "report.json"), "--golden", str(golden)]) == 0
    pinned = json.loads(golden.read_text())["variance_map"]["ops"]
    assert pinned
    assert main(["run", str(path)]) == 0  # the same map: no change
    # The pinned map without its op: this run's op is new, and the golden check says so by name.
    g = json.loads(golden.read_text())
    (key,) = g["variance_map"]["ops"]
    g["variance_map"]["ops"] = {"model.layers.*.mlp.gate_proj aten.mm.default": {"op_class": "matmul", "trials": 1,
                                                                                "of": 1, "first_at": "M >= 2"}}
    golden.write_text(json.dumps(g))
    capsys.readouterr()
    assert main(["run", str(path)]) == 1
    report = load_report(tmp_path / "report" / "report.json")
    check = report.check("golden")
    assert check is not None and check.verdict == "fail"
    assert f"new batch-variant op: {key}" in check.message
    assert check.evidence["variance_map_unseen"] == [
        "pinned op not seen in this run: model.layers.*.mlp.gate_proj aten.mm.default"]


def test_pin_map_needs_a_map(tmp_path: Path, mapped: Any, capsys: pytest.CaptureFixture[str]) -> None:
    report, tmp = mapped
    bare = report.model_copy(update={"variance_map": None})
    (tmp_path / "r").mkdir()
    bare.write(tmp_path / "r")
    (tmp_path / "g.json").write_text(json.dumps({"format": "oracle-golden/1", "targets": {}}))
    assert main(["pin-map", str(tmp_path / "r" / "report.json"), "--golden", str(tmp_path / "g.json")]) == 2
    assert "checks.drift.localize" in capsys.readouterr().err


def test_a_set_of_a_checks_field_keeps_its_shorthand_requirement(tmp_path: Path) -> None:
    """`drift: report` in the file and `--set checks.drift.localize=all`: both hold (the override was dropped)."""
    from oracle.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text("model: preset:tiny-qwen3\nprompts: {texts: [hi]}\nchecks: {drift: warn, fidelity: off}\n")
    config = load_config(path, {"checks.drift.localize": "all", "checks.fidelity.max_kl": 0.5})
    assert config.checks.drift.localize == "all" and config.checks.drift.requirement == "warn"
    assert config.checks.fidelity.requirement == "off" and config.checks.fidelity.max_kl == 0.5


def test_merged_shards_say_their_drift_was_not_localized(tiny_qwen3: Path, tmp_path: Path) -> None:
    """Shards do not localize drift (the merge localizes invariance only): the merged map counts every drifting
    trial as not localized and says why, rather than showing an empty map as if nothing drifted."""
    from oracle.render.files import write_formats
    from oracle.shards.merge import merge

    data = native_config(tiny_qwen3, tmp_path)
    folders = []
    for i in range(2):
        run(parse_config(data), report_dir=tmp_path / f"shard-{i}", shard=(i, 2))
        folders.append(tmp_path / f"shard-{i}")
    merged = merge(folders, tmp_path / "merged", trusted=True, views=[write_formats])
    m = merged.variance_map
    assert m is not None and m.drifting_trials > 0 and m.localized == 0
    assert len(m.not_localized) == m.drifting_trials
    assert all("a shard does not localize drift" in why for why in m.not_localized.values())
