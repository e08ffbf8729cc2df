"""The package's shape: dependencies point one way (no import circle among our modules), our own
modules are imported inside a function only where that keeps start-up cheap (with the reason on the
line), and no library module grows past the size a newcomer can read."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "betonbuild"
MAX_MODULE_LINES = 500


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(node: ast.ImportFrom | ast.Import, importer: str) -> list[str]:
    """Our modules an import statement loads: ``from betonbuild.a import b`` is ``betonbuild.a.b``
    when that is a module, else ``betonbuild.a``."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in MODULES]
    base = node.module or ""
    if node.level:
        package = importer.split(".")
        if not MODULES[importer].name == "__init__.py":
            package = package[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join(package + ([base] if base else []))
    found = []
    for alias in node.names:
        if f"{base}.{alias.name}" in MODULES:
            found.append(f"{base}.{alias.name}")
        elif base in MODULES:
            found.append(base)
    return found


def imports(name: str) -> list[tuple[str, ast.stmt, bool]]:
    """(imported module, statement, inside a function) for every import of our modules in ``name``."""
    tree = ast.parse(MODULES[name].read_text())
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            local = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.extend((target, child, in_function) for target in imported_modules(child, name))
            visit(child, local)

    visit(tree, False)
    return [f for f in found if f[0] != name]


GRAPH = {name: sorted({target for target, _, _ in imports(name)}) for name in MODULES}


def find_cycle(graph: dict[str, list[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in graph.get(node, []):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in graph:
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_circle_among_the_packages_modules():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_circle_finder_finds_a_circle():
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["a"], "d": []}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": ["b"], "b": [], "c": ["a"]}) is None


def says_why(lines: list[str], node: ast.stmt) -> bool:
    """A comment on the import's own lines, or on the line above the run of imports it belongs to."""
    if any("#" in line for line in lines[node.lineno - 1 : node.end_lineno]):
        return True
    above = node.lineno - 2
    while above >= 0 and lines[above].strip().startswith(("from ", "import ")):
        above -= 1
    return above >= 0 and lines[above].strip().startswith("#")


def test_function_local_imports_of_our_modules_say_why():
    """A function-local import of our own module exists only for start-up time, and says so."""
    unexplained = []
    for name, path in MODULES.items():
        lines = path.read_text().splitlines()
        for target, node, local in imports(name):
            if local and not says_why(lines, node):
                unexplained.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} imports {target}")
    assert not unexplained, "function-local imports without a reason:\n" + "\n".join(unexplained)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_library_module_is_small_enough_to_read(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{name} has {lines} lines; split it by concern (at most {MAX_MODULE_LINES})"


def test_test_file_names_are_unique():
    """Test directories have no __init__.py: two test files of one name would not both import."""
    names = [p.name for p in (PACKAGE.parent / "tests").rglob("*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
