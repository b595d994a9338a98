"""The layout: each folder is imported under one name only, and the repository holds no links."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import checkout
import pytest

ROOT = Path(__file__).resolve().parent.parent
MAPPING = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


def test_the_repository_holds_no_symbolic_links() -> None:
    listing = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-s"], capture_output=True, text=True, check=True
    ).stdout
    links = [line.split("\t", 1)[1] for line in listing.splitlines() if line.startswith("120000")]
    assert links == []


@pytest.mark.parametrize("package", sorted(MAPPING))
def test_each_folder_is_installed_under_its_package_name(package: str) -> None:
    answer = subprocess.run(
        [sys.executable, "-c", f"import {package}; print({package}.__file__)"],
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    )
    found = Path(answer.stdout.strip())
    mine = ROOT / MAPPING[package] / "__init__.py"
    if checkout.installed_source() is None:  # an editable install runs the checkout's folders
        assert found == mine
    else:  # scripts/install.sh's copy
        assert found.parts[-3:] == (*package.split("."), "__init__.py")
        assert found.read_bytes() == mine.read_bytes()


@pytest.mark.parametrize("folder", sorted(MAPPING.values()))
def test_a_folder_imported_under_its_own_name_from_the_checkout_refuses(folder: str) -> None:
    # Without PYTHONSAFEPATH (which the tests set), as a Python started in the checkout is.
    unsafe = {key: value for key, value in os.environ.items() if key != "PYTHONSAFEPATH"}
    answer = subprocess.run(
        [sys.executable, "-c", f"import {folder}"],
        cwd=ROOT,
        env=unsafe,
        capture_output=True,
        text=True,
    )
    assert answer.returncode == 1
    assert f"ImportError: {folder} is the folder of pgoverlay.{folder}" in answer.stderr


def test_every_module_of_a_folder_is_packaged() -> None:
    """A subpackage missing from pyproject.toml's list would be left out of the wheel (data
    folders such as the example migrations are listed too, with no __init__.py)."""
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    folders = {"pgoverlay": "pgoverlay", **MAPPING}
    found = {
        ".".join([package, *init.parent.relative_to(ROOT / folder).parts])
        for package, folder in folders.items()
        for init in (ROOT / folder).rglob("__init__.py")
    }
    assert found - listed == set()
    for package in listed:
        prefix = max((p for p in folders if package == p or package.startswith(p + ".")), key=len)
        rest = package.removeprefix(prefix).strip(".")
        assert (ROOT / folders[prefix] / Path(*rest.split("."))).is_dir(), package


def _module_level_names(tree: ast.Module) -> dict[str, str]:
    """Names a module binds at its top level (in if/try blocks too), with how it binds each."""
    bound: dict[str, str] = {}
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                source = node.module if isinstance(node, ast.ImportFrom) else None
                bound[local] = f"from {source} import {alias.name}" if source else alias.name
        elif isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef):
            bound[node.name] = "def"
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        bound[name.id] = "assignment"
        elif isinstance(node, ast.If | ast.Try):
            todo.extend(node.body + node.orelse + getattr(node, "finalbody", []))
            for handler in getattr(node, "handlers", []):
                todo.extend(handler.body)
    return bound


def test_no_package_binds_a_name_that_one_of_its_submodules_has() -> None:
    """Importing a submodule sets it as its package's attribute: a package whose __init__ also
    binds that name (``from psycopg import sql`` beside a ``sql.py``) finds it replaced."""
    folders = {"pgoverlay": "pgoverlay", **MAPPING}
    clashes = []
    for package, folder in folders.items():
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            here = init.parent
            subs = {p.stem for p in here.glob("*.py")} | {
                p.name for p in here.iterdir() if (p / "__init__.py").is_file()
            }
            dotted = ".".join([package, *here.relative_to(ROOT / folder).parts])
            for name, how in _module_level_names(ast.parse(init.read_text())).items():
                if name in subs and how != f"from {dotted} import {name}":
                    clashes.append(f"{init.relative_to(ROOT)}: {name} ({how})")
    assert clashes == []


def test_the_insight_modules_stay_small_and_no_function_of_the_action_is_long() -> None:
    """``action/insight`` is split along its own sections (``analyze.py`` had grown to 1,056
    lines): none of its modules passes 500 lines, and no function of the Action passes 120."""
    long_modules = {
        path.name: lines
        for path in sorted((ROOT / "action" / "insight").glob("*.py"))
        if (lines := len(path.read_text().splitlines())) > 500
    }
    assert long_modules == {}, "split the module along its sections"
    long_functions = {}
    for path in sorted((ROOT / "action").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > 120:
                    long_functions[f"{path.relative_to(ROOT)}:{node.name}"] = length
    assert long_functions == {}, "a function this long does several things: name them"
