"""Tablespaces of a base live inside its data directory, as in-place tablespaces.

``pg_basebackup`` writes each tablespace of the source into a directory next to the staging
copy (``--tablespace-mapping``) and leaves a symlink to it in ``pg_tblspc/``. After the copy is
verified, each symlink is replaced by the directory itself (a rename within the pool's
filesystem, no data copied). The base is then one self-contained directory: the branch's single
overlay is its copy-on-write layer for tablespaces too, no link points outside a branch, and the
same base works unchanged where host paths differ (a container).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Iterable
from pathlib import Path

from pgoverlay.errors import SeedError
from pgoverlay.runner import safefs
from pgoverlay.runner.seed.source import Tablespace


def staging_root(staging: Path) -> Path:
    """Where the tablespaces of the copy in ``staging`` land during the backup."""
    return staging.with_name(staging.name + ".tblspc")


def _escape(path: str) -> str:
    return path.replace("=", "\\=")


def mapping_args(tablespaces: Iterable[Tablespace], root: Path) -> list[str]:
    """``pg_basebackup`` options that send every tablespace of the source under ``root``."""
    return [
        f"--tablespace-mapping={_escape(t.location)}={_escape(os.fspath(root / str(t.oid)))}"
        for t in tablespaces
        if t.outside
    ]


def make_in_place(datadir: Path, root: Path) -> list[str]:
    """Move every tablespace the backup put under ``root`` into ``datadir/pg_tblspc``, in place
    of its symlink. Returns the tablespace OIDs moved.

    Both directories are the Postgres user's: root works through their file descriptors, so no
    link that user might add leads it elsewhere."""
    moved: list[str] = []
    if not (datadir / "pg_tblspc").is_dir():
        remove(root)
        return moved
    with contextlib.ExitStack() as stack:
        tblspc = stack.enter_context(safefs.dir_under(datadir, "pg_tblspc"))
        root_fd = stack.enter_context(safefs.dir_under(root)) if root.is_dir() else -1
        for name in sorted(os.listdir(tblspc)):
            if not stat.S_ISLNK(os.stat(name, dir_fd=tblspc, follow_symlinks=False).st_mode):
                continue  # in place already
            target = Path(os.readlink(name, dir_fd=tblspc))
            if root_fd < 0 or target.parent != root or not name.isdigit():
                raise SeedError(
                    f"tablespace {name} of the copy points to {target}, outside the seed's "
                    "staging area (a tablespace created on the source during the copy?): "
                    "seed again"
                )
            os.unlink(name, dir_fd=tblspc)
            os.rename(target.name, name, src_dir_fd=root_fd, dst_dir_fd=tblspc)
            moved.append(name)
    remove(root)
    return moved


def has_in_place(datadir: Path) -> bool:
    """True if ``datadir`` has an in-place tablespace: Postgres then needs
    ``allow_in_place_tablespaces=on`` to finish any recovery (a PANIC otherwise)."""
    tblspc = datadir / "pg_tblspc"
    return tblspc.is_dir() and any(p.is_dir() and not p.is_symlink() for p in tblspc.iterdir())


def remove(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
