"""The schedule on the native engine with the default config: what it covers, a fault that needs a
prefix-cache hit fails the required invariance check, and replays of every trial agree with the report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from oracle.cli import main
from oracle.config import parse_config
from oracle.runner import run

ROOT = Path(__file__).resolve().parents[2]


def _tiny(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    data["report_dir"] = str(tmp_path / "report")
    data["schedule"].update(seed=3, **overrides)
    return data


def _with_fault(data: dict[str, Any]) -> dict[str, Any]:
    e = data["engine"]
    options = {k: e[k] for k in ("device", "dtype", "max_num_seqs", "max_num_batched_tokens",
                                 "enable_chunked_prefill", "enable_prefix_caching", "num_threads")}
    data["engine"] = {"kind": "cache_fault:CacheHitFaultEngine", "options": options}
    return data


@pytest.mark.usefixtures("model_cache")
def test_default_config_covers_cache_hits_chunks_and_mixed_passes(tmp_path: Path) -> None:
    report = run(parse_config(_tiny(tmp_path, trials=30)))
    assert report.check("invariance").verdict == "pass"  # type: ignore[union-attr]
    cov = report.coverage
    assert cov["trials run"] == 30 == len(report.schedule)
    for condition in ("target shared a pass", "target prompt hit the prefix cache", "mixed prefill+decode pass",
                      "decode-only shared pass", "shared pass with a chunked prompt",
                      "filler shares the target's prefix",
                      "target first in batch", "target last in batch", "target in the middle of the batch"):
        assert cov[condition] > 0, condition
    assert cov["target KV length > 64 in a shared pass"] == 0  # tiny prompts: reported, not claimed


@pytest.mark.usefixtures("model_cache")
def test_fault_that_needs_a_cache_hit_fails_invariance_and_replays_agree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = run(parse_config(_with_fault(_tiny(tmp_path, trials=30, max_shrink_runs=40))))
    inv = report.check("invariance")
    assert inv is not None and inv.verdict == "fail" and report.exit_code() == 1
    recs = [d for d in report.divergences if d.check == "invariance"]
    assert recs and all(d.cause in ("batch", "prefix_cache") and d.step == 0 for d in recs)
    assert all(d.evidence["num_cached_tokens"] > 0 for d in recs)
    hit = {t.trial_id for t in report.schedule if any(f.shared_prefix >= 16 for f in t.fillers)}
    assert {d.trial_id for d in recs if not d.shrunk} <= hit
    # Replays start from a cold cache as the run did: diverging trials diverge again, the rest do not
    # (a replay that ran the solo reference into a warm cache would see a hit in every trial).
    path = str(tmp_path / "report" / "report.json")
    clean = [t.trial_id for t in report.schedule if t.trial_id not in {d.trial_id for d in recs}][:3]
    for trial_id in sorted({d.trial_id for d in recs})[:3] + clean:
        code = main(["replay", path, "--trial", str(trial_id), "--trust-report"])
        out = capsys.readouterr().out
        assert ("same as the report" in out) if code == 1 else ("no divergence" in out and "report had" not in out)
