"""docs/architecture.md stays true: its map of the modules ("Every module, by package") names
each package of the product and, under it, each of its modules, and nothing that is not there;
the files a change recipe lists exist; and no function of the product grows past 120 lines."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
FOLDERS = ("runner", "action", "webhook", "pgoverlay")
MAP_HEADING = "## Every module, by package"
LONGEST_FUNCTION = 120

PACKAGE_LINE = re.compile(r"^(?P<package>[a-z_]+(?:/[a-z_]+)*/)(?:\s|$)")
MODULE_LINE = re.compile(r"^  (?P<module>[a-z_0-9]+\.py)(?:\s|$)")
# A file named in the doc: `runner/pool/gc.py`, `tests/test_x.py`, `scripts/y.py`, `action.yml`.
NAMED_FILE = re.compile(r"`((?:[a-z_]+/)+[A-Za-z_0-9.-]+\.(?:py|yml|md|json|sh))`")


def packages() -> dict[str, set[str]]:
    """Each package folder of the product (relative, with a trailing ``/``) and its modules."""
    found: dict[str, set[str]] = {}
    for folder in FOLDERS:
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            package = init.parent
            found[f"{package.relative_to(ROOT).as_posix()}/"] = {
                path.name for path in package.glob("*.py")
            }
    return found


def module_map(text: str) -> dict[str, set[str]]:
    """The map's packages and the modules named under each (the fenced blocks after the
    heading, up to the next heading)."""
    section = text.split(MAP_HEADING, 1)[1].split("\n## ", 1)[0]
    named: dict[str, set[str]] = {}
    current: str | None = None
    inside = False
    for line in section.splitlines():
        if line.startswith("```"):
            inside = not inside
            current = None
            continue
        if not inside:
            continue
        if package := PACKAGE_LINE.match(line):
            current = package["package"]
            assert current not in named, f"{current} is listed twice in the map"
            named[current] = set()
        elif module := MODULE_LINE.match(line):
            assert current, f"{module['module']} is listed before any package"
            named[current].add(module["module"])
    return named


def test_the_map_names_every_package_and_every_module_and_nothing_else() -> None:
    text = DOC.read_text()
    assert MAP_HEADING in text
    named, actual = module_map(text), packages()
    assert sorted(set(actual) - set(named)) == [], "packages the map does not name"
    assert sorted(set(named) - set(actual)) == [], "packages the map names that do not exist"
    for package, modules in actual.items():
        assert sorted(modules - named[package]) == [], f"modules of {package} the map leaves out"
        assert sorted(named[package] - modules) == [], f"modules the map puts in {package}"


def test_the_map_reader_finds_a_module_left_out_and_one_that_is_gone() -> None:
    """The check above can fail: a map missing a module, or naming one that is not there."""
    text = DOC.read_text()
    named = module_map(text)
    package = "runner/pool/"
    assert "gc.py" in named[package]
    without = text.replace("\n  gc.py ", "\n  gone.py ", 1)
    assert module_map(without)[package] == named[package] - {"gc.py"} | {"gone.py"}


def test_every_file_the_doc_names_exists() -> None:
    """A path is the repository's, or the engine's below ``runner/``; a recipe's file to be
    made is marked ``(new``."""
    text = DOC.read_text()
    missing = [
        found[1]
        for found in NAMED_FILE.finditer(text)
        if not any((ROOT / folder / found[1]).exists() for folder in (".", "runner"))
        and "(new" not in text[found.end() : found.end() + 6]
    ]
    assert missing == []


def test_no_function_of_the_product_is_longer_than_120_lines() -> None:
    long = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length > LONGEST_FUNCTION:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} {length}")
    assert long == []
