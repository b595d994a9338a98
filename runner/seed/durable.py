"""Make what a seed wrote durable before the base is declared ready.

The copy is written with ``pg_basebackup --no-sync`` and prepared by a server running with
``fsync = off``: nothing is flushed while the seed works, since a seed cut short by a crash is
removed whole (its version is still ``seeding``) and only a ready base must be on disk. Two
calls make it so. :func:`flushing` starts the flush of the copy as soon as it is made, in a
thread, while the copy is verified and the server prepares it (the flush is the disk's work,
verifying and preparing the CPU's, from the page cache: they overlap). :func:`syncfs` then
writes what is left, the preparation's changes, masking's removals and the move into the store,
and waits for all of it, before the version is registered ready: one flush of each byte, where
the server's start (``recovery_init_sync_method = syncfs``), its checkpoints and ``pg_resetwal``
used to flush in turn, each waiting.

``syncfs(2)`` writes the whole filesystem of the pool, other branches' dirty pages included: a
flush per file of the copy would write only the base, but costs a system call and a device flush
per file.

Starting the copy's disk writes while ``pg_basebackup`` streams it (``sync_file_range`` on each
file as it grows) was tried and measured: at 5 GiB it made the copy 4 s longer (the disk reads the
source and writes the copy at once) for 1.7 s less flushing after it (docs/benchmarks.md).

Python's ``os`` has no ``syncfs(2)``: it is called from libc through ``ctypes`` (Linux, as the
pool is), found among the symbols the interpreter already loaded (``dlopen(NULL)``): asking
``ctypes.util.find_library`` would run ``ldconfig -p`` in a child at every seed's start.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pgoverlay.errors import SeedError

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

_libc = ctypes.CDLL(None, use_errno=True)  # the interpreter's own libc
_libc.syncfs.argtypes = [ctypes.c_int]
_libc.syncfs.restype = ctypes.c_int


def syncfs(path: Path) -> None:
    """Write everything of the filesystem holding directory ``path`` to disk, and wait
    (``path`` is opened without following a link); a :class:`SeedError` when the disk
    refuses."""
    fd = os.open(path, _DIR)
    try:
        if _libc.syncfs(fd) != 0:
            number = ctypes.get_errno()
            raise SeedError(
                f"the base could not be written to the pool's disk (syncfs: "
                f"{os.strerror(number)}); it is removed: check the disk under the pool "
                "(dmesg, free space), then seed again"
            )
    finally:
        os.close(fd)


@contextmanager
def flushing(path: Path) -> Iterator[None]:
    """Flush the filesystem holding ``path`` in a thread while the block runs (``ctypes``
    releases the GIL for the call); the block's end waits for it and raises its error. It
    starts the disk's work early; :func:`syncfs` after it is still what makes a base durable."""
    failed: list[Exception] = []

    def flush() -> None:
        try:
            syncfs(path)
        except Exception as err:  # raised in the seed's thread, below
            failed.append(err)

    thread = threading.Thread(target=flush, name="seed-flush", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()
    if failed:
        raise failed[0]
