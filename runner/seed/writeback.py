"""Make a seed's copy durable while it is made, rather than in one flush after it.

``pg_basebackup --no-sync`` leaves the whole copy in the page cache: on a host with RAM to spare
nothing reaches the disk until the preparing server's ``syncfs`` (``recovery_init_sync_method``)
writes all of it, seconds spent after the copy (4.5 s of a 15.3 s seed at 5 GiB). A plain
``pg_basebackup`` pays the same flush at its end. Here the thread that checksums the copy as it
grows (``verify.Watch``) also asks the kernel to start writing each file's new bytes
(``sync_file_range(SYNC_FILE_RANGE_WRITE)``: it starts the writes and does not wait for them),
so the disk writes the copy while ``pg_basebackup`` still streams it, and the ``syncfs`` at the
start finds little left to write. Durability does not rest on this: the ``syncfs`` still runs
before the server writes anything, and :func:`syncfs` runs again before the base is declared
ready.

Python's ``os`` has neither ``sync_file_range(2)`` nor ``syncfs(2)``: both are called from libc
through ``ctypes`` (Linux, as the pool is).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>: start writing the range's dirty pages, do not wait
STEP = 8 << 20  # push a growing file once this many new bytes are there
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
_libc.sync_file_range.restype = ctypes.c_int
_libc.syncfs.argtypes = [ctypes.c_int]
_libc.syncfs.restype = ctypes.c_int


def _check(result: int, what: str) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")


def start_writing(fd: int, offset: int, length: int) -> None:
    """Start writing ``length`` bytes of open file ``fd`` from ``offset``; do not wait."""
    _check(_libc.sync_file_range(fd, offset, length, SYNC_FILE_RANGE_WRITE), "sync_file_range")


def syncfs(path: Path) -> None:
    """Write everything of the filesystem holding directory ``path`` to disk, and wait
    (``path`` is opened without following a link)."""
    fd = os.open(path, _DIR)
    try:
        _check(_libc.syncfs(fd), "syncfs")
    finally:
        os.close(fd)


class Writeback:
    """What has been pushed of each file of a copy being made, by manifest path."""

    def __init__(self, *, step: int = STEP) -> None:
        self.step = step
        self.pushed: dict[str, int] = {}

    def push(self, path: str, dir_fd: int, name: str, size: int, *, finished: bool) -> None:
        """Start writing the bytes of ``name`` (in directory ``dir_fd``) past what was pushed:
        once ``step`` of them are there, or all of them once the file is ``finished``."""
        done = self.pushed.get(path, 0)
        if size <= done or (size - done < self.step and not finished):
            return
        fd = os.open(name, _FILE, dir_fd=dir_fd)
        try:
            start_writing(fd, done, size - done)
        finally:
            os.close(fd)
        self.pushed[path] = size
