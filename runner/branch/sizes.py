"""Size of a branch's writable (upper) OverlayFS layer.

``du`` reports allocated blocks, but on XFS with reflink an OverlayFS copy-up is
a reflink clone: its blocks are shared with the lower layer and cost nothing
until rewritten. The FIEMAP ioctl flags each extent as SHARED or not, so
summing the unshared extents gives the space the branch really owns.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

logger = logging.getLogger(__name__)

FS_IOC_FIEMAP = 0xC020660B
FIEMAP_MAX_OFFSET = 0xFFFF_FFFF_FFFF_FFFF
FIEMAP_EXTENT_LAST = 0x1
FIEMAP_EXTENT_UNKNOWN = 0x2
FIEMAP_EXTENT_DELALLOC = 0x4
FIEMAP_EXTENT_DATA_INLINE = 0x200
FIEMAP_EXTENT_SHARED = 0x2000

# struct fiemap: fm_start, fm_length, fm_flags, fm_mapped_extents, fm_extent_count, fm_reserved
_FIEMAP = struct.Struct("=QQIIII")
# struct fiemap_extent: fe_logical, fe_physical, fe_length, fe_reserved64[2], fe_flags,
# fe_reserved[3]
_EXTENT = struct.Struct("=QQQ16xI12x")
assert _FIEMAP.size == 32 and _EXTENT.size == 56
_BATCH = 512

# errno values meaning "this filesystem (or file) cannot be mapped with FIEMAP"
_UNSUPPORTED = frozenset({errno.EOPNOTSUPP, errno.ENOTTY})
# errno values meaning "the file went away or was replaced while we walked"
_VANISHED = frozenset({errno.ENOENT, errno.ELOOP})


@dataclass(frozen=True)
class Extent:
    """One FIEMAP extent: byte offset in the file, byte length, FIEMAP_EXTENT_* flags."""

    logical: int
    length: int
    flags: int


@dataclass(frozen=True)
class LayerSize:
    """Logical (sum of file sizes) and physical exclusive (unshared blocks) bytes."""

    logical_bytes: int
    physical_bytes: int


def exclusive_bytes(extents: Iterable[Extent]) -> int:
    """Sum the lengths of extents not shared with another file.

    Delalloc, unknown-location and inline extents are not shared, so they count.
    """
    return sum(e.length for e in extents if not e.flags & FIEMAP_EXTENT_SHARED)


def _fd_extents(fd: int) -> list[Extent]:
    """Map every extent of an open file, ``_BATCH`` extents per ioctl call.

    FIEMAP_FLAG_SYNC is not set (it would force writeback on a live server), so a
    rewrite of a shared block still counts as shared until the kernel writes it back.
    """
    extents: list[Extent] = []
    start = 0
    while True:
        buf = bytearray(_FIEMAP.size + _EXTENT.size * _BATCH)
        _FIEMAP.pack_into(buf, 0, start, FIEMAP_MAX_OFFSET - start, 0, 0, _BATCH, 0)
        fcntl.ioctl(fd, FS_IOC_FIEMAP, buf, True)
        mapped = _FIEMAP.unpack_from(buf, 0)[3]
        if mapped == 0:
            return extents
        for i in range(mapped):
            logical, _physical, length, flags = _EXTENT.unpack_from(
                buf, _FIEMAP.size + i * _EXTENT.size
            )
            extents.append(Extent(logical, length, flags))
        last = extents[-1]
        next_start = last.logical + last.length
        if last.flags & FIEMAP_EXTENT_LAST or not start < next_start < FIEMAP_MAX_OFFSET:
            return extents  # done, or no progress (guards against a looping ioctl)
        start = next_start


def file_extents(path: str | os.PathLike[str]) -> list[Extent]:
    """Return the extents of a file (symlinks are not followed).

    Raises OSError, e.g. EOPNOTSUPP or ENOTTY when the filesystem has no FIEMAP.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        return _fd_extents(fd)
    finally:
        os.close(fd)


def _walk_files(root: str) -> Iterator[str]:
    """Yield paths of regular files under root, never following symlinks."""
    stack = [root]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = list(it)
        except FileNotFoundError:
            continue  # directory removed while we walked
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    yield entry.path
            except FileNotFoundError:
                continue


def _measure_file(path: str) -> tuple[tuple[int, int], int, int] | None:
    """Return ((dev, ino), logical, physical) for a regular file, None if it vanished."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except PermissionError:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        logger.warning("cannot open %s; counting its allocated blocks instead", path)
        return (st.st_dev, st.st_ino), st.st_size, st.st_blocks * 512
    except OSError as exc:
        if exc.errno in _VANISHED:
            return None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        try:
            physical = exclusive_bytes(_fd_extents(fd))
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED:
                raise
            logger.debug("no FIEMAP for %s (%s); using st_blocks", path, exc.strerror)
            physical = st.st_blocks * 512
        return (st.st_dev, st.st_ino), st.st_size, physical
    finally:
        os.close(fd)


def layer_size(root: str | os.PathLike[str]) -> LayerSize:
    """Measure the regular files under directory ``root``, each inode once.

    Files that vanish during the walk (a live server writes in the tree) are skipped.
    """
    top = os.fspath(root)
    if not stat.S_ISDIR(os.lstat(top).st_mode):  # the layer itself is never a link
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), top)
    seen: set[tuple[int, int]] = set()
    logical = physical = 0
    for path in _walk_files(top):
        measured = _measure_file(path)
        if measured is None:
            continue
        key, size, exclusive = measured
        if key in seen:
            continue
        seen.add(key)
        logical += size
        physical += exclusive
    logger.debug("layer %s: logical=%d physical=%d", top, logical, physical)
    return LayerSize(logical_bytes=logical, physical_bytes=physical)
