"""The comparison half of localization on hand-made captures: order, alignment, ULPs, the root-cause rule."""

from __future__ import annotations

from collections.abc import Callable

import torch

from oracle.capture import Captured, Grid, LocalizedOp, OpCall, PassLayout, RowCapture, localize_captured
from oracle.engines.contract import Completion

DONE = Completion("t", [1], [0.0])


def first_differing_op(expected: Captured, actual: Captured) -> LocalizedOp | None:
    return localize_captured(expected, actual).op


def row_capture(module_path: Callable[[], str]) -> RowCapture:
    capture = RowCapture()
    capture.module_path = module_path
    return capture


def call(index: int, key: tuple[str, str, int], positions: tuple[int, ...], rows: list[list[float]],
         inputs: tuple[tuple[str, str, int], ...] = (), forward_pass: int = 0) -> OpCall:
    t = torch.tensor(rows, dtype=torch.float32)
    return OpCall(index, forward_pass, key, positions, t, tuple(t.shape), inputs)


def captured(*calls: OpCall, passes: int = 1) -> Captured:
    layouts = tuple(PassLayout(i, 10 + i, (), {"num_seqs": 3, "num_tokens": 7, "target_is_prefill": i == 0})
                    for i in range(passes))
    return Captured(calls, layouts, DONE)


X = ("model.layers.0.mlp.up_proj", "aten.mm.default", 0)
Y = ("model.layers.2.mlp.down_proj", "aten.mm.default", 0)


def test_rows_align_by_position_across_different_chunking() -> None:
    # Expected: positions 0-2 in one call; actual: chunked as [0, 1] then [2], each with its own rows.
    expected = captured(call(0, X, (0, 1, 2), [[1.0], [2.0], [3.0]]))
    same = captured(call(0, X, (0, 1), [[1.0], [2.0]]), call(1, X, (2,), [[3.0]], forward_pass=1), passes=2)
    assert first_differing_op(expected, same) is None
    moved = captured(call(0, X, (0, 1), [[1.0], [2.0]]), call(1, X, (2,), [[3.0000002]], forward_pass=1), passes=2)
    loc = first_differing_op(expected, moved)
    assert loc is not None and loc.positions == (2,) and loc.forward_pass == 1 and loc.engine_step == 11
    assert loc.ulp == 1 and loc.layer == 0


def test_first_in_execution_order_wins_and_inputs_are_checked() -> None:
    expected = captured(call(0, X, (0,), [[1.0, 2.0]]), call(1, Y, (0,), [[5.0]], inputs=(X,)))
    actual = captured(call(0, X, (0,), [[1.0, 2.0]]), call(1, Y, (0,), [[5.5]], inputs=(X,)))
    loc = first_differing_op(expected, actual)
    assert loc is not None and (loc.module, loc.layer) == ("model.layers.2.mlp.down_proj", 2)
    assert loc.inputs_equal is True and loc.max_abs_diff == 0.5
    assert loc.ulp == (1 << 20)  # 5.0 -> 5.5 in float32: 0.5 / 2**-21
    both = captured(call(0, X, (0,), [[1.0, 9.0]]), call(1, Y, (0,), [[5.5]], inputs=(X,)))
    first = first_differing_op(expected, both)
    assert first is not None and first.module == "model.layers.0.mlp.up_proj"


def test_an_input_without_captured_rows_leaves_the_rule_unchecked() -> None:
    expected = captured(call(0, X, (0,), [[1.0]]), call(1, Y, (0,), [[5.0]], inputs=(X,)))
    actual = captured(call(0, X, (0,), [[1.0]]), call(1, Y, (0,), [[5.5]], inputs=(X, ("", "input", 0))))
    loc = first_differing_op(expected, actual)
    assert loc is not None and loc.inputs_equal is None  # the second input was never captured


def test_negative_zero_differs_bitwise() -> None:
    loc = first_differing_op(captured(call(0, X, (0,), [[0.0]])), captured(call(0, X, (0,), [[-0.0]])))
    assert loc is not None and loc.ulp == 0 and loc.max_abs_diff == 0.0


