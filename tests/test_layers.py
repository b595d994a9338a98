"""One place decides runtime and tools: nobody else reaches into the Docker modules, nobody
switches on which ``Tools`` it holds, and nobody outside the runtime layer compares a value with
a runtime's name (what a runtime does is asked of its row in ``runtime/table.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

import importgraph
from pgoverlay.runner.runtime import table

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("runner", "action", "webhook", "pgoverlay")
# The runtime layer: it alone may import the Docker runtime and the Docker tools.
RUNTIME = ROOT / "runner" / "runtime"
DOCKER_MODULES = {"pgoverlay.runner.runtime.docker", "pgoverlay.runner.runtime.docker_tools"}
TOOLS_CLASSES = {"Tools", "PgInstall", "DockerTools"}
RUNTIME_NAMES = set(table.names())


def imported_modules(tree: ast.AST) -> set[str]:
    """Every module a file imports, ``from a import b`` counted as ``a`` and ``a.b``."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _names(node: ast.expr) -> set[str]:
    if isinstance(node, ast.Tuple):
        return {name for item in node.elts for name in _names(item)}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    if isinstance(node, ast.Name):
        return {node.id}
    return set()


def tools_switches(tree: ast.AST) -> list[int]:
    """Lines that call ``isinstance`` with a tools class."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "isinstance"
        and len(node.args) == 2
        and _names(node.args[1]) & TOOLS_CLASSES
    ]


def _constants(node: ast.expr) -> set[object]:
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return {value for item in node.elts for value in _constants(item)}
    if isinstance(node, ast.Constant):
        return {node.value}
    return set()


def runtime_comparisons(tree: ast.AST) -> list[int]:
    """Lines that compare a value with a runtime's name (``==``, ``!=``, ``in``, ...)."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        and any(_constants(side) & RUNTIME_NAMES for side in (node.left, *node.comparators))
    ]


def sources() -> list[Path]:
    return [path for folder in PACKAGES for path in sorted((ROOT / folder).rglob("*.py"))]


def test_only_the_runtime_layer_imports_the_docker_runtime_and_tools() -> None:
    found = [
        f"{path.relative_to(ROOT)}: {', '.join(sorted(hits))}"
        for path in sources()
        if RUNTIME not in path.parents
        for hits in [imported_modules(ast.parse(path.read_text())) & DOCKER_MODULES]
        if hits
    ]
    assert found == []


def test_no_module_switches_on_the_type_of_its_tools() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sources()
        for line in tools_switches(ast.parse(path.read_text()))
    ]
    assert found == []


def test_no_module_outside_the_runtime_layer_compares_with_a_runtime_name() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sources()
        if RUNTIME not in path.parents
        for line in runtime_comparisons(ast.parse(path.read_text()))
    ]
    assert found == []


def test_the_checks_find_what_they_look_for() -> None:
    sample = ast.parse(
        "from pgoverlay.runner.runtime import docker as d\n"
        "import pgoverlay.runner.runtime.docker_tools\n"
        "if isinstance(install, (PgInstall, int)):\n"
        "    pass\n"
        "ok = isinstance(install, str)\n"
        "uses = any(b.runtime == 'docker' for b in rows)\n"
        "if runtime in ('auto', 'local'):\n"
        "    pass\n"
        "fine = runtime == 'auto'\n"
    )
    assert imported_modules(sample) & DOCKER_MODULES == DOCKER_MODULES
    assert tools_switches(sample) == [3]
    assert sorted(runtime_comparisons(sample)) == [6, 7]


WAITING_CALLS = {"run", "call", "check_call", "check_output"}  # subprocess's that wait


def calls_without_timeout(tree: ast.AST) -> list[int]:
    """Lines that call ``subprocess.run`` (or another of subprocess's waiting calls) with no
    ``timeout=``."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "subprocess"
        and node.func.attr in WAITING_CALLS
        and not any(k.arg == "timeout" for k in node.keywords)
    ]


def test_every_external_program_is_waited_for_with_a_deadline() -> None:
    """A program that hangs (groupadd waiting on /etc/group's lock, a stuck systemctl) cannot
    hang a command: every call that waits for one has a timeout (``proc.run`` requires one)."""
    found = {
        f"{path.relative_to(ROOT)}:{line}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for line in calls_without_timeout(ast.parse(path.read_text()))
    }
    assert found == set(), sorted(found)


# -- the import boundary: root's code and the front door's process (tests/importgraph.py) --------


def test_no_module_of_the_front_doors_process_can_load_a_root_engine_module() -> None:
    """The door (``runner/door/``, ``runner/web/``) and everything it loads, through the shared
    modules, never load the engine's code: each chain of imports that would is named."""
    assert importgraph.door_reaches_root(importgraph.sources()) == []


def test_no_module_that_runs_as_root_imports_the_door_or_the_listener() -> None:
    assert importgraph.root_imports_the_other_side(importgraph.sources()) == []


def test_every_module_is_classified_and_the_classification_names_only_modules() -> None:
    found = importgraph.modules()
    named = (
        *importgraph.ROOT_ENGINE,
        *importgraph.SHARED_IN_ROOT,
        *importgraph.DOOR,
        *importgraph.SHARED_IN_DOOR,
        *importgraph.LISTENER,
    )
    assert [name for name in named if name not in found] == []
    assert {importgraph.zone(name) for name in found} == {
        "root",
        "door",
        "listener",
        "shared",
        "other",
    }


def test_the_boundary_checks_find_an_arrow_across_it() -> None:
    """An import added across the boundary, at a module's top or in a function, directly or
    through a shared module, is found; one under ``if TYPE_CHECKING:`` loads nothing."""
    sources = {
        "pgoverlay.runner": "",
        "pgoverlay.runner.names": "",
        "pgoverlay.runner.settings": "from pgoverlay.runner import names\n",
        "pgoverlay.runner.pool": "from pgoverlay.runner import settings\n",
        "pgoverlay.runner.pool.registry": "",
        "pgoverlay.runner.door": "",
        "pgoverlay.runner.door.router": (
            "from typing import TYPE_CHECKING\n"
            "from pgoverlay.runner import settings\n"
            "if TYPE_CHECKING:\n"
            "    from pgoverlay.runner.pool import Pool\n"
        ),
        "pgoverlay.runner.web": "",
        "pgoverlay.runner.web.page": "def page():\n    from pgoverlay.runner import settings\n",
        "pgoverlay.webhook": "",
    }
    assert importgraph.door_reaches_root(sources) == []
    assert importgraph.root_imports_the_other_side(sources) == []
    sources["pgoverlay.runner.names"] = "from pgoverlay.runner.pool import registry\n"
    sources["pgoverlay.runner.web.page"] = "def page():\n    from pgoverlay.runner import pool\n"
    sources["pgoverlay.runner.pool"] = "def down():\n    import pgoverlay.webhook\n"
    assert importgraph.door_reaches_root(sources) == [
        "pgoverlay.runner.door.router -> pgoverlay.runner.settings -> pgoverlay.runner.names"
        " -> pgoverlay.runner.pool",
        "pgoverlay.runner.door.router -> pgoverlay.runner.settings -> pgoverlay.runner.names"
        " -> pgoverlay.runner.pool.registry",
        "pgoverlay.runner.web.page -> pgoverlay.runner.pool",
    ]
    assert importgraph.root_imports_the_other_side(sources) == [
        "pgoverlay.runner.pool -> pgoverlay.webhook"
    ]
