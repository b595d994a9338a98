"""Which of the package's modules run as root, which run in the front door's process, which
are the listener's, and which are shared leaves any of them may load: the classification
docs/architecture.md states ("The import boundary"), and the imports between the modules,
read from their source (``tests/test_layers.py``, ``tests/test_door_boundary.py``).

- **root**: the engine and what only root's commands run: the pool, seeds, branches, Postgres,
  the runtimes (but their protocol and their table of names), traces, masking, the demo, the
  engine service's engine, app, socket and admission, its own check of the
  credentials the door forwards, ``doctor``, the listener's account made by root, and the
  door's start and stop (``door.control``).
- **door**: what runs in the front door's process once it is its own user: the proxy
  (``runner/door/``) and the web application (``runner/web/``).
- **listener**: ``webhook/``.
- **shared**: everything else under ``runner/`` and ``pgoverlay/errors.py``: the settings, the
  names, units, processes, files and waits, the callers (``runner/callers/``), the service's
  wire types and clients, and four modules of the door that the commands, the Action and the
  listener read too (``tls``, ``dsn``, ``reach``, ``pidfile``).
- The Action (``action/``) and the command line (``pgoverlay/cli/``, which starts every one
  of these processes) are none of them; what the door loads of the Action is held to the
  door's rule.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {
    "runner": "pgoverlay.runner",
    "action": "pgoverlay.action",
    "webhook": "pgoverlay.webhook",
    "pgoverlay": "pgoverlay",
}

ROOT_ENGINE = (
    "pgoverlay.runner.pool",
    "pgoverlay.runner.seed",
    "pgoverlay.runner.branch",
    "pgoverlay.runner.postgres",
    "pgoverlay.runner.runtime",
    "pgoverlay.runner.trace",
    "pgoverlay.runner.mask",
    "pgoverlay.runner.demo",
    "pgoverlay.runner.service.engine",
    "pgoverlay.runner.service.app",
    "pgoverlay.runner.service.serve",
    "pgoverlay.runner.service.admission",
    "pgoverlay.runner.service.witness",
    "pgoverlay.runner.doctor",
    "pgoverlay.runner.listener",
    "pgoverlay.runner.door.control",
)
# Declarations inside a root package that name things and import nothing of it when loaded:
# the runtimes' protocol and their table of names (a runtime's class is imported when asked).
SHARED_IN_ROOT = ("pgoverlay.runner.runtime", "pgoverlay.runner.runtime.table")
DOOR = ("pgoverlay.runner.door", "pgoverlay.runner.web")
# The door's modules the commands, the Action and the listener read too: leaves.
SHARED_IN_DOOR = (
    "pgoverlay.runner.door",  # its __init__: a docstring
    "pgoverlay.runner.door.tls",
    "pgoverlay.runner.door.dsn",
    "pgoverlay.runner.door.reach",
    "pgoverlay.runner.door.pidfile",
)
LISTENER = ("pgoverlay.webhook",)


def _under(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def zone(module: str) -> str:
    """``root``, ``door``, ``listener``, ``shared``, or ``other`` (the Action, the CLI)."""
    if module in SHARED_IN_ROOT or module in SHARED_IN_DOOR:
        return "shared"
    if _under(module, ROOT_ENGINE):
        return "root"
    if _under(module, DOOR):
        return "door"
    if _under(module, LISTENER):
        return "listener"
    if _under(module, ("pgoverlay.runner",)) or module in ("pgoverlay", "pgoverlay.errors"):
        return "shared"
    return "other"


def modules() -> dict[str, Path]:
    """Every module of the package, by its installed name."""
    found: dict[str, Path] = {}
    for folder, name in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([name, *parts])] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _named(node: ast.Import | ast.ImportFrom) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    if not node.module:
        return set()
    return {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}


def imports(tree: ast.AST, *, at_load: bool) -> set[str]:
    """What a module imports: with ``at_load``, only what loading it runs (its top level, not
    a function's body nor an ``if TYPE_CHECKING:`` block); else every import it makes, in a
    function too, but not the annotations' alone."""
    found: set[str] = set()

    def visit(node: ast.AST, *, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for inner in child.orelse:
                    visit_one(inner, top=top)
                continue
            visit_one(child, top=top)

    def visit_one(node: ast.AST, *, top: bool) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            if top or not at_load:
                found.update(_named(node))
            return
        inside = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        visit(node, top=top and not inside)

    visit(tree, top=True)
    return found


def with_parents(module: str) -> set[str]:
    """``module`` and the packages importing it loads first."""
    parts = module.split(".")
    return {".".join(parts[:n]) for n in range(1, len(parts) + 1)}


def graph(sources: Mapping[str, str], *, at_load: bool) -> dict[str, set[str]]:
    """Each module's imports of the package's own modules (packages loaded on the way
    included), from each module's source text."""
    known = set(sources)
    return {
        name: {
            loaded
            for imported in imports(ast.parse(text), at_load=at_load)
            if imported in known
            for loaded in with_parents(imported)
            if loaded in known and loaded != name
        }
        for name, text in sources.items()
    }


def sources() -> dict[str, str]:
    return {name: path.read_text() for name, path in modules().items()}


def loaded_by(
    start: str, eager: Mapping[str, set[str]], every: Mapping[str, set[str]]
) -> dict[str, str]:
    """The modules the door may load through ``start``: its own imports, in a function too
    (``every``), and then what loading each of them loads (``eager``); each with the chain that
    reaches it."""
    chains = {start: start}
    todo = [(m, start) for m in sorted(every.get(start, ()))]
    while todo:
        module, via = todo.pop()
        if module in chains:
            continue
        chains[module] = f"{chains[via]} -> {module}"
        todo.extend((m, module) for m in sorted(eager.get(module, ())))
    return chains


def door_reaches_root(sources: Mapping[str, str]) -> list[str]:
    """Each chain of imports by which a module of the door's process loads a root module."""
    eager = graph(sources, at_load=True)
    every = graph(sources, at_load=False)
    return sorted(
        chain
        for name in sources
        if zone(name) == "door"
        for module, chain in loaded_by(name, eager, every).items()
        if zone(module) == "root"
    )


def root_imports_the_other_side(sources: Mapping[str, str]) -> list[str]:
    """Each import by a root module of a module of the door or of the listener."""
    every = graph(sources, at_load=False)
    return sorted(
        f"{name} -> {imported}"
        for name, imported_all in every.items()
        if zone(name) == "root"
        for imported in imported_all
        if zone(imported) in ("door", "listener")
    )
