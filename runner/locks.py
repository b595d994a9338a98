"""Advisory file locks (flock): released by the kernel when their holder dies, even by kill -9.

A saga holds its object's lock for its whole run; ``gc`` only repairs an object whose lock it
can take, so it never undoes work that a live process is still doing.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pgoverlay.errors import LockBusyError, PgoverlayError, TimeoutExpiredError
from pgoverlay.runner.polling import wait_for


def _try(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextmanager
def hold(
    path: Path,
    *,
    timeout: float,
    what: str,
    busy: type[PgoverlayError] = LockBusyError,
) -> Iterator[None]:
    """Hold an exclusive lock on ``path``, waiting at most ``timeout`` seconds (0: don't wait).

    Raises ``busy`` if the lock stays taken.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    if os.geteuid() == 0:
        # Lock files belong to whoever owns the locks directory (the branches' user), so a
        # lock that root made first can later be taken by that user too.
        parent = path.parent.stat()
        os.fchown(fd, parent.st_uid, parent.st_gid)
    try:
        if not _try(fd):
            if timeout <= 0:
                raise busy(
                    f"{what} is busy: another pgoverlay process is working on it; "
                    "wait for it to finish"
                )
            try:
                wait_for(lambda: _try(fd), timeout=timeout, what=what, max_interval=0.1)
            except TimeoutExpiredError:
                raise busy(
                    f"{what} stayed busy for {timeout:.0f} s: another pgoverlay process is "
                    "working on it; try again when it finishes"
                ) from None
        yield
    finally:
        os.close(fd)


def is_free(path: Path) -> bool:
    """True if nobody holds the lock at ``path`` right now (or it was never created)."""
    if not path.exists():
        return True
    fd = os.open(path, os.O_RDWR)
    try:
        if _try(fd):
            fcntl.flock(fd, fcntl.LOCK_UN)
            return True
        return False
    finally:
        os.close(fd)
