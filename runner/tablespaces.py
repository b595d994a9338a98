"""Tablespaces of a base live inside its data directory, as in-place tablespaces.

``pg_basebackup`` writes each tablespace of the source into a directory next to the staging
copy (``--tablespace-mapping``) and leaves a symlink to it in ``pg_tblspc/``. After the copy is
verified, each symlink is replaced by the directory itself (a rename within the pool's
filesystem, no data copied). The base is then one self-contained directory: the branch's single
overlay is its copy-on-write layer for tablespaces too, no link points outside a branch, and the
same base works unchanged where host paths differ (a container).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from pgoverlay.errors import SeedError
from pgoverlay.runner.sourceinfo import Tablespace


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
    of its symlink. Returns the tablespace OIDs moved."""
    moved: list[str] = []
    tblspc = datadir / "pg_tblspc"
    for link in sorted(tblspc.iterdir()) if tblspc.is_dir() else []:
        if not link.is_symlink():
            continue  # in place already
        target = Path(os.readlink(link))
        if target.parent.resolve() != root.resolve():
            raise SeedError(
                f"tablespace {link.name} of the copy points to {target}, outside the seed's "
                "staging area (a tablespace created on the source during the copy?): seed again"
            )
        link.unlink()
        target.rename(link)
        moved.append(link.name)
    remove(root)
    return moved


def has_in_place(datadir: Path) -> bool:
    """True if ``datadir`` has an in-place tablespace: Postgres then needs
    ``allow_in_place_tablespaces=on`` to finish any recovery (a PANIC otherwise)."""
    tblspc = datadir / "pg_tblspc"
    return tblspc.is_dir() and any(p.is_dir() and not p.is_symlink() for p in tblspc.iterdir())


def remove(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
