"""The package's import graph: no cycles, benchmarks apart from the methods, click only on the command line."""

from __future__ import annotations

import ast
from pathlib import Path

import daskann

ROOT = Path(daskann.__file__).parent
#: the command-line modules: the only ones that may import click and the benchmarks
CLI_MODULES = {
    "daskann.cli",
    "daskann.__main__",
    "daskann._cli_common",
    "daskann.npt.cli",
    "daskann.mgrit.cli",
    "daskann.partition.cli",
    "daskann.plan.cli",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.stmt) -> bool:
    test = getattr(node, "test", None)
    return isinstance(test, (ast.Name, ast.Attribute)) and ast.unparse(test).endswith("TYPE_CHECKING")


def _imports(tree: ast.Module, modules: set[str], *, module_level: bool) -> set[str]:
    """Modules ``tree`` imports: its own statements (``module_level``), or every one.

    ``from x import y`` imports ``x``, or the module ``x.y`` where there is one.
    """
    found, todo = set(), list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = {f"{node.module}.{alias.name}" for alias in node.names}
            found.update(names & modules)
            if names - modules:
                found.add(node.module)
        elif module_level and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        elif not _type_checking(node):
            todo.extend(ast.iter_child_nodes(node))
    return found


def _graph(*, module_level: bool) -> dict[str, set[str]]:
    trees = {_module_name(p): ast.parse(p.read_text()) for p in ROOT.rglob("*.py")}
    return {name: _imports(tree, set(trees), module_level=module_level) - {name} for name, tree in trees.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle among the package's modules, or ``None``."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node], _ = 1, stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if dep not in graph:
                continue
            if state.get(dep) == 1:
                return [*stack[stack.index(dep) :], dep]
            if dep not in state and (found := visit(dep)):
                return found
        state[node], _ = 2, stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycles():
    assert _cycle(_graph(module_level=True)) is None


def test_only_benchmarks_and_the_command_line_import_the_benchmarks():
    graph = _graph(module_level=False)
    importers = {
        name
        for name, deps in graph.items()
        if any(d == "daskann.bench" or d.startswith("daskann.bench.") for d in deps)
    }
    assert importers - CLI_MODULES - {n for n in graph if n.startswith("daskann.bench")} == set()


def test_click_only_on_the_command_line():
    graph = _graph(module_level=False)
    users = {name for name, deps in graph.items() if any(d == "click" or d.startswith("click.") for d in deps)}
    assert users <= CLI_MODULES, sorted(users - CLI_MODULES)


def test_no_import_cycles_through_imports_inside_functions():
    # a cycle kept alive by imports inside functions is still a cycle of the design
    assert _cycle(_graph(module_level=False)) is None
