"""The package's modules import each other without cycles.

The graph is built statically from the source (``ast``, no import is run): every
``import`` and ``from ... import`` of a ``rheo_flow`` module, at module level or
inside a function or under ``if TYPE_CHECKING:``, is an edge. A type-only import
never runs, but it still couples the two modules both ways: a cycle through one
means the layers are not what the tree says. ``from package import name`` is an edge
to the submodule when ``name`` is one, else to the package. Importing a module also
runs the ``__init__`` of every package above it, so those are edges too, except the
packages above the importing module itself (they are already being imported when it
runs).

A cycle that only closes through a function-level import still couples the two
modules both ways; moving the import into the function only defers the failure.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "rheo_flow"


@dataclass(frozen=True)
class Import:
    """One edge of the graph: where the import is, whether it runs at import time,
    and whether it is only for the type checker."""

    target: str
    line: int
    in_function: bool
    type_only: bool = False

    def describe(self) -> str:
        where = ", in a function" if self.in_function else ""
        return f"line {self.line}{where}{', type-only' if self.type_only else ''}"


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imports(tree: ast.AST, in_function: bool = False, type_only: bool = False
             ) -> Iterator[tuple[ast.stmt, bool, bool]]:
    """Every import statement below ``tree``, with whether it is in a function and
    whether it is under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, in_function, type_only
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for stmt in node.body:
                yield from _imports(ast.Module(body=[stmt], type_ignores=[]), in_function, True)
            for stmt in node.orelse:  # ``else:`` of ``if TYPE_CHECKING:`` runs
                yield from _imports(ast.Module(body=[stmt], type_ignores=[]), in_function,
                                    type_only)
        else:
            nested = in_function or isinstance(
                node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            yield from _imports(node, nested, type_only)


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph(root: Path = PACKAGE) -> dict[str, list[Import]]:
    """The import edges of every module of the package (to its own modules), type-only
    ones included."""
    known = modules(root)
    graph: dict[str, list[Import]] = {name: [] for name in known}
    for name, path in known.items():
        is_package = path.name == "__init__.py"
        package = name if is_package else name.rpartition(".")[0]
        already = {name, *_ancestors(name)}
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, in_function, type_only in _imports(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                assert isinstance(node, ast.ImportFrom)
                if node.level:
                    base = package.split(".")
                    if node.level > 1:
                        base = base[: -(node.level - 1)]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                for alias in node.names:
                    child = f"{source}.{alias.name}"
                    targets.append(child if child in known else source)
            for target in targets:
                while target and target not in known:  # ``import a.b.name`` or outside
                    target = target.rpartition(".")[0]
                if not target:
                    continue
                for module in [*_ancestors(target), target]:
                    if module in known and module not in already:
                        graph[name].append(Import(module, node.lineno, in_function,
                                                  type_only))
    return graph


def components(graph: dict[str, list[Import]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or of a module
    importing itself), found with Tarjan's algorithm: every module of one imports
    every other, directly or not."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:  # the package is small: recursion is fine
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for edge in graph[node]:
            if edge.target not in index:
                visit(edge.target)
                low[node] = min(low[node], low[edge.target])
            elif edge.target in on_stack:
                low[node] = min(low[node], index[edge.target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or any(e.target == node for e in graph[node]):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def cycles(graph: dict[str, list[Import]]) -> list[list[str]]:
    """One shortest cycle through each component of :func:`components`."""
    return [_shortest_cycle(graph, component) for component in components(graph)]


def _shortest_cycle(graph: dict[str, list[Import]], component: list[str]) -> list[str]:
    members = set(component)
    best: list[str] = []
    for start in component:
        paths = {start: [start]}
        frontier = [start]
        found: list[str] = []
        while frontier and not found:
            following = []
            for node in frontier:
                for edge in graph[node]:
                    if edge.target == start:
                        found = [*paths[node], start]
                        break
                    if edge.target in members and edge.target not in paths:
                        paths[edge.target] = [*paths[node], edge.target]
                        following.append(edge.target)
                if found:
                    break
            frontier = following
        if found and (not best or len(found) < len(best)):
            best = found
    return best


def describe(graph: dict[str, list[Import]], cycle: list[str]) -> str:
    """The cycle, one edge a line, each with the lines of its imports."""
    text = cycle[0]
    for source, target in pairwise(cycle):
        where = ", ".join(dict.fromkeys(e.describe() for e in graph[source]
                                        if e.target == target))
        text += f"\n    -> {target} ({source} {where})"
    return text


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph()
    report = []
    for component in components(graph):
        cycle = _shortest_cycle(graph, component)
        others = sorted(set(component) - set(cycle))
        report.append(describe(graph, cycle)
                      + (f"\n    (the cycle also takes in {', '.join(others)})" if others else ""))
    assert not report, "import cycles:\n" + "\n".join(report)


def test_the_graph_sees_what_a_cycle_is_made_of(tmp_path: Path) -> None:
    # The checker itself: relative and absolute imports, function-level imports,
    # ``from package import module``, package __init__ edges, TYPE_CHECKING blocks.
    pkg = tmp_path / "rheo_flow"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from ._a import A\n",
        "_a.py": "from . import _b\nA = 1\n",
        "_b.py": "def f():\n    from rheo_flow._a import A\n    return A\n",
        "_c.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                  "    from ._d import D\nelse:\n    import os\n"),
        "_d.py": "from ._c import os\nD = 1\n",
        "sub/__init__.py": "from .._e import E\n",
        "sub/_x.py": "X = 1\n",
        "_e.py": "E = 1\n",
        "_f.py": "from .sub._x import X\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = import_graph(pkg)
    assert [(e.target, e.in_function) for e in graph["rheo_flow._b"]] == [
        ("rheo_flow._a", True)]
    assert [e.target for e in graph["rheo_flow._a"]] == ["rheo_flow._b"]
    assert [(e.target, e.type_only) for e in graph["rheo_flow._c"]] == [("rheo_flow._d", True)]
    assert [e.target for e in graph["rheo_flow._f"]] == ["rheo_flow.sub", "rheo_flow.sub._x"]
    assert [e.target for e in graph["rheo_flow.sub"]] == ["rheo_flow._e"]
    assert cycles(graph) == [["rheo_flow._a", "rheo_flow._b", "rheo_flow._a"],
                             ["rheo_flow._c", "rheo_flow._d", "rheo_flow._c"]]
    assert "line 2, in a function" in describe(graph, cycles(graph)[0])
    assert "line 3, type-only" in describe(graph, cycles(graph)[1])
