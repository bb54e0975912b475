"""The report's typed sections (posture, hazards, search, example_db, shard): described in the schema, each
shape read back and written again byte for byte (`{}` for an unused one), a malformed one refused on load
naming the field."""

from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from conftest import write_fake_checkpoint

from oracle.config import parse_config
from oracle.errors import ConfigError
from oracle.report import load_report, report_schema
from oracle.report_sections import (
    ExampleDbRecord,
    HazardRecord,
    MergedShards,
    PostureRecord,
    SearchRecord,
    SearchStopped,
    ShardSlice,
)
from oracle.runner import run

SECTION_MODELS = ("ModePosture", "PostureRecord", "HazardRecord", "HazardEvidence", "ProbeEvidence",
                  "ProbeSideEvidence", "SearchRecord", "SearchStopped", "ExampleDbRecord", "ShardSlice",
                  "MergedShards", "MergedShard")

HAZARD = {"id": "planted", "title": "a planted hazard", "match": "matches", "unknown": [], "references": ["here"],
          "status": "open", "threshold": "a pass of more than 48 tokens", "probes": ["pass_tokens=48"],
          "source": "my-hazards.yaml"}
EVIDENCE = {"id": "planted", "evidence": "verified", "why": "pass_tokens=48:below trial 7: ...; above trial 8: ...",
            "divergent": [], "probes": [{"probe": "pass_tokens=48", "evidence": "verified", "sides": [
                {"side": "below", "formed": [7], "shown": "trial 7: the target's largest pass held 48 tokens",
                 "not_formed": ""},
                {"side": "above", "formed": [8], "shown": "trial 8: the target's largest pass held 49 tokens",
                 "not_formed": ""}], "divergent": []}]}
SEARCH = {"asked": 4, "run": 4, "hypothesis_seed": 12, "failing_trials": [21], "best": {"packed query length": 39,
          "log2 ULP of the difference": 2.5, "sequences per pass: gap to the nearest seen": 1.0},
          "trial_ids": [20, 21, 22, 23]}
MERGED = {"count": 2, "shards": [
    {"index": 0, "folder": "/tmp/s0", "trials": 3, "invariant_engine_start_s": 0.5, "production_engine_start_s": 0.25,
     "total_s": 2.0},
    {"index": 1, "folder": "/tmp/s1", "trials": 2, "total_s": 1.5}]}
DB = {"path": "/tmp/db", "key": "ab" * 32, "replayed": [50, 51], "saved": 1, "deleted": 1,
      "warnings": ["--db /tmp/db: 1 stored trial dropped"]}

# Each shape a section is written in: (section, value, the model it reads back as; None for `{}`).
SHAPES: list[tuple[str, Any, type | None]] = [
    ("search", {}, None), ("search", SEARCH, SearchRecord),
    ("search", {"asked": 4, "run": 1, "stopped": True}, SearchStopped),
    ("example_db", {}, None), ("example_db", DB, ExampleDbRecord),
    ("example_db", {k: v for k, v in DB.items() if k != "warnings"}, ExampleDbRecord),
    ("shard", {}, None), ("shard", {"index": 1, "count": 2, "schedule_size": 7, "trials": [4, 5, 6]}, ShardSlice),
    ("shard", MERGED, MergedShards),
]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """report.json of a fake-engine run (with the engines' posture), as JSON."""
    tmp = tmp_path_factory.mktemp("sections")
    cfg = {"model": str(write_fake_checkpoint(tmp / "m")), "engine": {"kind": "fake_engine:FakeEngine"},
           "prompts": {"random": {"count": 2, "min_len": 2, "max_len": 4}}, "sampling": {"max_tokens": 2},
           "schedule": {"trials": 4, "seed": 1, "repeat_trials": 2}, "report_dir": str(tmp / "report")}
    assert run(parse_config(cfg)).exit_code() == 0  # as a shard's slice exits: its exit_code reads the same
    return json.loads((tmp / "report" / "report.json").read_text())  # type: ignore[no-any-return]


def _text(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2) + "\n"  # as Report.to_json writes it


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "report.json"
    path.write_text(_text(data))
    return path


def test_the_schema_describes_each_section_by_its_model() -> None:
    schema = report_schema()
    defs = schema["$defs"]
    for name in SECTION_MODELS:
        assert defs[name].get("description"), name
        undescribed = [p for p, s in defs[name]["properties"].items() if not s.get("description")]
        assert not undescribed, f"{name}: {undescribed}"

    def refs(field: str) -> set[str]:
        return {s["$ref"].rsplit("/", 1)[1] for s in schema["properties"][field]["anyOf"]}

    assert refs("search") == {"SearchRecord", "SearchStopped", "Unused"}
    assert refs("example_db") == {"ExampleDbRecord", "Unused"}
    assert refs("shard") == {"ShardSlice", "MergedShards", "Unused"}
    env = defs["Environment"]["properties"]
    assert env["posture"]["$ref"].endswith("/PostureRecord") and env["hazards"]["items"]["$ref"].endswith("/HazardRecord")
    assert defs["PostureRecord"]["properties"]["modes"]["additionalProperties"]["$ref"].endswith("/ModePosture")


