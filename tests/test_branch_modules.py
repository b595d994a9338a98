"""The branch package's sagas and views stay in modules of one job each, used in one order
(docs/architecture.md): ``dirs``, ``ports``, ``access``, ``lookup``, ``lifecycle``, ``creation``,
``suspension``. None imports a module after it, and none grows back into the 1,000-line module
they were split from."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BRANCH = ROOT / "runner" / "branch"
PACKAGE = "pgoverlay.runner.branch"
# In their order of use: each may import those before it, never one after it.
ORDER = ("dirs", "ports", "access", "lookup", "lifecycle", "creation", "suspension")
MAX_LINES = 500


def branch_modules_imported(source: str) -> set[str]:
    """The modules of ``ORDER`` that ``source`` imports, at its top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            head, _, last = name.rpartition(".")
            if head == PACKAGE and last in ORDER:
                found.add(last)
    return found


def later_imports(module: str, source: str) -> set[str]:
    """The modules after ``module`` in ``ORDER`` that its ``source`` imports."""
    return {m for m in branch_modules_imported(source) if ORDER.index(m) >= ORDER.index(module)}


def test_each_saga_module_imports_only_the_ones_before_it() -> None:
    wrong = {
        module: sorted(found)
        for module in ORDER
        if (found := later_imports(module, (BRANCH / f"{module}.py").read_text()))
    }
    assert not wrong, f"imports against the order {ORDER}: {wrong}"


def test_the_order_check_sees_an_import_of_a_later_module() -> None:
    source = "from pgoverlay.runner.branch import creation\n"
    assert later_imports("lifecycle", source) == {"creation"}
    inside = "def f():\n    from pgoverlay.runner.branch.suspension import wake\n"
    assert later_imports("creation", inside) == {"suspension"}
    assert later_imports("creation", "from pgoverlay.runner.branch.dirs import layout\n") == set()


def test_no_saga_module_and_not_the_package_grows_past_500_lines() -> None:
    sizes = {
        path.name: len(path.read_text().splitlines())
        for path in [BRANCH / "__init__.py", *(BRANCH / f"{m}.py" for m in ORDER)]
    }
    assert max(sizes.values()) <= MAX_LINES, sizes
