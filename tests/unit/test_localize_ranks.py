"""The rule across tensor-parallel ranks (oracle.capture.ranks), on hand-made captures of two ranks.

Each rank's pass: the token input, o_proj's partial (`aten.mm`), the all-reduce of the partials, a KV write of
its result (the output the change must reach). Rows are one float at position 5.
"""

from __future__ import annotations

import torch

from oracle.capture import Captured, Grid, OpCall, PassLayout
from oracle.capture.ranks import localize_ranks
from oracle.engines.contract import Completion

O_PROJ = "model.layers.0.self_attn.o_proj"
KEYS = (("", "input", 0), (O_PROJ, "aten.mm.default", 0), (O_PROJ, "oracle_vllm.all_reduce.default", 0),
        ("model.layers.0.self_attn", "aten.index_put_.default", 0))
LAYOUT = (PassLayout(0, 0, (Grid((4,), ((1,),), (5,)),), {}),)
SOLO, TRIAL = Completion("t", [1], [0.0]), Completion("t", [1], [0.5])


def _rank(values: tuple[float, float, float, float], completion: Completion, input_overwritten: bool = False
          ) -> Captured:
    calls = []
    for i, (key, v) in enumerate(zip(KEYS, values, strict=True)):
        rows = torch.tensor([[v]])
        calls.append(OpCall(i, 0, key, (5,), rows, (4, 1), (KEYS[i - 1],) if i else (),
                            "kv_write" if i == 3 else "out",
                            overwritten_by=KEYS[2] if (i == 0 and input_overwritten) else None))
    return Captured(tuple(calls), LAYOUT, completion)


SAME = (1.0, 2.0, 3.0, 3.0)


def test_an_all_reduce_that_moved_in_one_rank_alone_is_named_in_that_rank() -> None:
    found = localize_ranks([_rank(SAME, SOLO), _rank(SAME, SOLO)],
                           [_rank(SAME, TRIAL), _rank((1.0, 2.0, 3.5, 3.5), TRIAL)])
    op = found.finding.op
    assert found.rank == 1 and op is not None and op.rank == 1
    assert (op.op, op.op_class, op.status, op.inputs_equal) == ("oracle_vllm.all_reduce.default", "communication",
                                                                 "localized", True)


def test_the_first_root_in_execution_order_wins_across_ranks() -> None:
    found = localize_ranks([_rank(SAME, SOLO), _rank(SAME, SOLO)],
                           [_rank((1.0, 2.5, 3.5, 3.5), TRIAL), _rank((1.0, 2.0, 3.5, 3.5), TRIAL)])
    op = found.finding.op
    assert found.rank == 0 and op is not None and (op.op, op.op_class) == ("aten.mm.default", "matmul")
    assert "rank 1 too" not in op.note  # rank 1's mm did not change


def test_an_all_reduce_fed_by_another_ranks_change_is_passed_over_never_named() -> None:
    """Rank 1's all-reduce moved with its own inputs equal, but rank 0's partial had moved (from an input that is
    no root): the all-reduce only passed that on, so no op is named and the answer is inconclusive, saying so."""
    moved0 = _rank((1.5, 2.5, 3.5, 3.5), TRIAL, input_overwritten=True)
    found = localize_ranks([_rank(SAME, SOLO, True), _rank(SAME, SOLO)],
                           [moved0, _rank((1.0, 2.0, 3.5, 3.5), TRIAL)])
    op = found.finding.op
    assert found.rank is None and op is not None and op.status == "inconclusive"
    assert "rank 1's model.layers.0.self_attn.o_proj oracle_vllm.all_reduce.default" in op.note
    assert "inputs in rank 0 had changed" in op.note


def test_nothing_moved_names_nothing() -> None:
    found = localize_ranks([_rank(SAME, SOLO), _rank(SAME, SOLO)], [_rank(SAME, SOLO), _rank(SAME, SOLO)])
    assert found.rank is None and found.finding.op is None
