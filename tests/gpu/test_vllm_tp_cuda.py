"""vLLM at tensor_parallel_size 2 on two CUDA GPUs (configs/vllm-gpu-tp2.yaml): the custom all-reduce
against NCCL (vLLM #50136), read from the ranks and crossed by the hazard's probes.

Needs two CUDA devices and vLLM: `pytest -m gpu tests/gpu/test_vllm_tp_cuda.py`.

NOT YET RUN ON GPUs: these tests were written and their logic tested on the CPU path only (vLLM CPU at TP 2,
tests/integration/test_vllm_tp_localize.py, which CI runs, shares `tp_reduction`'s assertions); until they have
run on two cards, a pass or a failure here is their first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="tensor_parallel_size 2 needs two CUDA devices"),
]
pytest.importorskip("vllm")

from tp_reduction import assert_every_failure_names_the_all_reduce  # noqa: E402

from oracle.config import load_config  # noqa: E402
from oracle.report_sections import ModePosture  # noqa: E402
from oracle.runner import run  # noqa: E402

CONFIG = Path(__file__).parents[2] / "configs" / "vllm-gpu-tp2.yaml"
HAZARD = "vllm-custom-all-reduce"


def _run(model: Path, out: Path, localize: str = "first", **engine_args: object) -> object:
    config = load_config(CONFIG)
    checks = config.checks.model_copy(update={"invariance": config.checks.invariance.model_copy(
        update={"localize": localize})})
    config = config.model_copy(update={"checks": checks})
    options = {**config.engine.options, "engine_args": engine_args} if engine_args else config.engine.options
    config = config.model_copy(update={"model": str(model),
                                       "engine": config.engine.model_copy(update={"options": options})})
    return run(config, report_dir=out)


def _checked_posture(report: Any) -> ModePosture:
    """What every TP 2 run must show, whatever its verdict: two ranks on two devices and the all-reduce
    they run, read from them; the hazard matched exactly where a rank runs the custom all-reduce."""
    posture: ModePosture = report.posture.modes["invariant"]
    assert posture.tensor_parallel == 2
    assert len(posture.rank_devices) == 2 and all(str(d).startswith("cuda") for d in posture.rank_devices)
    assert posture.all_reduce != "unknown"
    cited = {h.id: h for h in report.hazards}
    if "custom" in str(posture.all_reduce):
        assert cited[HAZARD].match == "matches"
    else:
        assert HAZARD not in cited or cited[HAZARD].match != "matches"
    return posture


def _localized_or_said_why(report: object) -> None:
    """The first failing trial names an op, or says `inconclusive` and why (at TP > 1 vLLM's ranks are not
    captured yet: the note says so), never nothing."""
    failed = [d for d in report.divergences if d.check == "invariance"]  # type: ignore[attr-defined]
    assert failed
    op = next((d.localized_op for d in failed if d.localized_op is not None), None)
    assert op is not None, "no failing trial was localized"
    assert op.status != "inconclusive" or op.note


def test_tp2_with_the_custom_all_reduce_gives_a_decided_verdict_across_the_threshold(small_qwen3: Path,
                                                                                     tmp_path: Path) -> None:
    report = _run(small_qwen3, tmp_path / "custom")
    assert report.error is None, report.error  # type: ignore[attr-defined]
    posture = _checked_posture(report)
    invariance = report.check("invariance")  # type: ignore[attr-defined]
    assert invariance is not None and invariance.verdict in ("pass", "fail"), invariance.message
    if "custom" in str(posture.all_reduce):  # the hazard's probes put trials on both sides of 8 MiB
        probes = {h.id: h for h in report.hazard_probes}  # type: ignore[attr-defined]
        assert probes[HAZARD].crossed_by, probes[HAZARD].untested
    if invariance.verdict == "fail":
        _localized_or_said_why(report)
    parity = report.check("tp_parity")  # type: ignore[attr-defined]
    assert parity is not None and parity.verdict in ("pass", "fail") and parity.evidence["compared_with"] == 1


def test_tp2_without_the_custom_all_reduce_passes_or_names_what_still_diverges(small_qwen3: Path,
                                                                               tmp_path: Path) -> None:
    report = _run(small_qwen3, tmp_path / "nccl", disable_custom_all_reduce=True)
    assert report.error is None, report.error  # type: ignore[attr-defined]
    posture = _checked_posture(report)
    assert "custom" not in str(posture.all_reduce)
    invariance = report.check("invariance")  # type: ignore[attr-defined]
    assert invariance is not None and invariance.verdict in ("pass", "fail"), invariance.message
    if invariance.verdict == "fail":
        _localized_or_said_why(report)


def test_where_the_custom_all_reduce_and_nccl_differ_the_named_op_is_the_all_reduce(small_qwen3: Path,
                                                                                      tmp_path: Path) -> None:
    """With the custom all-reduce, passes on both sides of its hand-over size take different all-reduce paths
    (custom below, NCCL above): where invariance fails for it, every failing trial (`localize: all`) is named at
    an all-reduce, class communication, with a truthful confirmation; and tp_parity's op, where TP 2 and TP 1
    differ, is named where they part. Not yet run on GPUs (module docstring)."""
    report = _run(small_qwen3, tmp_path / "paths", localize="all")
    assert report.error is None, report.error  # type: ignore[attr-defined]
    posture = _checked_posture(report)
    if "custom" not in str(posture.all_reduce):
        pytest.skip(f"the ranks run {posture.all_reduce}, not the custom all-reduce: the two paths cannot differ")
    invariance = report.check("invariance")  # type: ignore[attr-defined]
    assert invariance is not None and invariance.verdict in ("pass", "fail"), invariance.message
    if invariance.verdict == "fail":
        assert_every_failure_names_the_all_reduce([d.model_dump() for d in report.divergences])  # type: ignore[attr-defined]
    parity = report.check("tp_parity")  # type: ignore[attr-defined]
    assert parity is not None
    if parity.verdict == "fail":
        op = parity.evidence.get("localized_op")
        assert op is not None or parity.evidence.get("localize_note"), parity.message
