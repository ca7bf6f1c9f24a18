"""The package's shape: imports form a DAG, nobody reaches into private names.

Every import is counted — module level, inside functions, and under ``TYPE_CHECKING`` — so a
circle cannot hide behind a deferred import.
"""

from __future__ import annotations

import ast
import concurrent.futures
import graphlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import aiodlock

pytestmark = pytest.mark.memory

PACKAGE = Path(aiodlock.__file__).parent

# Third-party internals we rely on knowingly (the driver's version is pinned in pyproject.toml
# for this reason): aiomysql exposes no public way to bound a connect or to read the socket.
DRIVER_INTERNALS = {
    "aiodlock.backends.sql._mysql_conn": {"_writer", "_connect", "_result", "_secure"}
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _parse(path: Path) -> ast.Module:
    try:
        return ast.parse(path.read_text(), str(path))
    except SystemError:
        # CPython 3.11 before 3.11.8 (gh-106905) can fail an ast.parse with "AST constructor
        # recursion depth mismatch" once the thread's recursion accounting is off; a fresh
        # thread starts with it right.
        with concurrent.futures.ThreadPoolExecutor(1) as fresh:
            return fresh.submit(ast.parse, path.read_text(), str(path)).result()


def _modules() -> dict[str, ast.Module]:
    return {_module_name(path): _parse(path) for path in sorted(PACKAGE.rglob("*.py"))}


def _is_package(name: str) -> bool:
    return (PACKAGE.parent / name.replace(".", "/") / "__init__.py").exists()


def _resolve(importer: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    if not _is_package(importer):
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _imports(importer: str, tree: ast.Module) -> Iterator[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every import in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(importer, node)
            for alias in node.names:
                yield module, alias.name, node.lineno


def _internal_edges() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for importer, tree in modules.items():
        for module, name, _ in _imports(importer, tree):
            submodule = f"{module}.{name}" if name else module
            target = submodule if submodule in modules else module
            if target in modules and target != importer:
                graph[importer].add(target)
    return graph


def test_imports_form_a_dag() -> None:
    graph = _internal_edges()
    # A package's __init__ re-exports its children: that edge points down, never back up.
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle in aiodlock: {' -> '.join(exc.args[1])}")


def test_no_module_imports_a_private_name_of_another() -> None:
    offenders = []
    for importer, tree in _modules().items():
        for module, name, line in _imports(importer, tree):
            if name is None or not name.startswith("_") or name == "__version__":
                continue
            if (
                _is_package(module)
                and (PACKAGE.parent / module.replace(".", "/")).joinpath(f"{name}.py").exists()
            ):
                continue  # a private *module* of the package: fine
            offenders.append(f"{importer}:{line} imports {name} from {module}")
    assert offenders == []


def test_no_module_touches_private_attributes_of_other_objects() -> None:
    """``x._name`` is only for ``self``/``cls`` and for names defined in the same module."""
    offenders = []
    for importer, tree in _modules().items():
        own = _names_defined_in(tree) | DRIVER_INTERNALS.get(importer, set())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
                continue
            if node.attr.startswith("__") or node.attr in own:
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            offenders.append(f"{importer}:{node.lineno} touches .{node.attr}")
    assert offenders == [], "\n".join(offenders)


def _names_defined_in(tree: ast.Module) -> set[str]:
    """Underscore names the module itself defines: attributes assigned on self, slots,
    methods, and module-level names (their use within the module is its own business)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)  # __slots__ entries
    return {name for name in names if name.startswith("_")}


def test_tests_use_the_public_api() -> None:
    """The tests (and examples) import aiodlock's public modules only, as a user would."""
    root = PACKAGE.parent
    offenders = []
    for path in sorted([*root.glob("tests/**/*.py"), *root.glob("examples/*.py")]):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] == "aiodlock" and any(p.startswith("_") for p in parts[1:]):
                    offenders.append(f"{path.relative_to(root)}:{node.lineno} imports {name}")
    assert offenders == []


def test_docstrings_cite_only_documents_that_ship_with_the_repository() -> None:
    # The design notes and research files the project grew from are not in the repository:
    # a reader of help() must be sent to docs/ or README.md, which are.
    repo = PACKAGE.parent
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        assert "DESIGN" not in text and "research" not in text, path
        for cited in re.findall(r"\b(?:docs/[\w./-]+\.md|README\.md)", text):
            assert (repo / cited).is_file(), f"{path} cites {cited}, which does not exist"


def test_the_conformance_suite_exports_every_test() -> None:
    # A backend runs the suite with `import *`: a test left out of __all__ would never run,
    # nor one its package's modules define that the package does not import.
    import importlib
    import pkgutil

    from aiodlock.testing import conformance

    defined = {name for name in vars(conformance) if name.startswith("test_")}
    for module in pkgutil.iter_modules(conformance.__path__, f"{conformance.__name__}."):
        tests = vars(importlib.import_module(module.name))
        defined |= {name for name in tests if name.startswith("test_")}
    assert defined <= set(conformance.__all__)
    exported = set(conformance.__all__) - {"pytest_plugins"}
    assert all(callable(getattr(conformance, name)) for name in exported)
