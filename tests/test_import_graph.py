"""No import circles among the project's modules.

The graph is built from the source with ``ast`` (nothing is imported): every
``.py`` under ``vllm_continuum_plugin/``, ``estimators/``, ``connectors/`` and
``benchmarks/``, named as installed (``pyproject.toml``'s ``package-dir`` maps
the top-level ``estimators/``, ``connectors/`` and ``benchmarks/`` to
``vllm_continuum_plugin.estimators`` / ``.connectors`` / ``.benchmarks``).
Relative imports are resolved; ``from pkg import name`` points at
``pkg.name`` when that is a module of the project, else at ``pkg``.

Two graphs:

* the load-time graph: module-level imports only, those that run when the
  module is first imported. Imports inside a function run later; those under
  ``if TYPE_CHECKING:`` never run, nor do those under
  ``if __name__ == "__main__":`` when the module is imported. A ``try:`` or
  another ``if`` at module level counts (its imports may run). It must have
  no circle at all.
* the full graph: every import statement, wherever it is (what a reader
  follows). Its circles must be among ``KNOWN_DEFERRED_CIRCLES``, each with
  the change that removes it; a new one fails.

A circle fails a test with the modules in order, each with the line of the
import that leads to the next.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOP = "vllm_continuum_plugin"

# folder in the repository -> package name once installed (pyproject.toml)
PACKAGE_DIRS = {
    "vllm_continuum_plugin": TOP,
    "estimators": f"{TOP}.estimators",
    "connectors": f"{TOP}.connectors",
    "benchmarks": f"{TOP}.benchmarks",
}

# Circles that only deferred imports (inside functions, under TYPE_CHECKING
# or ``__main__``) close, each as the set of its modules (short names, under
# TOP) with the change that removes it. Remove an entry once that is done.
KNOWN_DEFERRED_CIRCLES: dict[frozenset[str], str] = {
}


def project_modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is_package) for every project source file."""
    modules: dict[str, tuple[Path, bool]] = {}
    for folder, package in PACKAGE_DIRS.items():
        root = REPO / folder
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if "__pycache__" in parts:
                continue
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            modules[".".join([package, *parts])] = (path, is_package)
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _is_main_guard(test: ast.expr) -> bool:
    """``if __name__ == "__main__":`` runs only when the file is the script."""
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and len(test.comparators) == 1
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "__main__"
    )


def load_time_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported: not inside a def, not
    under ``if TYPE_CHECKING:`` (its ``else:`` branch does run), not under
    ``if __name__ == "__main__":``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(stmts: list[ast.stmt]) -> None:
        for node in stmts:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.append(node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            elif isinstance(node, ast.If):
                if not (_is_type_checking(node.test) or _is_main_guard(node.test)):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.ClassDef):
                visit(node.body)
            else:  # try / with / for / while / match at module level
                for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                    for sub in getattr(node, field, None) or []:
                        if isinstance(sub, ast.stmt):
                            visit([sub])
                        elif isinstance(sub, (ast.ExceptHandler, ast.match_case)):
                            visit(sub.body)

    visit(tree.body)
    return found


def all_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(deferred: bool = False) -> dict[str, dict[str, int]]:
    """module -> {imported project module: line of the (first) import};
    load-time imports only unless ``deferred``."""
    modules = project_modules()
    collect = all_imports if deferred else load_time_imports
    graph: dict[str, dict[str, int]] = {}
    for name, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges: dict[str, int] = {}
        for node in collect(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _resolve(name, is_package, node)
                targets = []
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
            for target in targets:
                # `import a.b.c` runs a.b.c: the deepest module of the project
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(components)


def shortest_cycle(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """A shortest closed path through the component's first module."""
    members = set(component)
    start = component[0]
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w not in members:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return list(reversed(path)) + [start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{component} is not a cycle")


def find_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module."""
    return [shortest_cycle(graph, c) for c in strongly_connected(graph)]


def describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    modules = project_modules()
    lines = []
    for a, b in zip(cycle, cycle[1:]):
        path = modules[a][0].relative_to(REPO)
        lines.append(f"  {a} ({path}:{graph[a][b]}) -> {b}")
    return "\n".join(lines)


def _short(module: str) -> str:
    return module.removeprefix(TOP + ".")


def test_graph_sees_the_project():
    graph = import_graph()
    # the package-dir mapping is followed: relative imports into the
    # top-level folders resolve to real files
    assert f"{TOP}.estimators.parser" in graph
    assert f"{TOP}.connectors.kv_offload" in graph
    assert f"{TOP}.benchmarks.workload" in graph
    assert f"{TOP}.estimators.parser" in graph[f"{TOP}.estimators.features"]
    assert f"{TOP}.estimators.context_predictor" in graph[f"{TOP}.benchmarks.decision_cost"]
    assert len(graph) > 50


def test_cycle_finder_reports_a_circle():
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b": 1}, "b": {}}) == []


def test_deferred_imports_do_not_count_at_load_time():
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "import os\n"
        "if TYPE_CHECKING:\n    import a\nelse:\n    import b\n"
        "try:\n    import c\nexcept ImportError:\n    import d\n"
        "def f():\n    import e\n"
        "class K:\n    import g\n    def m(self):\n        import h\n"
        "if __name__ == '__main__':\n    import i\n"
    )
    names = [a.name for n in load_time_imports(tree) if isinstance(n, ast.Import) for a in n.names]
    assert names == ["os", "b", "c", "d", "g"]
    every = [a.name for n in all_imports(tree) if isinstance(n, ast.Import) for a in n.names]
    assert sorted(every) == ["a", "b", "c", "d", "e", "g", "h", "i", "os"]


def test_no_import_circles_at_load_time():
    graph = import_graph()
    cycles = find_cycles(graph)
    if cycles:
        text = "\n\n".join(describe(c, graph) for c in cycles)
        pytest.fail(f"import circles among the project's modules:\n{text}")


def test_no_new_circles_through_deferred_imports():
    graph = import_graph(deferred=True)
    new = []
    for component in strongly_connected(graph):
        names = frozenset(_short(m) for m in component)
        if not any(names <= known for known in KNOWN_DEFERRED_CIRCLES):
            new.append(describe(shortest_cycle(graph, component), graph))
    if new:
        text = "\n\n".join(new)
        pytest.fail(
            "import circles closed by imports inside functions / under TYPE_CHECKING "
            f"(move the shared names into a leaf module):\n{text}"
        )


def test_benchmarks_do_not_import_the_tests():
    """Nothing under benchmarks/ reaches into tests/ (e.g. tests/harness.py
    through sys.path): the in-process engine rig is benchmarks/engine_rig.py,
    which tests/harness.py re-exports."""
    offenders = []
    for path in sorted((REPO / "benchmarks").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for node in all_imports(ast.parse(text)):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                names = [node.module or ""] if node.level == 0 else []
            for n in names:
                if n.split(".")[0] in ("harness", "tests", "conftest"):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno} imports {n}")
        if '"tests"' in text or "'tests'" in text:
            offenders.append(f"{path.relative_to(REPO)} names the tests/ folder")
    assert not offenders, "\n".join(offenders)
