"""Type-check the package, its tests and its benchmarks: `.venv/bin/python scripts/typecheck.py`.

The engine, the Action and the listener live in top-level folders that pyproject.toml's
`package-dir` installs as pgoverlay.runner, pgoverlay.action and pgoverlay.webhook. mypy names a
file after its folder and cannot read that mapping, so this script gives mypy every source file
with its module name, taken from the same mapping the build uses. A plain `mypy` run cannot find
the package's own modules and fails on every import of them (pyproject.toml lets only named
third-party libraries go unchecked), rather than passing while checking nothing.

The tests and the benchmarks are checked too, under the names they are imported by: pytest puts
tests/ on the path (`helpers`, `fakegithub`), and a benchmark run as `python bench/X.py` finds
its neighbours in bench/ (`common`, `engine_report`).
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from mypy.build import BuildSource, build
from mypy.main import process_options

ROOT = Path(__file__).resolve().parent.parent
# Folders of scripts and modules imported by their bare names (tests/fixtures holds other
# projects' files, which our tools read, not ours).
FLAT = ("tests", "bench")


def sources() -> list[BuildSource]:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"pgoverlay": "pgoverlay", **setuptools["package-dir"]}
    found = []
    for package, folder in folders.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            module = ".".join([package, *parts])
            found.append(BuildSource(str(path.relative_to(ROOT)), module))
    for folder in FLAT:
        for path in sorted((ROOT / folder).glob("*.py")):
            found.append(BuildSource(str(path.relative_to(ROOT)), path.stem))
    return found


def main() -> int:
    _, options = process_options(["--config-file", str(ROOT / "pyproject.toml"), "pgoverlay"])
    options.mypy_path = [str(ROOT / folder) for folder in FLAT]
    found = sources()
    result = build(found, options)
    for line in result.errors:
        print(line)
    if result.errors:
        print(f"error: mypy found {len(result.errors)} problem(s)", file=sys.stderr)
        return 1
    print(f"mypy: no issues in {len(found)} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
