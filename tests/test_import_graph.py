"""The package's import graph: no cycles, benchmarks apart from the methods, click only on the command line.

Packages load their names on first use, so ``import daskann`` loads nothing heavy, and the command line's help
and argument errors load neither dask nor scikit-learn, xarray or zarr: on a login node's shared file system
those imports take seconds to tens of seconds. What loads is counted, never timed.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import daskann
from daskann._methods import METHODS

ROOT = Path(daskann.__file__).parent
#: the command-line modules: the only ones that may import click and the benchmarks
CLI_MODULES = {
    "daskann.cli",
    "daskann.__main__",
    "daskann._cli_common",
    *(module for method in METHODS for module in method.command_modules),
    "daskann.plan.cli",
}
#: packages whose names load on first use (daskann._attach)
LAZY_PACKAGES = ("daskann", *(method.package for method in METHODS if method.package), "daskann.plan")
#: what importing a lazy package, or the command line's help or argument errors, must not load
HEAVY = ("dask", "distributed", "pandas", "scipy", "sklearn", "xarray", "zarr")
#: command lines answered from the options alone: help pages, and errors of click or of a flag's own check
LIGHT_COMMAND_LINES = [
    ["--help"],
    ["--version"],
    *[[group, "--help"] for group in ("train", "bench", "plan", "verify", "demo")],
    *[["train", method.name, "--help"] for method in METHODS],
    *[["bench", method.name, "--help"] for method in METHODS if method.bench_command],
    ["no-such-command"],
    ["train", "npt", "--bogus"],
    ["train", "npt", "--grid", "2y2"],
    ["train", "npt", "--mode", "fast"],
    ["train", "mgrit", "--preset", "solver9"],
    ["train", "partition", "--combine", "max"],
    ["train", "serial", "--dataset", "imagenet"],
    ["train", "serial", "--hidden", "8,x"],
    ["plan", "--method", "everything"],
]
#: `python -m daskann` with the arguments given after the probe
_RUN_DASKANN = "import runpy; sys.argv[0] = 'daskann'; runpy.run_module('daskann', run_name='__main__', alter_sys=True)"


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


def _loaded_by(tmp_path, code: str, *args: str) -> tuple[list[str], subprocess.CompletedProcess]:
    """The heavy modules ``code`` loads in a fresh interpreter, counted as it exits, and its process."""
    listing = tmp_path / "modules.json"
    probe = (
        "import atexit, json, sys\n"
        f"atexit.register(lambda: open({str(listing)!r}, 'w').write(json.dumps(sorted(sys.modules))))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe + code, *args], capture_output=True, text=True, timeout=120)
    modules = json.loads(listing.read_text())
    return [m for m in modules if m.split(".")[0] in HEAVY], result


def _type_checking_names(package: str) -> dict[str, str]:
    """``name -> module`` of the imports under ``if TYPE_CHECKING:`` in ``package``'s ``__init__``."""
    tree = ast.parse(Path(importlib.util.find_spec(package).origin).read_text())
    names = {}
    for node in tree.body:
        if isinstance(node, ast.If) and _type_checking(node):
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom):
                    names.update({alias.asname or alias.name: f"{stmt.module}:{alias.name}" for alias in stmt.names})
    return names


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_importing_a_package_loads_nothing_heavy(tmp_path, package):
    heavy, result = _loaded_by(tmp_path, f"import {package}")
    assert result.returncode == 0, result.stderr
    assert heavy == [], f"import {package} loads {heavy}"


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_lazy_names_are_the_type_checkers_names(package):
    module = importlib.import_module(package)
    declared = _type_checking_names(package)
    assert sorted(dir(module)) == sorted(declared)
    assert set(module.__all__) <= set(declared)
    for name, source in declared.items():
        source_module, attribute = source.split(":")
        if source_module == package:  # `from daskann import config`: a submodule offered as an attribute
            expected = importlib.import_module(f"{package}.{attribute}")
        else:
            expected = getattr(importlib.import_module(source_module), attribute)
        assert getattr(module, name) is expected, name
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        module.not_a_name  # noqa: B018


def test_using_a_name_registers_the_settings(tmp_path):
    code = "import daskann, dask; daskann.MLP; print(dask.config.get('daskann.npt.poll-interval'))"
    _, result = _loaded_by(tmp_path, code)
    assert result.returncode == 0 and result.stdout.split() == ["500ms"], result.stderr
    _, result = _loaded_by(tmp_path, "import dask, daskann; print(dask.config.get('daskann.npt.poll-interval'))")
    assert result.returncode == 0 and result.stdout.split() == ["500ms"], result.stderr


def _module_level_closure(graph: dict[str, set[str]], name: str) -> set[str]:
    """Every module that importing ``name`` loads: module-level imports, and their packages', transitively."""
    seen, todo = set(), [name]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            parts = module.split(".")
            todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # a package's __init__ runs first
            todo += graph.get(module, ())
    return seen


@pytest.mark.parametrize("module", sorted(CLI_MODULES))
def test_command_line_modules_import_nothing_heavy_at_module_level(module):
    # the commands import what they run inside their functions; this names the import that broke that
    graph = _graph(module_level=True)
    heavy = sorted(m for m in _module_level_closure(graph, module) if m.split(".")[0] in HEAVY)
    assert heavy == [], f"importing {module} loads {heavy}"


@pytest.mark.parametrize("args", LIGHT_COMMAND_LINES, ids=" ".join)
def test_help_and_argument_errors_load_nothing_heavy(tmp_path, args):
    heavy, result = _loaded_by(tmp_path, _RUN_DASKANN, *args)
    if "--help" in args or "--version" in args:
        assert result.returncode == 0 and result.stdout.strip(), result.stderr
    else:
        assert result.returncode in (1, 2) and "Error: " in result.stderr, (result.returncode, result.stderr)
        assert "Traceback" not in result.stderr
    assert heavy == [], f"daskann {' '.join(args)} loads {heavy}"
