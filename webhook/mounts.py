"""A job's view of the filesystem, made inside its sandbox (see ``sandbox.py``): every mount
read-only, and writable only where the job gets a place of its own.

Run as a file (``python -I -S mounts.py SCRATCH``) by the namespace's root, in the job's new
mount namespace, before it drops to the job's uid: so nothing but the standard library, and
no import of pgoverlay.

Listing the places a job must not share (``/tmp``, ``/dev/shm``, ``/var/tmp``, ``/run/lock``,
and whatever world-writable folder a host has besides) would leave out the next one. Instead:

1. every mount of the namespace becomes read-only, in one ``mount_setattr`` call
   (``AT_RECURSIVE``: mounts the host added are included, and the ones the host adds later do
   not propagate into a private namespace). Writing a device (``/dev/null``) still works;
2. the job's scratch folder is bound on ``/tmp`` and made writable again (only the read-only
   flag set in step 1 is cleared: the flags the host locked stay);
3. each of ``PRIVATE`` gets a fresh, empty tmpfs, where it exists: programs expect to write
   there. All of it is gone when the namespace ends.
"""

from __future__ import annotations

import ctypes
import os
import sys

SCRATCH_AT = "/tmp"  # noqa: S108 - the job's own scratch folder, mounted here in its namespace
PRIVATE = ("/dev/shm", "/var/tmp", "/run/lock")  # noqa: S108 - fresh tmpfs, per job

_SYS_MOUNT_SETATTR = 442  # the same number on every architecture (added in Linux 5.12)
_AT_FDCWD = -100
_AT_RECURSIVE = 0x8000
_MOUNT_ATTR_RDONLY = 0x1
_MS_BIND = 0x1000
_MS_NOSUID = 0x2
_MS_NODEV = 0x4

_libc = ctypes.CDLL(None, use_errno=True)


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _set_read_only(path: str, *, read_only: bool, recursive: bool) -> None:
    attr = _MountAttr(
        attr_set=_MOUNT_ATTR_RDONLY if read_only else 0,
        attr_clr=0 if read_only else _MOUNT_ATTR_RDONLY,
    )
    flags = _AT_RECURSIVE if recursive else 0
    result = _libc.syscall(
        _SYS_MOUNT_SETATTR,
        _AT_FDCWD,
        path.encode(),
        flags,
        ctypes.byref(attr),
        ctypes.sizeof(attr),
    )
    _check(result, f"mount_setattr {path}")


def _mount(source: str, target: str, kind: str | None, flags: int, data: str | None) -> None:
    result = _libc.mount(
        source.encode(),
        target.encode(),
        kind.encode() if kind else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    _check(result, f"mount {target}")


def confine(scratch: str) -> None:
    """Make this mount namespace the job's view (see the module's docstring)."""
    _set_read_only("/", read_only=True, recursive=True)
    _mount(scratch, SCRATCH_AT, None, _MS_BIND, None)
    _set_read_only(SCRATCH_AT, read_only=False, recursive=False)
    for path in PRIVATE:
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777")


if __name__ == "__main__":
    confine(sys.argv[1])
