"""Freed blocks go back to the host: nothing a destroyed branch, a reset or a seed held lingers in
the pool image.

The pool's XFS image is loop-mounted with ``discard``: when XFS frees an extent it discards it
after the log commits, and the loop device punches that range out of ``pool.img``. The host's
disk use then follows what the pool holds, and the bytes a masked seed's staging copy held
before masking (its originals) are not left in the image's free space.

XFS does not take ``discard`` on a remount, so a pool image mounted before without it is mounted
again by ``pool init`` when no branch uses it (see :func:`can_remount`). Until then,
:func:`release` trims the pool with ``fstrim`` after every destroy, reset and seed.

Native and plain pools live on the host's own filesystem: whether it discards freed blocks
(mounted with ``discard``, or trimmed by the admin's ``fstrim.timer``) is the host's business;
``doctor`` says which it is.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from pgoverlay.runner import proc
from pgoverlay.runner.pool import mounts

log = logging.getLogger(__name__)

IMAGE_MOUNT_OPTIONS = "loop,noatime,discard"
TRIM_TIMEOUT = 600.0


def discards(point: str | os.PathLike[str]) -> bool:
    """Is ``point`` mounted so that freed blocks are discarded (``discard``, btrfs's
    ``discard=async``)?"""
    return any(o == "discard" or o.startswith("discard=") for o in mounts.options(point))


def allocated_bytes(path: Path) -> int:
    """What ``path`` really occupies on its filesystem (a sparse file's holes cost nothing)."""
    return path.stat().st_blocks * 512


def trim(point: Path, *, timeout: float = TRIM_TIMEOUT) -> None:
    """Discard every free block of the filesystem mounted at ``point`` (root only).

    XFS frees a removed file's blocks in the background; ``sync -f`` (syncfs) waits for that
    first, or blocks freed a moment later would not be trimmed."""
    proc.run(["sync", "-f", point], timeout=timeout)
    proc.run(["fstrim", point], timeout=timeout)


def release(root: Path, *, image_mode: bool) -> None:
    """After blocks were freed in the pool at ``root``: give them back to the host now, unless the
    mount does it itself. Only an image pool is ours to trim, and only root may."""
    if not image_mode or discards(root):
        return
    if os.geteuid() != 0:
        log.warning(
            "the pool image is mounted without discard and this user cannot trim it: run "
            "`pgoverlay pool init` as root to give freed blocks back to the host"
        )
        return
    trim(root)


def can_remount(root: Path, *, branches: int) -> bool:
    """Can the pool image at ``root`` be unmounted to be mounted with discard? Only when no branch
    exists (a branch's overlay keeps the filesystem alive after the unmount, and XFS would then
    refuse a second mount of it) and nothing but the read-only base binds is mounted on it."""
    bases = os.fspath(root / "bases").rstrip("/") + "/"
    return branches == 0 and all(p.startswith(bases) for p in mounts.mounts_under(root))
