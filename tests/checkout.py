"""Which pgoverlay the tests run, and whether the users they start can read it.

The tests start unprivileged users (the runner's, the listener's) that run pgoverlay. They run
either this checkout's code (an editable install: the checkout must be readable by them) or the
copy `scripts/install.sh` installed outside the checkout (PREFIX/venv, built from PREFIX/src: it
must hold this checkout's code). Imported first by conftest.py: it stops a run that would fail
for these reasons in hundreds of places with one line that says what to do.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import stat
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What scripts/install.sh leaves out of its copy of the checkout: at the top, and anywhere.
NOT_COPIED_AT_TOP = {".git", ".venv", "build"}
NOT_COPIED = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}

if importlib.util.find_spec("pgoverlay.runner") is None:
    pytest.exit(
        "error: `pgoverlay` is this checkout's pgoverlay/ folder, which hides the installed "
        "package (`python -m` puts the current folder first on sys.path): run the tests with "
        "scripts/test.sh, `.venv/bin/python -P -m pytest` or `.venv/bin/pytest`",
        returncode=4,
    )


# The Pythons the tests start (`python -c`, `python -m pgoverlay`, from the checkout's folder)
# run the installed package too: as with -P, no current folder is put first on their sys.path.
os.environ["PYTHONSAFEPATH"] = "1"


def installed_source() -> Path | None:
    """The copy of the checkout the running pgoverlay was installed from (PREFIX/src, readable
    by everyone); ``None`` when it runs this checkout's own code (an editable install)."""
    spec = importlib.util.find_spec("pgoverlay.runner")
    assert spec is not None and spec.origin is not None
    if Path(spec.origin).resolve().is_relative_to(ROOT):
        return None
    return Path(sys.prefix).resolve().parent / "src"


def readable() -> Path:
    """This checkout, or the copy of it that was installed: what an unprivileged user (act as
    the runner's user) may read as 'the repository'."""
    return installed_source() or ROOT


def site_packages() -> str:
    """The installed environment's site-packages, by a path other users can follow: not
    through the checkout's `.venv` link, which ``closed_to_others`` closes to them."""
    return os.path.realpath(sysconfig.get_paths()["purelib"])


@contextlib.contextmanager
def closed_to_others() -> Iterator[None]:
    """The checkout closed to every user but its owner while the tests run, as a clone under
    /root is: a test that runs a checkout's file as another user (the runner's, the
    listener's), rather than the installed copy's (``readable()``), then fails wherever the
    checkout lives, not only under /root. Only when the tests run the installed copy (an
    editable install needs the checkout open); the folder's mode is put back when the run ends,
    if this run changed it (two runs of one checkout at once: the first to end reopens it)."""
    mode = stat.S_IMODE(ROOT.stat().st_mode)
    closed = mode & ~0o077
    if installed_source() is None or os.geteuid() != 0 or closed == mode:
        yield
        return
    # Started as `.venv/bin/python` (the checkout's link to the installed environment), the
    # interpreter the tests hand to other users would be a path through the closed checkout:
    # they run it through the link's target instead, as scripts/test.sh starts it.
    executable = sys.executable
    venv = ROOT / ".venv"
    if Path(executable).is_relative_to(venv):
        sys.executable = os.fspath(venv.resolve() / Path(executable).relative_to(venv))
    ROOT.chmod(closed)
    try:
        yield
    finally:
        sys.executable = executable
        if stat.S_IMODE(ROOT.stat().st_mode) == closed:
            ROOT.chmod(mode)


def _files(top: Path) -> dict[str, Path]:
    found = {}
    for folder, dirs, files in os.walk(top):
        skip = NOT_COPIED | (NOT_COPIED_AT_TOP if Path(folder) == top else set())
        dirs[:] = [d for d in dirs if d not in skip and not d.endswith(".egg-info")]
        for name in files:
            if name in skip:  # a worktree's .git is a file
                continue
            path = Path(folder) / name
            found[os.fspath(path.relative_to(top))] = path
    return found


# Folders of the checkout nothing runs from the installed copy: pytest runs the checkout's tests.
NOT_RUN = ("tests/", "docs/", "bench/")


def difference(source: Path) -> str | None:
    """The first file in which the installed copy ``source`` and this checkout differ (outside
    the folders nothing runs from the copy)."""
    if not source.is_dir():
        return f"there is no {source}"
    mine, theirs = _files(ROOT), _files(source)
    for name in sorted(n for n in mine.keys() | theirs.keys() if not n.startswith(NOT_RUN)):
        if name not in theirs:
            return f"{name} is not in {source}"
        if name not in mine:
            return f"{source / name} is not in the checkout"
        if mine[name].read_bytes() != theirs[name].read_bytes():
            return f"{name} differs from {source / name}"
    return None


def problem(*, group: str) -> str | None:
    """Why the tests' unprivileged users would not run this checkout's code; ``None`` if they do."""
    from pgoverlay.runner import interpreter

    source = installed_source()
    if source is not None:
        changed = difference(source)
        if changed is not None:
            return (
                f"the installed pgoverlay ({sys.prefix}) is not this checkout's code: {changed}: "
                "run scripts/install.sh (or scripts/test.sh)"
            )
    found = interpreter.refusal(interpreter.needed(), gid=interpreter.group_id(group))
    if found is None:
        return None
    if source is not None:  # installed, but started by a path through the checkout (.venv)
        python = Path(sys.prefix).resolve() / "bin" / "python"
        fix = f"run `{python} -P -m pytest`, the installed interpreter by its own path"
    else:
        fix = (
            "run the tests with scripts/test.sh, which installs the package where they can "
            "read it (/usr/local/lib/pgoverlay, from Debian's /usr/bin/python3)"
        )
    return f"the users the tests start cannot run this pgoverlay: {found}: {fix}"
