"""Nothing outside an engine's own modules switches on an engine kind's name: what oracle knows about a kind is its
row (oracle.engines.kinds), resolved once per run (the plan's `engine`), and read from there.

The scan reads the source (AST): a comparison (`==`, `!=`, `in`, `not in`) of anything with a built-in kind's name,
or a literal set, tuple or list of them compared against or kept under a name, is a switch on the name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import oracle
from oracle.engines.kinds import BUILTIN

ROOT = Path(oracle.__file__).parent
# An engine's own modules: the rows, the adapters and their options models.
OWN = ("engines/", "engine_options.py")
# Switches left outside an engine's own modules: none. A described engine whose posture follows from oracle's code
# is filled by the name it gives itself (`oracle.posture.FROM_CODE`), vLLM's mode environment by its options model.
LEFT: dict[str, int] = {}


def _names(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Set, ast.Tuple, ast.List)):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args \
            and node.func.id in ("frozenset", "set", "tuple", "list"):  # frozenset({...})
        return _names(node.args[0])
    return set()


def switches(source: str) -> list[int]:
    """Lines that compare a value with a built-in engine kind's name, or name a collection of kind names (a set
    to test membership in later)."""
    found = []
    kinds = set(BUILTIN)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                 for op in node.ops):
            if any(_names(side) & kinds for side in (node.left, *node.comparators)):
                found.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None \
                and not isinstance(node.value, ast.Constant) and _names(node.value) & kinds:
            found.append(node.lineno)
    return found


def test_no_module_outside_an_engines_own_switches_on_its_name() -> None:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(OWN):
            continue
        lines = switches(path.read_text(encoding="utf-8"))
        if lines:
            found[rel] = len(lines)
    assert found == LEFT, "a switch on an engine kind's name: make it a field of the kind's row (EngineKind)"


def test_the_scan_sees_a_switch() -> None:
    assert switches('if cfg.kind in {"vllm", "openai"}:\n    pass\n') == [1]
    assert switches('x = kind != "openai"\n') == [1]
    assert switches('DEVICE_UNUSED = frozenset({"vllm"})\nok = k in DEVICE_UNUSED\n') == [1]
    assert switches('x = mode == "invariant"\n') == []
