"""The package layout: imports run one way, with no cycle, and light paths stay light.

Reads every module's imports with ``ast`` over the whole tree (module level, inside
functions, methods and ``if`` blocks), including relative imports and
``importlib.import_module("promptdistill...")`` calls, so a new import that breaks the
layering, or closes a cycle (a lazy import inside a function too), fails here, naming the
module, the line and the import. Cycles are checked between modules (run-time imports)
and between packages (every import). A package under promptdistill/ must be in the table:
one missing from it fails rather than go unchecked, and so does a table entry for a
package that no longer exists.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "promptdistill"

# Each package may import itself and the packages listed (promptdistill.X -> allowed X's).
# The order is the pipeline's: core -> specs, engine -> judges -> evaluate -> search ->
# distill, ttft, load -> optimize -> pipeline -> flows, cli (docs/architecture.md). The
# registry needs only core and the one render function; the client only the registry.
ALLOWED = {
    "core": set(),
    "specs": {"core"},
    "engine": {"core"},
    "registry": {"core", "specs"},
    "judges": {"core", "specs", "engine"},
    "evaluate": {"core", "specs", "engine", "judges"},
    "search": {"core", "specs", "engine", "judges", "evaluate"},
    "distill": {"core", "specs", "engine", "judges", "evaluate", "search"},
    "ttft": {"core", "specs", "engine"},
    # Load measurement sends templates as services do (the client's request path).
    "load": {"core", "specs", "engine", "search", "ttft", "registry", "client"},
    "optimize": {"core", "specs", "engine", "judges", "evaluate", "search", "ttft", "load"},
    "pipeline": {"core", "specs", "engine", "judges", "evaluate", "search", "distill", "ttft", "load", "optimize",
                 "registry"},
    "flows": {"core", "specs", "engine", "judges", "evaluate", "search", "distill", "ttft", "load", "optimize",
              "registry", "pipeline"},
    "cli": {"core", "specs", "engine", "judges", "evaluate", "search", "distill", "ttft", "load", "optimize",
            "registry", "pipeline", "flows", "client"},
    "client": {"core", "specs", "registry"},
    "__init__": {"client"},  # the package root: re-exports the client's Templates
    "__main__": {"cli"},  # python -m promptdistill
}


@functools.cache
def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in ROOT.rglob("*.py")}


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and ast.unparse(test).endswith("TYPE_CHECKING")


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _dynamic_target(node: ast.AST) -> str | None:
    """``importlib.import_module("promptdistill.x")`` / ``import_module(f"promptdistill.x.{name}")``
    / ``__import__("promptdistill.x")``: the module named, or for an f-string the package
    its constant prefix names (the part before its last dot)."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if called not in ("import_module", "__import__"):
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        prefix = str(arg.values[0].value)
        return prefix.rsplit(".", 1)[0] if "." in prefix else None
    return None


def _imports_in(source: str, module: str, *, is_package: bool = False,
                run_time_only: bool = False) -> list[tuple[str, int]]:
    """Every ``promptdistill`` import in ``source`` (the text of ``module``), at any depth.

    Every node of the tree is visited (as ``ast.walk`` does), so imports inside functions,
    methods, classes and ``try``/``if`` blocks count. ``from promptdistill.pkg import name``
    counts as importing ``promptdistill.pkg.name`` as well when that is a module; relative
    imports are resolved against ``module`` (a package's ``__init__`` when ``is_package``).
    ``run_time_only`` leaves out ``if TYPE_CHECKING:`` blocks.
    """
    modules = _modules()
    here = module.split(".") if is_package else module.split(".")[:-1]
    found: list[tuple[str, int]] = []
    todo: list[ast.AST] = [ast.parse(source)]
    while todo:
        node = todo.pop()
        if run_time_only and _type_checking(node):
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - (node.level - 1)] if node.level - 1 <= len(here) else []
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target:
                found.append((target, node.lineno))
                found += [(f"{target}.{a.name}", node.lineno) for a in node.names if f"{target}.{a.name}" in modules]
        elif isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif (dynamic := _dynamic_target(node)) is not None:
            found.append((dynamic, node.lineno))
        todo.extend(ast.iter_child_nodes(node))
    return sorted((name, line) for name, line in found if name == "promptdistill" or name.startswith("promptdistill."))


def _imports(path: Path, *, run_time_only: bool = False) -> list[tuple[str, int]]:
    """Every ``promptdistill`` import in the file (see ``_imports_in``)."""
    return _imports_in(path.read_text(encoding="utf-8"), _module_name(path), is_package=path.name == "__init__.py",
                       run_time_only=run_time_only)


def _package(module: str) -> str:
    """``promptdistill.X...`` -> ``X``; the root package (``promptdistill``) -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _packages() -> set[str]:
    """Every package (folder) and top-level module under promptdistill/, by this test's names."""
    return {_package(m) for m in _modules()}


