"""The type check checks: a type error in the package, a test or a benchmark fails
scripts/typecheck.py, and a plain `mypy` run, which cannot find the package under its installed
names, fails rather than passing on modules it took as unknown."""

from __future__ import annotations

import re
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("pyproject.toml", "scripts", "pgoverlay", "runner", "action", "webhook", "examples")
# One type the package defines, used where it does not fit: with every module of ours taken as
# unknown (as a plain mypy run took them), the last two would pass.
_IMPORTED = "\nfrom pgoverlay.runner.pool.gc import Collected\n\nWRONG: int = Collected\n"
WRONG = {
    "runner/pool/gc.py": "\n\nWRONG: int = Collected\n",
    "tests/helpers.py": _IMPORTED,
    "bench/common.py": _IMPORTED,
}


def _copy(to: Path) -> None:
    for name in (*CHECKED, "tests", "bench"):
        source = ROOT / name
        if source.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "fixtures")
            shutil.copytree(source, to / name, ignore=ignore)
        else:
            shutil.copy2(source, to / name)
    _copy_cache(ROOT / ".mypy_cache", to / ".mypy_cache")


def _copy_cache(source: Path, to: Path) -> None:
    """The checkout's mypy cache, if any: only faster, as mypy checks again what changed. Its
    SQLite files are copied as a snapshot, consistent even while another run writes them."""
    if not source.is_dir():
        return
    to.mkdir()
    for path in sorted(source.rglob("*")):
        target = to / path.relative_to(source)
        if path.name.endswith(("-wal", "-shm", "-journal")):
            continue
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif path.suffix == ".db":
            with closing(sqlite3.connect(path)) as db, closing(sqlite3.connect(target)) as copy:
                db.backup(copy)
        else:
            shutil.copy2(path, target)


def _python(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=600, check=False
    )


def test_a_type_error_in_the_package_a_test_or_a_benchmark_fails_the_check(
    tmp_path: Path,
) -> None:
    _copy(tmp_path)
    for name, text in WRONG.items():
        with (tmp_path / name).open("a") as file:
            file.write(text)
    done = _python("scripts/typecheck.py", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    for name in WRONG:
        wrong = rf"^{re.escape(name)}:\d+: error: Incompatible types in assignment "
        assert re.search(wrong, done.stdout, re.MULTILINE), done.stdout
    assert f"mypy found {len(WRONG)} problem(s)" in done.stderr


def test_a_plain_mypy_run_on_a_module_of_the_package_fails_on_its_imports(
    tmp_path: Path,
) -> None:
    """An editor's `mypy runner/pool/gc.py` names the file runner.pool.gc and cannot find the
    pgoverlay.runner it imports; that is an error, not a module taken as unknown."""
    done = _python("-m", "mypy", "--cache-dir", str(tmp_path), "runner/pool/gc.py", cwd=ROOT)
    assert done.returncode == 1, done.stdout + done.stderr
    # Run from an editable install, mypy cannot find the package; from scripts/install.sh's
    # copy, it finds it installed without type information: either way an error, not Any.
    missing = (
        'Cannot find implementation or library stub for module named "pgoverlay.runner.',
        'Skipping analyzing "pgoverlay.runner',
    )
    assert any(m in done.stdout for m in missing), done.stdout
