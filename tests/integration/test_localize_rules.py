"""The localization rule on real native runs with planted one-op faults: each names the op it must,
or nothing; a fresh allocation is never named; a difference nothing reads is never named; the
named op is confirmed alone and handed over as a runnable repro/."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from planted import PlantedEngine
from planted_ops import planted_decoder

from oracle.compare import first_divergence
from oracle.config import EngineConfig
from oracle.engines.contract import Request, SamplingParams
from oracle.engines.native import NativeEngine
from oracle.engines.native.model import Decoder
from oracle.localize import RunSpec, localize_runs, localize_trial

SAMPLING = SamplingParams(max_tokens=4, logits="full")
RNG = random.Random(5)
TARGET = tuple(RNG.randrange(512) for _ in range(24))
FILLERS = [tuple(RNG.randrange(512) for _ in range(n)) for n in (30, 12, 20)]
NORM1 = "model.layers.1.post_attention_layernorm"
ALLOCATORS = ("empty", "new_empty", "resize_")


def target() -> Request:
    return Request("target", TARGET, SAMPLING)


def trial() -> list[Request]:
    return [target()] + [Request(f"f{i}", p, SamplingParams(max_tokens=3, logits="none"))
                         for i, p in enumerate(FILLERS)]


@pytest.fixture(scope="module")
def base(tiny_qwen3: Path) -> Decoder:
    return NativeEngine(tiny_qwen3, "invariant").decoder


def engine(base: Decoder, **fault: object) -> NativeEngine:
    return NativeEngine(planted_decoder(base, **fault), "invariant", EngineConfig.of("native", num_threads=1))


def test_an_op_that_writes_its_out_argument_after_a_fresh_allocation(base: Decoder, tmp_path: Path) -> None:
    eng = engine(base, fault="norm_out", module=NORM1, min_tokens=40)
    assert first_divergence(eng.generate([target()])[0], eng.generate(trial())[0]) is not None
    loc = localize_trial(eng, [target()], trial(), 0, repro_dir=tmp_path / "repro")
    assert loc is not None, "a diverging trial must be localized"
    # The op that wrote the buffer, never the `empty_like` that made it.
    assert (loc.module, loc.op, loc.layer, loc.kind) == (NORM1, "planted.rms_norm_out.default", 1, "write")
    assert loc.status == "localized" and loc.inputs_equal is True and loc.forward_pass == 0
    assert loc.op_class == "norm" and loc.confirmation == "confirmed", loc.confirm_note
    assert loc.depends_on["rows"] == [len(TARGET), len(TARGET) + sum(map(len, FILLERS))]
    # The repro runs alone (torch and the package that registers the op) and shows the difference.
    repro = Path(loc.repro or "")
    assert {p.name for p in repro.iterdir()} >= {"repro.py", "op.json", "expected.safetensors", "actual.safetensors"}
    spec = json.loads((repro / "op.json").read_text())
    assert spec["op"] == "planted.rms_norm_out.default" and spec["actual"]["result"] == "arg:out"
    spec["imports"] = ["planted_ops"]
    (repro / "op.json").write_text(json.dumps(spec))
    support = str(Path(__file__).parents[1] / "support")
    done = subprocess.run([sys.executable, str(repro / "repro.py")], capture_output=True, text=True,
                          env={"PYTHONPATH": support, "PATH": ""}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "1 of 1" not in done.stdout and f"of {len(loc.positions)} target rows differ, max 1 ULP" in done.stdout


def test_a_buffer_written_while_it_held_no_value_is_not_an_input(base: Decoder) -> None:
    """vLLM's `_C.onednn_mm(c, a, ...)` writes `c`, fresh from `torch.empty`: its garbage is not an input, so
    the op is confirmed, never `inconclusive` because its "input" c differed."""
    eng = engine(base, fault="norm_into", module=NORM1, min_tokens=40)
    loc = localize_trial(eng, [target()], trial(), 0)
    assert loc is not None
    assert (loc.module, loc.op, loc.kind) == (NORM1, "planted.rms_norm_into.default", "write")
    assert loc.status == "localized" and loc.confirmation == "confirmed", loc.confirm_note


def test_the_old_contents_of_a_fresh_written_argument_are_not_compared() -> None:
    from oracle.capture import Grid, PassLayout
    from oracle.capture.confirm import row_inputs_differ
    from oracle.capture.rows import Snapshot

    layout = PassLayout(0, 0, (Grid((4,), ((1,),), (5,)),), {})
    func = torch.ops.planted.rms_norm_into.default
    x, w = torch.ones(4, 8), torch.ones(8)

    def snap(garbage: float, fresh: frozenset[str]) -> Snapshot:
        return Snapshot(func, (torch.full((4, 8), garbage), x, w, 1e-6, 40), {}, "arg:c", layout, 1, fresh)

    assert row_inputs_differ(snap(0.0, frozenset()), snap(7.0, frozenset()), [5]) == ["c"]  # read, by its name
    assert row_inputs_differ(snap(0.0, frozenset({"c"})), snap(7.0, frozenset({"c"})), [5]) == []
    # Fresh in one call only: the other read a value there, so it still counts as a differing input.
    assert row_inputs_differ(snap(0.0, frozenset({"c"})), snap(7.0, frozenset()), [5]) == ["c"]


def test_a_difference_overwritten_before_it_is_read_is_not_named(base: Decoder) -> None:
    eng = engine(base, fault="overwritten", module=NORM1, min_tokens=40)
    # Nothing reaches the output: the trial does not diverge, and no op is named.
    assert first_divergence(eng.generate([target()])[0], eng.generate(trial())[0]) is None
    assert localize_trial(eng, [target()], trial(), 0) is None


def test_an_overwritten_difference_is_skipped_for_the_real_cause_downstream(base: Decoder) -> None:
    overwritten = planted_decoder(base, fault="overwritten", module="model.layers.0.input_layernorm", min_tokens=40)
    eng = PlantedEngine(overwritten, "invariant", num_threads=1, min_tokens=40)  # + the mm of layer 1's down_proj
    loc = localize_trial(eng, [target()], trial(), 0)
    assert loc is not None
    assert (loc.module, loc.op) == ("model.layers.1.mlp.down_proj", "aten.mm.default")
    assert "planted.noisy_copy.default" in loc.note and "overwritten" in loc.note


def test_a_kv_cache_write_is_named_not_the_attention_that_reads_it(base: Decoder) -> None:
    eng = engine(base, fault="kv_write", layer=0, min_tokens=40)
    loc = localize_trial(eng, [target()], trial(), 0)
    assert loc is not None
    assert (loc.module, loc.op, loc.kind) == ("model.layers.0.self_attn", "planted.kv_write.default", "kv_write")
    assert loc.op_class == "kv-cache write" and loc.forward_pass == 0


def test_kv_inherited_through_the_prefix_cache_is_the_finding(base: Decoder) -> None:
    # The warm-up run writes the prompt's first blocks beside other requests (a perturbed KV write);
    # the warm run reads them from the cache: the cache is the finding, not the attention reading it.
    eng = NativeEngine(planted_decoder(base, fault="kv_write", layer=0, min_tokens=40), "invariant",
                       EngineConfig.of("native", num_threads=1, enable_prefix_caching=True))
    cold = RunSpec((target(),), 0)
    warm = RunSpec((target(),), 0, warm_with=tuple(trial()))
    loc = localize_runs(eng, cold, warm)
    assert loc is not None and loc.status == "kv_state", loc
    assert loc.kind == "kv_read" and loc.layer == 0 and min(loc.positions) == 0
    assert "prefix-cache" in loc.note


def test_no_allocation_op_is_ever_named(base: Decoder) -> None:
    faults = [dict(fault="norm_out", module=NORM1), dict(fault="norm_out", module="model.layers.0.input_layernorm"),
              dict(fault="kv_write", layer=1)]
    for fault in faults:
        loc = localize_trial(engine(base, min_tokens=40, **fault), [target()], trial(), 0)
        assert loc is not None, fault
        assert not any(a in loc.op.split(".")[1] for a in ALLOCATORS), (fault, loc.op)


def test_controls_name_nothing(base: Decoder) -> None:
    for fault in ("norm_out", "kv_write", "overwritten"):
        quiet = engine(base, fault=fault, module=NORM1, min_tokens=10_000)
        assert localize_trial(quiet, [target()], trial(), 0) is None, fault


def test_a_difference_made_after_the_last_captured_op_is_said_so(base: Decoder) -> None:
    class LateFault(NativeEngine):
        """Moves the target's first logprob after the model ran (a post-processing bug)."""

        def generate(self, requests, max_num_batched_tokens=None):  # type: ignore[no-untyped-def]
            out = super().generate(requests, max_num_batched_tokens)
            if len(requests) > 1:
                out[0].logprobs[0] += 1e-3
            return out

    eng = LateFault(base, "invariant", EngineConfig.of("native", num_threads=1))
    loc = localize_trial(eng, [target()], trial(), 0)
    assert loc is not None and loc.status == "after_capture"
    assert "after the model" in loc.note and loc.op and loc.op_class == "other"  # the last op that agreed is named
    # ... in the pass that made the moved step (step 0: the prefill's logits), never a later pass's KV read.
    assert (loc.module, loc.op, loc.kind) == ("lm_head", "aten.mm.default", "out"), loc.describe()
    assert loc.forward_pass == 0 and loc.engine_step == 0 and loc.positions == (len(TARGET) - 1,)