def test_describe_and_json_round_trip() -> None:
    loc = LocalizedOp("model.layers.1.mlp.down_proj", "aten.mm.default", 1, 3, 2, (24, 25, 26, 30), (86, 64), 1,
                      2.4e-7, True, {"num_seqs": 4, "num_tokens": 86, "target_is_prefill": False}, eager=True,
                      still_diverged=False)
    line = loc.describe()
    assert line.startswith("model.layers.1.mlp.down_proj aten.mm.default (layer 1) at pass 3, step 2")
    assert "positions 24-26, 30" in line and "1 ULP" in line and "inputs equal" in line
    assert "decode" in line and "num_seqs 4" in line and "rerun eager (no longer diverged)" in line
    assert LocalizedOp.from_json(loc.to_json()) == loc
    assert loc.to_json()["positions"] == [24, 25, 26, 30]


def test_capture_keeps_only_the_targets_rows_of_token_aligned_outputs() -> None:
    # A pass of 5 flattened tokens; the target holds rows 2-3 at positions 7-8.
    path = ["model.layers.0.mlp.up_proj"]
    capture = row_capture(lambda: path[-1])
    ids = torch.arange(5)
    weight = torch.randn(5, 5)  # as many rows as tokens, but not derived from the tokens
    layout = PassLayout(0, 0, (Grid((5,), ((2,), (3,)), (7, 8)),), {})
    with capture.forward_pass(layout, (ids,)):
        h = torch.nn.functional.embedding(ids, torch.randn(11, 4))  # [5, 4]
        y = h.view(5, 2, 2).sum(-1)  # the view passes identity on; sum is recorded
        weight.t()  # never captured: no token rows in its inputs
    keys = [c.key for c in capture.calls]
    assert keys == [("", "input", 0), ("model.layers.0.mlp.up_proj", "aten.embedding.default", 0),
                    ("model.layers.0.mlp.up_proj", "aten.sum.dim_IntList", 0)]
    assert capture.calls[2].positions == (7, 8)
    assert torch.equal(capture.calls[2].rows, y[2:4])
    assert capture.calls[2].inputs == (("model.layers.0.mlp.up_proj", "aten.embedding.default", 0),)