def test_a_report_read_and_written_again_keeps_its_bytes(written: dict[str, Any], tmp_path: Path) -> None:
    data = copy.deepcopy(written)
    data["environment"]["hazards"] = [HAZARD]  # after the posture, as a run writes it
    path = _write(tmp_path, data)
    report = load_report(path)
    assert isinstance(report.posture, PostureRecord) and report.posture.modes["invariant"].engine == "fake"
    assert report.hazards == [HazardRecord.model_validate(HAZARD)] and report.hazards[0].cite() == "planted (here)"
    assert report.to_json() == path.read_text()  # the environment's keys in their order, the posture's too


def test_a_posture_with_hazard_evidence_reads_typed_and_writes_back_the_same(written: dict[str, Any],
                                                                            tmp_path: Path) -> None:
    """`environment.posture.hazards` (a run with a matched hazard) reads back typed, keeps its bytes, and stays out
    of the posture's digests; a posture without it (every report before it, a run with no hazard) has no key."""
    assert "hazards" not in written["environment"]["posture"]
    data = copy.deepcopy(written)
    data["environment"]["hazards"] = [HAZARD]
    data["environment"]["posture"]["hazards"] = [EVIDENCE]
    path = _write(tmp_path, data)
    report = load_report(path)
    assert report.posture is not None and report.posture.hazards[0].probes[0].sides[1].formed == [8]
    assert report.posture.digest == written["environment"]["posture"]["digest"]
    assert report.to_json() == path.read_text()


@pytest.mark.parametrize(("section", "value", "model"), SHAPES, ids=[f"{s}-{i}" for i, (s, _, _) in enumerate(SHAPES)])
def test_each_shape_of_a_section_reads_typed_and_writes_back_the_same(written: dict[str, Any], tmp_path: Path,
                                                                      section: str, value: Any,
                                                                      model: type | None) -> None:
    data = {**copy.deepcopy(written), section: value}
    path = _write(tmp_path, data)
    report = load_report(path)
    held = getattr(report, section)
    assert held is None if model is None else isinstance(held, model)
    assert report.to_json() == path.read_text()


def test_an_unused_section_is_written_as_an_empty_object(written: dict[str, Any]) -> None:
    assert (written["search"], written["example_db"], written["shard"]) == ({}, {}, {})


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    *head, last = dotted.split(".")
    node: Any = data
    for key in head:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[last] = value


@pytest.mark.parametrize(("section", "value", "field", "bad", "named"), [
    ("shard", {"index": 0, "count": 2, "schedule_size": 7, "trials": [1]}, "shard.count", "two", "shard.slice.count"),
    ("shard", MERGED, "shard.shards.1.trials", "some", "shard.merged.shards.1.trials"),
    ("search", SEARCH, "search.run", -1, "search.done.run"),
    ("search", {"asked": 4, "run": 1, "stopped": True}, "search.stopped", False, "search.stopped.stopped"),
    ("example_db", DB, "example_db.saved", "many", "example_db.saved"),
    ("environment.hazards", [HAZARD], "environment.hazards.0.match", "maybe", "environment.hazards.0.match"),
    (None, None, "environment.posture.modes.invariant.rank_devices", {"0": "cpu"},
     "environment.posture.modes.invariant.rank_devices"),
    (None, None, "environment.posture.digest", None, "environment.posture.digest"),
])
def test_a_malformed_section_is_refused_on_load_naming_the_field(written: dict[str, Any], tmp_path: Path,
                                                                  section: str | None, value: Any, field: str,
                                                                  bad: Any, named: str) -> None:
    data = copy.deepcopy(written)
    if section is not None:
        _set(data, section, copy.deepcopy(value))
    _set(data, field, bad)
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError, match=rf"{path}: not a report of this oracle version \({named}\b") as e:
        load_report(path)
    assert e.value.exit_code == 2


def test_every_shape_validates_against_the_committed_schema(written: dict[str, Any]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((resources.files("oracle") / "report.schema.json").read_text())
    for section, value, _ in SHAPES:
        jsonschema.validate({**written, section: value}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**written, "shard": {"count": "two", "shards": []}}, schema)
