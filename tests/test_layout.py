"""The package layout: imports run one way, with no cycle, and light paths stay light.

Reads every module's imports with ``ast`` (module level, and inside functions), so a
new import that breaks the layering fails here, naming the module and the import.
"""

from __future__ import annotations

import ast
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
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(path: Path, *, top_level_only: bool) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = []
    for node in nodes:
        if isinstance(node, ast.If) and top_level_only:
            continue  # TYPE_CHECKING blocks: not imported at run time
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, node.lineno))
        elif isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
    return [(name, line) for name, line in found if name == "promptdistill" or name.startswith("promptdistill.")]


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_imports_follow_the_layers():
    problems = []
    for module, path in _modules().items():
        here = _package(module)
        if here not in ALLOWED:
            continue
        for name, line in _imports(path, top_level_only=False):
            there = _package(name)
            if there and there != here and there not in ALLOWED[here]:
                problems.append(f"{path.relative_to(ROOT.parent)}:{line}: {here} imports {name}")
    assert not problems, "imports against the layering:\n" + "\n".join(problems)


def test_no_import_cycle_between_modules():
    modules = _modules()
    graph = {m: {name for name, _ in _imports(p, top_level_only=True) if name in modules and name != m}
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
