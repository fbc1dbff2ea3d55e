"""The import graph of predictor/, search_spaces/ and orchestrator/, read from the source (ast, nothing imported).

Layering: `predictor` ← `search_spaces` ← `orchestrator`, and only orchestrator imports Ray
(docs/architecture.md), type-checking imports included. No import cycle among project modules, counting
the imports inside functions too, because a lazy import that closes a cycle is one a later refactor turns
into a crash at import time; and none with the `if TYPE_CHECKING:` blocks counted, because a module that needs
another's types to be read is tied to it as much as one that runs it (a reader goes round the circle either way).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("predictor", "search_spaces", "orchestrator")
# The packages above each one, which it never imports.
ABOVE = {"predictor": ("search_spaces", "orchestrator"), "search_spaces": ("orchestrator",), "orchestrator": ()}
# predictor's rooms, lowest first: each imports only rooms before it (docs/architecture.md).
ROOMS = ("spec", "plan", "graph", "costs", "memory", "frameworks", "kernels", "measure", "models", "data")
# The one module above its room: the resolver resolves a spec with the framework registry and the measured device.
ABOVE_ITS_ROOM = {"predictor.spec.resolver"}


def _module_files() -> dict[str, Path]:
    """Every project module by its dotted name (a package by its own name, for its __init__.py)."""
    files = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


MODULES = _module_files()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(node: ast.AST, type_checking: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement at any depth, functions included; the bodies of `if TYPE_CHECKING:` only with
    `type_checking`."""
    if not type_checking and isinstance(node, ast.If) and _is_type_checking(node.test):
        for child in node.orelse:
            yield from _import_nodes(child, type_checking)
        return
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    for child in ast.iter_child_nodes(node):
        yield from _import_nodes(child, type_checking)


def _imported_names(module: str, type_checking: bool) -> set[str]:
    """The dotted names `module` imports, `from a import b` giving a.b where that is a module, else a."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in _import_nodes(ast.parse(path.read_text(), str(path)), type_checking):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join(anchor + ([base] if base else []))
        names.add(base)
        names.update(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES)
    return names


IMPORTS = {module: _imported_names(module, type_checking=False) for module in MODULES}  # what runs
NAMED = {module: _imported_names(module, type_checking=True) for module in MODULES}  # what runs or types name


def _project_module(name: str) -> str | None:
    """The project module an imported name runs: itself, or the nearest enclosing one (a.b.Thing → a.b)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _graph(imports: dict[str, set[str]] = IMPORTS) -> dict[str, set[str]]:
    """Project module → the project modules its `imports` run, with the packages above each one, except the
    importer's own packages, which are already being imported when it runs."""
    graph = {}
    for module, names in imports.items():
        own = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
        edges = set()
        for name in names:
            target = _project_module(name)
            while target:
                if target != module and target not in own:
                    edges.add(target)
                target = _project_module(target.rpartition(".")[0])
        graph[module] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: every module of one
    lies on a cycle with every other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def _cycle_path(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest path first → … → first inside `component` (breadth-first), to show how the cycle closes."""
    start, members = component[0], set(component)
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for succ in sorted(graph[node] & members):
                if succ == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if succ not in parents:
                    parents[succ] = node
                    following.append(succ)
        frontier = following
    raise AssertionError(f"{component} is no strongly connected component")


def test_lower_packages_never_import_higher_ones_and_only_the_orchestrator_imports_ray():
    wrong = []  # a higher package named for type checking only still ties the lower one to it
    for module in sorted(MODULES):
        names = _imported_names(module, type_checking=True)
        package = module.split(".")[0]
        for name in sorted(names):
            top = name.split(".")[0]
            if top in ABOVE[package] or (top == "ray" and package != "orchestrator"):
                wrong.append(f"{module} imports {name}")
    assert not wrong, "layering predictor <- search_spaces <- orchestrator (Ray in orchestrator only) broken:\n" + (
        "\n".join(wrong))


def test_predictor_rooms_import_only_the_rooms_before_them():
    graph, wrong = _graph(NAMED), []
    for module in sorted(m for m in MODULES if m.count(".") >= 2 and m.split(".")[1] in ROOMS):
        if module in ABOVE_ITS_ROOM:
            continue
        room = ROOMS.index(module.split(".")[1])
        for target in sorted(graph[module]):
            parts = target.split(".")
            if parts[0] == "predictor" and len(parts) > 1 and parts[1] in ROOMS and ROOMS.index(parts[1]) > room:
                wrong.append(f"{module} imports {target}")
    assert not wrong, f"predictor's rooms import downward ({' <- '.join(ROOMS)}):\n" + "\n".join(wrong)


def test_project_modules_import_each_other_without_a_cycle():
    graph = _graph()
    cycles = [f"{', '.join(c)}: {' -> '.join(_cycle_path(graph, c))}" for c in _cycles(graph)]
    assert not cycles, "modules that import each other (lazy imports count):\n" + "\n".join(cycles)


def test_no_cycle_either_with_the_imports_type_checking_names():
    graph = _graph(NAMED)
    cycles = [f"{', '.join(c)}: {' -> '.join(_cycle_path(graph, c))}" for c in _cycles(graph)]
    assert not cycles, "modules that name each other (TYPE_CHECKING imports count):\n" + "\n".join(cycles)


def test_the_graph_reader_sees_lazy_imports_and_skips_type_checking_blocks():
    # predictor.spec.resolver measures a cpu lazily (inside get_device): that edge must be in the graph
    assert "predictor.measure.device" in _graph()["predictor.spec.resolver"]
    # the launch writers name the resolved value's protocol only; frameworks.base names the spec type for checking
    assert "predictor.spec.workload" not in _graph()["predictor.frameworks.base"]
    assert "predictor.spec.workload" in _graph(NAMED)["predictor.frameworks.base"]
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\nelse:\n    import b\n"
                     "def f():\n    import c\n")
    assert {alias.name for node in _import_nodes(tree, False) for alias in node.names} == {"TYPE_CHECKING", "b", "c"}
    assert len(list(_import_nodes(tree, True))) == 4
    graph = {"a": {"b"}, "b": {"c", "a"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]] and _cycle_path(graph, ["a", "b", "c"]) == ["a", "b", "a"]