def test_imports_follow_the_layers():
    problems = []
    for module, path in sorted(_modules().items()):
        here = _package(module)
        if here not in ALLOWED:
            problems.append(f"{path.relative_to(ROOT.parent)}: package {here!r} is not in this test's table (ALLOWED)")
            continue
        for name, line in _imports(path):
            there = _package(name)
            if name != "promptdistill" and there != here and there not in ALLOWED[here]:
                problems.append(f"{path.relative_to(ROOT.parent)}:{line}: {here} imports {name}")
    assert not problems, "imports against the layering:\n" + "\n".join(problems)


def test_every_package_is_in_the_table_and_the_table_names_only_packages():
    # A folder of modules without __init__.py is still a package here (rglob finds its files).
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and p.name != "__pycache__" and any(p.rglob("*.py"))}
    assert folders <= _packages()
    assert not _packages() - set(ALLOWED), f"packages missing from ALLOWED: {sorted(_packages() - set(ALLOWED))}"
    assert not set(ALLOWED) - _packages(), f"ALLOWED names packages that do not exist: {sorted(set(ALLOWED) - _packages())}"
    unknown = {there for allowed in ALLOWED.values() for there in allowed} - _packages()
    assert not unknown, f"ALLOWED lets packages import ones that do not exist: {sorted(unknown)}"


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle in ``graph`` (as a path that returns to its start), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            if cycle:
                return cycle
    return None


def test_no_import_cycle_between_packages():
    """Over every import (lazy ones inside functions and ``TYPE_CHECKING`` ones too): no
    package reaches back to itself, whatever the table allows."""
    graph: dict[str, set[str]] = {}
    where: dict[tuple[str, str], str] = {}
    for module, path in sorted(_modules().items()):
        here = _package(module)
        graph.setdefault(here, set())
        for name, line in _imports(path):
            there = _package(name)
            if there != here:
                graph[here].add(there)
                where.setdefault((here, there), f"{path.relative_to(ROOT.parent)}:{line} imports {name}")
    cycle = _cycle(graph)
    assert cycle is None, "package import cycle: " + " -> ".join(cycle) + "\n" + "\n".join(
        where[a, b] for a, b in zip(cycle, cycle[1:]))
    assert _cycle({p: set(a) for p, a in ALLOWED.items()}) is None, "the table itself allows a cycle"


def test_the_import_reader_sees_lazy_relative_and_dynamic_imports():
    """The reader this file's checks rest on: an import hidden anywhere in a module is found."""
    source = (
        "import os\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from promptdistill.search import racing\n"
        "class C:\n"
        "    def m(self):\n"
        "        try:\n"
        "            import promptdistill.registry.store as store\n"
        "        except ImportError:\n"
        "            pass\n"
        "def f():\n"
        "    def g():\n"
        "        from ..engine import base\n"
        "        from . import checks\n"
        "    return importlib.import_module(f'promptdistill.optimize.{name}'), __import__('promptdistill.ttft')\n"
    )
    found = _imports_in(source, "promptdistill.specs.load")
    assert {name for name, _ in found} >= {
        "promptdistill.search", "promptdistill.search.racing", "promptdistill.registry.store", "promptdistill.engine",
        "promptdistill.engine.base", "promptdistill.specs", "promptdistill.specs.checks", "promptdistill.optimize",
        "promptdistill.ttft"}, found
    assert ("promptdistill.registry.store", 8) in found and ("promptdistill.engine.base", 13) in found
    run_time = {name for name, _ in _imports_in(source, "promptdistill.specs.load", run_time_only=True)}
    assert "promptdistill.search.racing" not in run_time and "promptdistill.registry.store" in run_time
    # In a package's __init__, "." is the package itself.
    assert ("promptdistill.specs.load", 1) in _imports_in("from .load import load_spec\n", "promptdistill.specs",
                                                        is_package=True)
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_between_modules():
    modules = _modules()
    graph = {m: {name for name, _ in _imports(p, run_time_only=True) if name in modules and name != m}
             for m, p in modules.items()}
    # A package's __init__ importing its own submodules is how re-exports work, not a cycle.
    for m in graph:
        graph[m] = {n for n in graph[m] if not (n.startswith(m + ".") and modules[m].name == "__init__.py")}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("module", ["promptdistill.client", "promptdistill"])
def test_the_client_imports_nothing_heavy(module):
    code = (f"import sys, {module}; heavy = [m for m in ('vllm', 'torch', 'dspy', 'prefect', 'pandas', 'sklearn', "
            "'numpy', 'transformers', 'pyarrow') if m in sys.modules]; print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"importing {module} loaded {out}"


def test_the_cli_starts_without_the_pipeline():
    code = ("import sys; from promptdistill.cli import build_parser; build_parser(); "
            "print(','.join(m for m in ('vllm', 'torch', 'prefect', 'pandas', 'sklearn') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"building the CLI's parser loaded {out}"
