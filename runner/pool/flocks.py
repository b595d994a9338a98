"""Advisory file locks (flock): released by the kernel when their holder dies, even by kill -9.

A saga holds its object's lock for its whole run; ``gc`` only repairs an object whose lock it
can take, so it never undoes work that a live process is still doing.

Lock files are root's, in the root-only ``locks/`` directory; each is opened without following
a link and must be a regular file of this user, or it is refused.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pgoverlay.errors import LockBusyError, PgoverlayError, TimeoutExpiredError
from pgoverlay.runner import safefs
from pgoverlay.runner.polling import wait_for


def _try(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextmanager
def locked(
    path: Path,
    *,
    timeout: float,
    what: str,
    busy: type[PgoverlayError] = LockBusyError,
) -> Iterator[None]:
    """Hold an exclusive lock on ``path``, waiting at most ``timeout`` seconds (0: don't wait).

    Raises ``busy`` if the lock stays taken.
    """
    fd = safefs.open_regular(path, os.O_RDWR | os.O_CREAT, mode=0o600, uid=os.geteuid())
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
    try:
        fd = safefs.open_regular(path, os.O_RDWR, uid=os.geteuid())
    except FileNotFoundError:
        return True
    try:
        if _try(fd):
            fcntl.flock(fd, fcntl.LOCK_UN)
            return True
        return False
    finally:
        os.close(fd)
