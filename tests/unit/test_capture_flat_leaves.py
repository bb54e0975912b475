"""`flat_leaves`: the capture's walk over an op call's arguments, pytree's leaves in pytree's order, and no tensor
kept alive after the call (the capture's weak maps must see a tensor die when the model drops it)."""

from __future__ import annotations

import collections
import gc
import weakref
from typing import Any

import pytest
import torch
from torch.utils._pytree import tree_flatten

from oracle.capture.copies import flat_leaves

T, U = torch.zeros(2), torch.ones(3)
Pair = collections.namedtuple("Pair", "x y")


@pytest.mark.parametrize("tree", [
    T,
    (T, [U, T], {"out": U, "alpha": 1.5}),
    (1, None, [2, (3,)], {"a": 4, "b": None}, torch.Size([2, 3])),  # torch.Size: pytree's node, walked by it
    ((), [[]], {"x": []}),
    collections.OrderedDict(a=T, b=[U]),
    (Pair(T, [U]), torch.float32, "name"),
], ids=["tensor", "args-and-kwargs", "scalars-and-size", "empty", "ordered-dict", "named-tuple"])
def test_the_leaves_are_pytrees_in_its_order(tree: Any) -> None:
    ours, theirs = flat_leaves(tree), tree_flatten(tree)[0]
    assert len(ours) == len(theirs)
    assert all(a is b for a, b in zip(ours, theirs, strict=True))


def test_a_tensor_dies_with_its_last_reference_not_at_the_next_collection() -> None:
    gc.disable()
    try:
        t = torch.zeros(4)
        alive = weakref.ref(t)
        leaves = flat_leaves(((t, [t]), {"out": t}))
        assert leaves[0] is t
        del leaves, t
        assert alive() is None  # a closure that refers to itself would hold the list, and the tensor, in a cycle
    finally:
        gc.enable()
