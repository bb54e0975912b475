"""No import circle inside the oracle package, counting every import the code names.

The graph is built from the source (AST), not from ``sys.modules``: an import inside a function, or one guarded by
``if TYPE_CHECKING:``, is still an edge, because it still ties the two modules together (a reader of either must
know the other, and a move of either breaks the other). Only imports of oracle's own modules count.
"""

from __future__ import annotations

import ast
from pathlib import Path

import oracle

PACKAGE_ROOT = Path(oracle.__file__).parent


def module_name(path: Path, root: Path) -> str:
    """The dotted name of a source file below the package root (``__init__`` names its package)."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_names(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every dotted name this module imports, wherever the import statement sits (module, function, TYPE_CHECKING).

    ``from a import b`` yields both ``a`` and ``a.b`` (b may be a submodule); the caller keeps only real modules.
    """
    names: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph(root: Path = PACKAGE_ROOT) -> dict[str, set[str]]:
    """Module -> the oracle modules it imports: each named module (or the module a name lives in), and the
    packages above it whose ``__init__`` runs first."""
    sources = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for module, path in sources.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets: set[str] = set()
        for name in imported_names(tree, module, path.name == "__init__.py"):
            # The deepest existing module the name points into: `oracle.config.VllmOptions` -> `oracle.config`.
            while name and name not in sources:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
            # Importing `a.b.c` runs package `a.b` first: an edge too, unless the importer lives inside it.
            parent = name.rpartition(".")[0]
            while parent and parent in sources and not (module + ".").startswith(parent + "."):
                targets.add(parent)
                parent = parent.rpartition(".")[0]
        graph[module] = targets
    return graph


def components(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each component (from its first module back to it)."""
    return [circle_through(graph, component) for component in components(graph)]


def circle_through(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One shortest circle from the component's first module back to itself (breadth first inside the component),
    so the failure names a path a reader can follow, not just a bag of modules."""
    members = set(component)
    start = component[0]
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for target in sorted(graph[node] & members):
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if target not in parents:
                    parents[target] = node
                    following.append(target)
        frontier = following
    return component  # unreachable for a strongly connected component


def test_no_import_circle_in_oracle() -> None:
    graph = import_graph()
    found = components(graph)
    assert not found, "import circles in oracle/ (counting function-level and TYPE_CHECKING imports):\n" + "\n".join(
        f"{' -> '.join(circle_through(graph, component))}   (all of: {', '.join(component)})" for component in found)


def test_the_engine_contract_imports_only_the_localized_op_which_imports_nothing_of_oracle() -> None:
    """The contract is the floor every other module stands on (docs/architecture.md): it names no oracle module,
    not even for typing, but `oracle.localized_op`, the answer it passes, which the report holds too; that module
    names none at all. So the capture's types are declared in the contract, and the report loads no engine."""
    graph = import_graph()
    assert graph["oracle.engines.contract"] == {"oracle.localized_op"}
    assert graph["oracle.localized_op"] == set()


def test_the_report_reaches_no_engine() -> None:
    """report.json's model (and so the pytest plugin and the views that load it) imports nothing of the engines,
    counting every import on the way: the localized op it holds comes from `oracle.localized_op`."""
    graph = import_graph()
    seen, todo = set(), ["oracle.report"]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph[module])
    assert not {m for m in seen if m.startswith("oracle.engines")}, sorted(seen)


def test_a_function_level_or_type_only_import_closes_a_circle(tmp_path: Path) -> None:
    """The scanner sees the imports the runtime does not: a lazy import and a TYPE_CHECKING one make a circle."""
    package = tmp_path / "oracle"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from oracle.sub import b\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text("def f():\n    from .. import c\n")
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from oracle.a import thing\n"
    )
    assert cycles(import_graph(package)) == [["oracle.a", "oracle.sub.b", "oracle.c", "oracle.a"]]
    (package / "c.py").write_text("import json\n")
    assert cycles(import_graph(package)) == []


def test_the_front_door_exports_lazily() -> None:
    """`import oracle` loads nothing else of oracle; `oracle.run`, `load_config`, `Config`, `Report` and `Engine` are
    the modules' own objects, imported on first use."""
    import subprocess
    import sys

    code = ("import json, sys, oracle; before = sorted(m for m in sys.modules if m.startswith('oracle')); "
            "from oracle import Config, Engine, Report, load_config, run; "
            "import oracle.config, oracle.engines.contract, oracle.report, oracle.runner; "
            "same = [Config is oracle.config.Config, Engine is oracle.engines.contract.Engine, "
            "Report is oracle.report.Report, load_config is oracle.config.load_config, run is oracle.runner.run]; "
            "print(json.dumps([before, same]))")
    import json

    before, same = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                             check=True).stdout)
    assert before == ["oracle"] and all(same)
