"""The layout: each folder is imported under one name only, and the repository holds no links."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

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
    assert Path(answer.stdout.strip()) == ROOT / MAPPING[package] / "__init__.py"


@pytest.mark.parametrize("folder", sorted(MAPPING.values()))
def test_a_folder_imported_under_its_own_name_from_the_checkout_refuses(folder: str) -> None:
    answer = subprocess.run(
        [sys.executable, "-c", f"import {folder}"], cwd=ROOT, capture_output=True, text=True
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
