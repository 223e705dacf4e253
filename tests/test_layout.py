"""The package layout: imports run one way, with no cycle, and light paths stay light.

Reads every module's imports with ``ast`` (module level, and inside functions), so a
new import that breaks the layering, or closes a cycle (a lazy import inside a function
too), fails here, naming the module and the import. A new package must be added to the
table: one missing from it fails rather than go unchecked.
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
# distill, ttft -> optimize -> pipeline -> flows, cli. The registry needs only core and
# the one render function; the client only the registry.
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
    "optimize": {"core", "specs", "engine", "judges", "evaluate", "search", "ttft"},
    "pipeline": {"core", "specs", "engine", "judges", "evaluate", "search", "distill", "ttft", "optimize", "registry"},
    "flows": {"core", "specs", "engine", "judges", "evaluate", "search", "distill", "ttft", "optimize", "registry",
              "pipeline"},
    "cli": {"core", "specs", "engine", "judges", "evaluate", "search", "distill", "ttft", "optimize", "registry",
            "pipeline", "flows", "client"},
    "client": {"core", "specs", "registry"},
    "__init__": {"client"},  # the package root: re-exports the client's Templates
    "__main__": {"cli"},  # python -m promptdistill
}


@functools.cache
def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and ast.unparse(test).endswith("TYPE_CHECKING")


def _imports(path: Path, *, run_time_only: bool = False) -> list[tuple[str, int]]:
    """Every ``promptdistill`` import in the file, at any depth (inside functions too).

    ``from promptdistill.pkg import name`` counts as importing ``promptdistill.pkg.name``
    as well when that is a module. ``run_time_only`` leaves out ``if TYPE_CHECKING:`` blocks.
    """
    modules = _modules()
    found: list[tuple[str, int]] = []
    todo: list[ast.AST] = [ast.parse(path.read_text(encoding="utf-8"))]
    while todo:
        node = todo.pop()
        if run_time_only and _type_checking(node):
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, node.lineno))
            found += [(f"{node.module}.{a.name}", node.lineno) for a in node.names if f"{node.module}.{a.name}" in modules]
        elif isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        todo.extend(ast.iter_child_nodes(node))
    return sorted((name, line) for name, line in found if name == "promptdistill" or name.startswith("promptdistill."))


def _package(module: str) -> str:
    """``promptdistill.X...`` -> ``X``; the root package (``promptdistill``) -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_imports_follow_the_layers():
    problems = []
    for module, path in _modules().items():
        here = _package(module)
        if here not in ALLOWED:
            problems.append(f"{path.relative_to(ROOT.parent)}: package {here!r} is not in this test's table (ALLOWED)")
            continue
        for name, line in _imports(path):
            there = _package(name)
            if name != "promptdistill" and there != here and there not in ALLOWED[here]:
                problems.append(f"{path.relative_to(ROOT.parent)}:{line}: {here} imports {name}")
    assert not problems, "imports against the layering:\n" + "\n".join(problems)


def test_no_import_cycle_between_modules():
    modules = _modules()
    graph = {m: {name for name, _ in _imports(p, run_time_only=True) if name in modules and name != m}
             for m, p in modules.items()}
    # A package's __init__ importing its own submodules is how re-exports work, not a cycle.
    for m in graph:
        graph[m] = {n for n in graph[m] if not (n.startswith(m + ".") and modules[m].name == "__init__.py")}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
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
