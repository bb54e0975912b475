"""Confirmation re-runs the named op as the engine ran it, and repro/ runs it anywhere: planted faults of each kind.

A pass-keyed fault (a dispatch layer that moves an op's output only inside a big pass) must come back
`not reproduced alone`: run alone on the same inputs, in the engine's kernel mode, the op agrees with
itself. An input-keyed fault (the op's own kernel picks another reduction split by M) must come back
`confirmed`. Either way the verdict comes from a comparison, and repro.py says the same by its exit
code (0 reproduces, 1 rows agree, 2 could not run).
"""

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

from oracle.config import EngineConfig
from oracle.engines.contract import Request, SamplingParams
from oracle.engines.native import NativeEngine
from oracle.engines.native.model import Decoder
from oracle.localize import LocalizedOp, localize_trial

SAMPLING = SamplingParams(max_tokens=4, logits="full")
RNG = random.Random(5)
TARGET = tuple(RNG.randrange(512) for _ in range(24))
FILLERS = [tuple(RNG.randrange(512) for _ in range(n)) for n in (30, 12, 20)]
SUPPORT = str(Path(__file__).parents[1] / "support")


def target() -> Request:
    return Request("target", TARGET, SAMPLING)


def trial(arrival_step: int = 0) -> list[Request]:
    return [target()] + [Request(f"f{i}", p, SamplingParams(max_tokens=3, logits="none"), arrival_step=arrival_step)
                         for i, p in enumerate(FILLERS)]


@pytest.fixture(scope="module")
def base(tiny_qwen3: Path) -> Decoder:
    return NativeEngine(tiny_qwen3, "invariant").decoder


def repro(loc: LocalizedOp) -> subprocess.CompletedProcess[str]:
    """Run the written repro.py in a fresh interpreter, as a kernel engineer would."""
    assert loc.repro, loc.confirm_note
    return subprocess.run([sys.executable, str(Path(loc.repro) / "repro.py")], capture_output=True, text=True,
                          env={"PYTHONPATH": SUPPORT, "PATH": ""}, timeout=300)


PASS_KEYED = [  # (module, op, min_tokens, ulps): moved only inside a pass of more tokens (or logits rows) than that
    ("model.layers.1.mlp.down_proj", "aten.mm.default", 30, 1),
    ("model.layers.1.post_attention_layernorm", "aten.mean.dim", 30, 64),  # the norm's reduction
    ("lm_head", "aten.mm.default", 1, 1),  # the logits of a pass that samples for more than one sequence
]


@pytest.mark.parametrize(("module", "op", "min_tokens", "ulps"), PASS_KEYED, ids=["matmul", "norm", "logits"])
def test_a_pass_keyed_fault_is_not_reproduced_alone(base: Decoder, tmp_path: Path, module: str, op: str,
                                                    min_tokens: int, ulps: int) -> None:
    eng = PlantedEngine(base, "invariant", fault_module=module, fault_op=op, min_tokens=min_tokens, ulps=ulps,
                        num_threads=1)
    loc = localize_trial(eng, [target()], trial(), 0, repro_dir=tmp_path / "repro")
    assert loc is not None and (loc.module, loc.op, loc.status) == (module, op, "localized"), loc
    # Alone, in the engine's kernel mode (oracle_kernels on), the op gives the trial's inputs the solo run's bits.
    assert loc.confirmation == "not reproduced alone", loc.confirm_note
    assert "solo run's bits" in loc.confirm_note and "oracle_kernels" in loc.confirm_note
    spec = json.loads((Path(loc.repro or "") / "op.json").read_text())
    assert spec["state"]["oracle_kernels"] is True and spec["state"]["threads"] == 1
    done = repro(loc)
    assert done.returncode == 1, (done.stdout, done.stderr)  # the rows agree: the repro says so
    assert f"0 of {len(loc.positions)} target rows differ" in done.stdout and "oracle_kernels on" in done.stdout


def test_an_input_keyed_kernel_is_confirmed(base: Decoder, tmp_path: Path) -> None:
    """`planted::rms_norm_split` splits each row's reduction in two at M >= 2: the solo decode (M = 1) and the
    trial's (M = 4) differ by the op's own kernel, so alone on the two inputs it moves the same way."""
    module = "model.layers.1.post_attention_layernorm"
    eng = NativeEngine(planted_decoder(base, fault="norm_split", module=module), "invariant",
                       EngineConfig.of("native", num_threads=1))
    loc = localize_trial(eng, [target()], trial(), 0, repro_dir=tmp_path / "repro")
    assert loc is not None and (loc.module, loc.op) == (module, "planted.rms_norm_split.default"), loc
    # The prefills (M >= 2 alone and batched) agree; a decode (M = 1 alone, 4 batched) is where it moves.
    assert len(loc.positions) == 1 and loc.positions[0] >= len(TARGET)
    assert loc.pass_evidence["target_is_prefill"] is False and loc.pass_evidence["num_seqs"] > 1
    assert loc.confirmation == "confirmed", loc.confirm_note
    assert "the engine's bits for both" in loc.confirm_note
    spec = json.loads((Path(loc.repro or "") / "op.json").read_text())
    assert "planted_ops" in spec["imports"]  # the module that registers the op, found by the writer
    done = repro(loc)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "1 of 1 target rows differ" in done.stdout


