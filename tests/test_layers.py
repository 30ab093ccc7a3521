"""The package's layering: no import cycle, no module reaching into another's private names.

Read from the source with ``ast`` (nothing is imported), so the test sees imports inside functions too. A lazy
import inside a function that closes a cycle is allowed only where listed in ``_LAZY_CYCLES``, each with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hf_ckpt"

#: (importer, imported) edges allowed to close a cycle, because the import is deferred to call time.
_LAZY_CYCLES = {
    # enable(budget=...) makes a plan; the planner profiles through the core's enable/disable.
    ("hf_ckpt.core", "hf_ckpt.planner"),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(name: str, path: Path, modules: dict[str, Path]):
    """(imported module, imported name or None, lazy?) for every import of a hf_ckpt module in ``path``."""
    tree = ast.parse(path.read_text())
    lazy_nodes = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for inner in ast.walk(node)
    }
    type_checking = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    for node in ast.walk(tree):
        if id(node) in type_checking:
            continue
        lazy = id(node) in lazy_nodes
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("hf_ckpt"):
                    yield alias.name, None, lazy
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(name, path.name == "__init__.py", node)
            if not source.startswith("hf_ckpt"):
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in modules:
                    yield submodule, None, lazy
                else:
                    yield source, alias.name, lazy


def _graph():
    modules = _modules()
    edges: dict[str, set[str]] = {name: set() for name in modules}
    private: list[str] = []
    for name, path in modules.items():
        for target, imported_name, lazy in _imports(name, path, modules):
            if target not in modules:
                continue
            packages = [".".join(target.split(".")[:i]) for i in range(2, target.count(".") + 1)]
            for module in [target, *packages]:
                if module != name and not name.startswith(module + ".") and (name, module) not in _LAZY_CYCLES:
                    edges[name].add(module)
            if imported_name and imported_name.startswith("_") and not imported_name.startswith("__"):
                private.append(f"{name} imports {imported_name} from {target}")
    return edges, private


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    found, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = "active"
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "active":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node)
    return found


def test_the_package_has_no_import_cycle():
    edges, _ = _graph()
    assert _cycles(edges) == []


def test_no_module_imports_another_modules_private_names():
    _, private = _graph()
    assert private == []


def test_the_graph_check_itself_finds_a_cycle_and_a_private_import():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    tree = ast.parse("from .core import _target_model")
    node = tree.body[0]
    assert _resolve("hf_ckpt.planner", False, node) == "hf_ckpt.core"
    assert node.names[0].name.startswith("_")


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_function_is_longer_than_60_lines(path):
    """The largest function (docstring excluded) stays readable."""
    tree = ast.parse(path.read_text())
    long = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
                body = body[1:]
            if body:
                length = body[-1].end_lineno - body[0].lineno + 1
                if length > 60:
                    long.append(f"{node.name}: {length} lines")
    assert long == []
