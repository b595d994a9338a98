"""Make what a seed wrote durable before the base is declared ready.

The copy is synced by the preparing server's start (``recovery_init_sync_method = syncfs``,
before it writes anything); the clean shutdown and ``pg_resetwal`` sync what they write. What
nothing synced is what the seed did after that: masking's removals and the move into the store.
:func:`syncfs` writes the pool's filesystem once more before the version is registered ready, so
a crash after "ready" cannot lose the base.

Starting the copy's disk writes while ``pg_basebackup`` streams it (``sync_file_range`` on each
file as it grows) was tried and measured: at 5 GiB it made the copy 4 s longer (the disk reads the
source and writes the copy at once) for 1.7 s less flushing after it (docs/benchmarks.md).

Python's ``os`` has no ``syncfs(2)``: it is called from libc through ``ctypes`` (Linux, as the
pool is).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.syncfs.argtypes = [ctypes.c_int]
_libc.syncfs.restype = ctypes.c_int


def syncfs(path: Path) -> None:
    """Write everything of the filesystem holding directory ``path`` to disk, and wait
    (``path`` is opened without following a link)."""
    fd = os.open(path, _DIR)
    try:
        if _libc.syncfs(fd) != 0:
            number = ctypes.get_errno()
            raise OSError(number, f"syncfs: {os.strerror(number)}")
    finally:
        os.close(fd)