def test_an_attention_fault_is_compared_on_the_real_query(base: Decoder, tmp_path: Path) -> None:
    """A decode beside three prefills: q holds 63 tokens, more than the highest block id. The query must be
    copied whole (never taken for a paged cache) and the target's row compared."""
    attn = "model.layers.0.self_attn.attn"
    eng = PlantedEngine(base, "invariant", fault_module=attn, fault_op="oracle_kernels.paged_attention.default",
                        min_tokens=40, num_threads=1)
    loc = localize_trial(eng, [target()], trial(arrival_step=2), 0, repro_dir=tmp_path / "repro")
    assert loc is not None and (loc.module, loc.op) == (attn, "oracle_kernels.paged_attention.default"), loc
    assert loc.pass_evidence["num_tokens"] > 40
    assert loc.confirmation == "not reproduced alone", loc.confirm_note
    assert "solo run's bits" in loc.confirm_note
    spec = json.loads((Path(loc.repro or "") / "op.json").read_text())
    assert spec["actual"]["tensors"]["arg0"]["shape"][0] == loc.pass_evidence["num_tokens"]  # q, whole
    done = repro(loc)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "0 of 1 target rows differ" in done.stdout


def test_a_query_longer_than_the_block_table_is_not_a_paged_cache() -> None:
    from oracle.capture.copies import clone_inputs

    q = torch.randn(36, 4, 16)  # [T, Hq, D]: 36 tokens, block ids up to 6
    k_cache, v_cache = torch.randn(7, 16, 2, 16), torch.randn(7, 16, 2, 16)
    table = torch.tensor([[4, 5, 6]], dtype=torch.int32)
    args, _ = clone_inputs(torch.ops.oracle_kernels.paged_attention.default,
                           (q, k_cache, v_cache, table, torch.tensor([36], dtype=torch.int32),
                            torch.tensor([0, 36], dtype=torch.int32), 0.25, 1), {})
    assert torch.equal(args[0], q)
    assert args[1].shape == (3, 16, 2, 16) and torch.equal(args[1], k_cache[4:7]) and torch.equal(args[2], v_cache[4:7])
    assert args[3].tolist() == [[0, 1, 2]]


def test_a_one_token_kv_write_is_named_and_its_slots_compared(base: Decoder, tmp_path: Path) -> None:
    """The target's decode (one token) shares a pass with three prefills; its key-cache write `index_put_` is
    perturbed there. `cache.view(-1, H, D)[slots] = k` writes k.view(H, D): the write must still be seen."""
    eng = PlantedEngine(base, "invariant", fault_module="model.layers.0.self_attn",
                        fault_op="aten.index_put_.default", min_tokens=40, num_threads=1)
    loc = localize_trial(eng, [target()], trial(arrival_step=2), 0, repro_dir=tmp_path / "repro")
    assert loc is not None
    assert (loc.module, loc.op, loc.kind, loc.status) == (
        "model.layers.0.self_attn", "aten.index_put_.default", "kv_write", "localized"), loc.describe()
    assert loc.op_class == "kv-cache write" and loc.pass_evidence["target_num_tokens"] == 1
    # The planted fault is the pass's, not the write's: alone, the target's own slot gets the solo bits.
    assert loc.confirmation == "not reproduced alone", loc.confirm_note
    spec = json.loads((Path(loc.repro or "") / "op.json").read_text())
    assert spec["kind"] == "kv_write" and len(spec["actual"]["grid"]["slots"]) == 1
    done = repro(loc)
    assert done.returncode == 1, (done.stdout, done.stderr)


def test_a_repro_that_cannot_run_exits_2_with_one_line(base: Decoder, tmp_path: Path) -> None:
    eng = PlantedEngine(base, "invariant", min_tokens=30, num_threads=1)
    loc = localize_trial(eng, [target()], trial(), 0, repro_dir=tmp_path / "repro")
    assert loc is not None and loc.repro
    op_json = Path(loc.repro) / "op.json"
    spec = json.loads(op_json.read_text())
    op_json.write_text(json.dumps({**spec, "op": "planted.no_such_op.default"}))
    done = repro(loc)
    assert done.returncode == 2 and done.stderr.startswith("repro: could not run:"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    op_json.write_text(json.dumps({**spec, "standalone": False, "why_not_standalone": "a handle"}))
    done = repro(loc)
    assert done.returncode == 2 and "cannot run standalone: a handle" in done.stderr