@torch.library.custom_op("oracle_test::write_rows", mutates_args=("out",))
def _write_rows(x: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(x * 2)


def test_an_op_that_writes_its_output_argument_is_captured() -> None:
    # vLLM's attention writes into a preallocated `output` and returns nothing.
    capture = row_capture(lambda: "model.layers.0.self_attn.attn")
    capture.enter = ("oracle_test",)
    ids = torch.arange(4)
    layout = PassLayout(0, 0, (Grid((4,), ((1,),), (5,)),), {})
    with capture.forward_pass(layout, (ids,)):
        x = ids.to(torch.float32)  # [4], recorded
        out = torch.empty(4)
        _write_rows(x, out)
    # The wrapper returns nothing, so it is entered: the ops inside it are captured one level deeper.
    assert [c.key[1] for c in capture.calls] == ["input", "aten._to_copy.default", "aten.mul.Tensor",
                                                 "aten.copy_.default", "oracle_test.write_rows.default"]
    inner, outer = capture.calls[3], capture.calls[4]
    assert (inner.depth, inner.within, inner.kind) == (1, "oracle_test.write_rows.default", "write")
    assert (outer.depth, outer.kind) == (0, "write") and outer.rows.tolist() == [2.0]
    assert inner.key in outer.inputs  # what the wrapper wrote came from the ops inside it


def test_vllm_rows_are_found_by_position_and_token() -> None:
    from oracle.engines.vllm_capture import pass_layout, rows_of
    from oracle.engines.vllm_tap import PassContext, Scheduled

    # A pass of a decode (request a at position 7) then a 3-token prefill chunk (request b, positions 4-6).
    positions, ids = [7, 4, 5, 6], [70, 40, 50, 60]
    assert rows_of(positions, ids, 4, 3, [0, 0, 0, 0, 40, 50, 60]) == [1]
    assert rows_of(positions, ids, 4, 3, [0, 0, 0, 0, 41, 50, 60]) == []
    now = {"a": Scheduled(2, 4, False, True, 7, 1, num_new_tokens=1),
           "b": Scheduled(2, 4, True, True, 4, 0, num_new_tokens=3)}
    ctx = PassContext(9, "b", now, {"a": (0,) * 7 + (70,), "b": (0, 0, 0, 0, 40, 50, 60)}, None, True)
    layout = pass_layout(ctx, 3, {"positions": torch.tensor(positions), "input_ids": torch.tensor(ids)})
    assert layout.engine_step == 9 and layout.forward_pass == 3
    tokens, logits = layout.grids
    assert tokens.shape == (4,) and tokens.rows == ((1,), (2,), (3,)) and tokens.positions == (4, 5, 6)
    assert logits.shape == (2,) and logits.rows == ((1,),) and logits.positions == (6,)  # b's rows come second
    assert layout.evidence["num_prefill_tokens"] == 3 and layout.evidence["num_decode_tokens"] == 1


def _kv(index: int, kind: str, positions: tuple[int, ...], rows: list[list[float]], forward_pass: int) -> OpCall:
    key = ("model.layers.0.self_attn", "aten.index_put_.default" if kind == "kv_write" else "attn<kv:k_cache>", 0)
    t = torch.tensor(rows, dtype=torch.float32)
    return OpCall(index, forward_pass, key, positions, t, tuple(t.shape), (("", "input", 0),), kind)


def _two_passes(prompt: tuple[int, ...]) -> tuple[PassLayout, ...]:
    return (PassLayout(0, 0, (Grid((8,), tuple((i,) for i in range(len(prompt))), prompt),), {}),
            PassLayout(1, 1, (Grid((4,), ((0,),), (len(prompt),)),), {}))


def test_a_cache_the_target_wrote_itself_is_never_kv_state() -> None:
    """Pass 0 writes positions 0-2 with equal bits; pass 1 reads position 1 back other: the cache moved where
    the capture did not see (a lost write), not through another request: inconclusive, never kv_state."""
    layouts = _two_passes((0, 1, 2))
    rows = [[1.0], [2.0], [3.0]]
    expected = Captured((_kv(0, "kv_write", (0, 1, 2), rows, 0), _kv(1, "kv_read", (0, 1, 2, 3), rows + [[4.0]], 1)),
                        layouts, DONE)
    moved = [[1.0], [2.5], [3.0], [4.0]]
    actual = Captured((_kv(0, "kv_write", (0, 1, 2), rows, 0), _kv(1, "kv_read", (0, 1, 2, 3), moved, 1)),
                      layouts, Completion("t", [2], [0.0]))
    loc = localize_captured(expected, actual).op
    assert loc is not None and loc.status == "inconclusive", loc
    assert loc.positions == (1,) and "wrote positions 1 itself" in loc.note
    # Positions it never computed (another request's blocks, a prefix-cache hit) are the cache's finding.
    warm = (PassLayout(0, 0, (Grid((8,), ((0,),), (2,)),), {}), layouts[1])
    expected = Captured((_kv(1, "kv_read", (0, 1, 2, 3), rows + [[4.0]], 1),), warm, DONE)
    actual = Captured((_kv(1, "kv_read", (0, 1, 2, 3), moved, 1),), warm, Completion("t", [2], [0.0]))
    loc = localize_captured(expected, actual).op
    assert loc is not None and loc.status == "kv_state" and loc.positions == (1,) and "prefix-cache" in loc.note


def test_the_state_an_op_ran_in_is_put_back_for_its_rerun_and_restored() -> None:
    from dataclasses import replace

    import oracle_kernels

    from oracle.capture.state import OpState, applied

    state = OpState(oracle_kernels=True, threads=1, float32_matmul_precision="highest",
                    deterministic_algorithms=False)
    before = (oracle_kernels.is_enabled(), torch.get_num_threads())
    with applied(state):
        assert oracle_kernels.is_enabled() and torch.get_num_threads() == 1
    assert (oracle_kernels.is_enabled(), torch.get_num_threads()) == before
    with oracle_kernels.batch_invariant():  # an engine in invariant mode: a production op is re-run without them
        with applied(replace(state, oracle_kernels=False)):
            assert not oracle_kernels.is_enabled()
        assert oracle_kernels.is_enabled()
    assert OpState.from_json(state.to_json()) == state
