"""Can the members of the service's group run this installation of pgoverlay?

The runner's user, the webhook listener and the systemd units run `pgoverlay` as themselves.
An interpreter or an environment under a private folder (a pyenv build under /root, an editable
install in a checkout under /root, both 0700) answers them "Permission denied". This reads the
mode of every folder on the way to what the command needs, as a member of the group who owns
none of them sees it (ACLs are not read). `scripts/install.sh` also runs the installed command
as such a member; this says which path stops them.
"""

from __future__ import annotations

import grp
import importlib.util
import os
import pwd
import stat
import sys
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

# What `pgoverlay` imports from its own code: an editable install keeps these in its checkout.
PACKAGES = ("pgoverlay", "pgoverlay.runner", "pgoverlay.action", "pgoverlay.webhook")
_WORDS = {os.X_OK: "run", os.R_OK: "read", os.R_OK | os.X_OK: "read"}


@dataclass(frozen=True)
class Refusal:
    """The first path a member of the group cannot use, and why."""

    path: Path
    needs: str  # "enter", "read" or "run"
    mode: str  # e.g. "drwx------ root:root"

    def __str__(self) -> str:
        return f"{self.path} ({self.mode}): they cannot {self.needs} it"


def needed() -> list[tuple[Path, int]]:
    """What running this `pgoverlay` reads, each with the access it needs: the interpreter, its
    standard library, the environment's packages and pgoverlay's own folders."""
    paths = [
        (Path(sys.executable), os.X_OK),
        (Path(sysconfig.get_path("stdlib")), os.R_OK | os.X_OK),
        (Path(sysconfig.get_path("purelib")), os.R_OK | os.X_OK),
        (Path(sysconfig.get_path("platlib")), os.R_OK | os.X_OK),
    ]
    if sys.prefix != sys.base_prefix:
        paths.append((Path(sys.prefix) / "pyvenv.cfg", os.R_OK))
    script = Path(sys.prefix) / "bin" / "pgoverlay"  # what /usr/local/bin/pgoverlay links to
    if script.exists():
        paths.append((script, os.R_OK | os.X_OK))
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin is not None:
            paths += _tree(Path(spec.origin).parent)
    return paths


def _tree(folder: Path) -> Iterator[tuple[Path, int]]:
    """A package folder, its subfolders and its files (each file must be readable)."""
    for top, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        yield Path(top), os.R_OK | os.X_OK
        for name in files:
            yield Path(top) / name, os.R_OK


def refusal(paths: Iterable[tuple[Path, int]], *, gid: int | None) -> Refusal | None:
    """The first of ``paths`` a member of group ``gid`` (``None``: anyone) who is not root and
    owns none of them cannot reach with the access it needs; ``None`` when they all can. A
    path's folders must let them in, as written and once its links are resolved."""
    seen: set[Path] = set()
    for path, want in paths:
        for candidate in dict.fromkeys((Path(os.path.abspath(path)), Path(os.path.realpath(path)))):
            for folder in reversed(candidate.parents):
                if folder not in seen:
                    found = _denied(folder, os.X_OK, gid, needs="enter")
                    if found is not None:
                        return found
                    seen.add(folder)
            found = _denied(candidate, want, gid, needs=_WORDS[want])
            if found is not None:
                return found
    return None


def _denied(path: Path, want: int, gid: int | None, *, needs: str) -> Refusal | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None  # nothing to reach: what imports it says so
    # Like the kernel: a member of the file's group gets the group's bits, not the others'.
    bits = (st.st_mode >> 3 if gid is not None and st.st_gid == gid else st.st_mode) & 0o7
    if bits & want == want:
        return None
    return Refusal(path=path, needs=needs, mode=f"{stat.filemode(st.st_mode)} {_owners(st)}")


def _owners(st: os.stat_result) -> str:
    try:
        user = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        user = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return f"{user}:{group}"


def group_id(name: str) -> int | None:
    """The group's id; ``None`` when it does not exist yet (then anyone must reach it)."""
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None
