"""Reading a file with privileges that someone else may have planted or swapped.

Root reads two kinds of files it does not control: the admin's ``--password-file`` and a pull
request's migration files. Both are opened without blocking (a FIFO does not hang the open),
checked with ``fstat`` on the open descriptor (a regular file, no device, FIFO or directory;
a size under a cap), then read at most to the cap. A file that must stay inside a folder
(a checkout) is reached one component at a time from that folder with ``O_NOFOLLOW``, so a
symbolic link that leads out of it, or a directory swapped for a link while it is walked, is
refused rather than followed.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pgoverlay.errors import UnsafeFileError

_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _read_open(fd: int, *, limit: int, what: str) -> bytes:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFileError(f"{what} is {_kind(st.st_mode)}: it must be a regular file")
    if st.st_size > limit:
        raise UnsafeFileError(f"{what} is {st.st_size} bytes, more than the {limit} bytes allowed")
    chunks: list[bytes] = []
    total = 0
    while total <= limit:
        chunk = os.read(fd, min(1 << 20, limit + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    if total > limit:  # it grew while we read it
        raise UnsafeFileError(f"{what} is more than the {limit} bytes allowed")
    return b"".join(chunks)


def read_regular(path: Path, *, limit: int, what: str) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes (links are followed:
    for a file the caller chose, such as the admin's password file)."""
    try:
        fd = os.open(path, _READ)
    except OSError as err:
        raise UnsafeFileError(f"cannot open {what}: {err.strerror}") from None
    try:
        return _read_open(fd, limit=limit, what=what)
    finally:
        os.close(fd)


def inside(root: Path, relative: str | os.PathLike[str]) -> Path | None:
    """Where ``root / relative`` leads once every link is resolved, as a path relative to the
    resolved ``root``; None when it leads out of ``root``."""
    top = Path(os.path.realpath(root))
    real = Path(os.path.realpath(top / relative))
    if real != top and top not in real.parents:
        return None
    return real.relative_to(top)


def read_inside(root: Path, relative: str, *, limit: int, what: str) -> bytes:
    """The bytes of the regular file ``relative`` under ``root``, refused if it or a folder on
    the way is a link leading out of ``root``.

    A link that stays inside ``root`` is allowed: it is resolved first, then the resolved path
    is walked from ``root`` with ``O_NOFOLLOW``, so nothing swapped in meanwhile is followed.
    """
    resolved = inside(root, relative)
    if resolved is None:
        raise UnsafeFileError(f"{what} leads out of the checkout: links must stay inside it")
    parts = resolved.parts
    if not parts:
        raise UnsafeFileError(f"{what} is a directory: it must be a regular file")
    try:
        fd = os.open(os.path.realpath(root), _DIR)
    except OSError as err:
        raise UnsafeFileError(f"cannot open the checkout for {what}: {err.strerror}") from None
    try:
        for part in parts[:-1]:
            try:
                step = os.open(part, _DIR, dir_fd=fd)
            except OSError as err:
                raise UnsafeFileError(
                    f"cannot open {what}: folder {part!r} on its way changed ({err.strerror})"
                ) from None
            os.close(fd)
            fd = step
        try:
            leaf = os.open(parts[-1], _READ | os.O_NOFOLLOW, dir_fd=fd)
        except OSError as err:
            raise UnsafeFileError(f"cannot open {what}: {err.strerror}") from None
    finally:
        os.close(fd)
    try:
        return _read_open(leaf, limit=limit, what=what)
    finally:
        os.close(leaf)
