"""Type-check the whole package under its installed names: `.venv/bin/python scripts/typecheck.py`.

The engine, the Action and the listener live in top-level folders that pyproject.toml's
`package-dir` installs as pgoverlay.runner, pgoverlay.action and pgoverlay.webhook. mypy names a
file after its folder and cannot read that mapping, so this script gives mypy every source file
with its module name, taken from the same mapping the build uses.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from mypy.build import BuildSource, build
from mypy.main import process_options

ROOT = Path(__file__).resolve().parent.parent


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
    return found


def main() -> int:
    _, options = process_options(["--config-file", str(ROOT / "pyproject.toml"), "pgoverlay"])
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
