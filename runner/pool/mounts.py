"""Mounts: what is mounted (from /proc/self/mountinfo) and the calls that change it."""

from __future__ import annotations

import ctypes
import errno
import functools
import os
from pathlib import Path

from pgoverlay.errors import CommandError, OverlayUnsupportedError, PoolFullError
from pgoverlay.runner import proc, safefs
from pgoverlay.runner.polling import wait_for

MOUNT_TIMEOUT = 60.0


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    out, i = [], 0
    while i < len(field):
        chunk = field[i + 1 : i + 4]
        if field[i] == "\\" and len(chunk) == 3 and chunk.isdigit():
            out.append(chr(int(chunk, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> dict[str, str]:
    """Mount point -> filesystem type, for every line of a mountinfo file (last mount wins)."""
    points: dict[str, str] = {}
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split()
        points[_unescape(fields[4])] = right.split()[0]
    return points


def parse_options(text: str) -> dict[str, frozenset[str]]:
    """Mount point -> its options: the mount's own (``noatime``) and its filesystem's
    (``discard``), for every line of a mountinfo file (last mount wins)."""
    points: dict[str, frozenset[str]] = {}
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, super_fields = left.split(), right.split()
        own = fields[5].split(",")
        fs = super_fields[2].split(",") if len(super_fields) > 2 else []
        points[_unescape(fields[4])] = frozenset(own + fs)
    return points


def mounted() -> dict[str, str]:
    return parse_mountinfo(Path("/proc/self/mountinfo").read_text())


def containing(path: Path) -> str:
    """The mount point of the filesystem that holds ``path``."""
    target = os.fspath(path.resolve())
    best = "/"
    for point in mounted():
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best):
            best = point
    return best


def options(point: str | os.PathLike[str]) -> frozenset[str]:
    """The options ``point`` is mounted with (empty if it is not a mount point)."""
    return parse_options(Path("/proc/self/mountinfo").read_text()).get(
        os.fspath(point), frozenset()
    )


def is_mounted(path: Path) -> bool:
    return os.fspath(path) in mounted()


def mounts_under(prefix: Path) -> list[str]:
    root = os.fspath(prefix).rstrip("/") + "/"
    return sorted((p for p in mounted() if p.startswith(root)), key=len, reverse=True)


def overlay_supported() -> bool:
    if "overlay" in Path("/proc/filesystems").read_text():
        return True
    proc.run(["modprobe", "overlay"], timeout=30, check=False)
    return "overlay" in Path("/proc/filesystems").read_text()


def check_option_path(path: Path) -> str:
    text = os.fspath(path)
    if any(c in text for c in ",:\\\n"):
        raise OverlayUnsupportedError(
            f"path {text!r} contains a character OverlayFS options cannot carry (, : \\); "
            "choose a PGOVERLAY_HOME without them"
        )
    return text


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _syscall_failed(what: str, target: Path) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{what} {target}: {os.strerror(code)}")


def _mount(source: str, target: Path, fstype: str, options: str) -> None:
    """mount(2) itself. A branch's create and destroy each change one mount: running the
    `mount` program for it cost a fork and exec of this (large) process and a read of fstab,
    about 20 ms each time. Python's standard library has no mount call."""
    done = _libc().mount(
        source.encode(), os.fsencode(target), fstype.encode(), ctypes.c_ulong(0), options.encode()
    )
    if done != 0:
        raise _syscall_failed("mount", target)


UMOUNT_NOFOLLOW = 8  # <sys/mount.h>: a link at ``target`` is not followed


def _umount(target: Path) -> bool:
    """umount2(2), never through a link; False while the mount is busy (a process still has a
    file open there)."""
    if _libc().umount2(os.fsencode(target), UMOUNT_NOFOLLOW) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOENT):  # not a mount point (any more)
        return True
    if code == errno.EBUSY:
        return False
    raise _syscall_failed("umount", target)


def mount_overlay(*, lower: Path, upper: Path, work: Path, target: Path) -> None:
    # Each path must be the real directory pgoverlay made, reached through no link: a link
    # would let whoever made it choose what root mounts, or where.
    for path in (lower, upper, work, target):
        safefs.require_real_dir(path)
    options = (
        f"lowerdir={check_option_path(lower)},upperdir={check_option_path(upper)},"
        f"workdir={check_option_path(work)}"
    )
    try:
        _mount("overlay", target, "overlay", options)
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise PoolFullError("the pool is full: destroy branches or grow the pool") from None
        raise CommandError(
            f"{err.strerror}: the kernel refused the overlay (its log, `dmesg`, says why; "
            "`pgoverlay doctor` checks that OverlayFS works here)"
        ) from None


def bind_readonly(source: Path, target: Path) -> None:
    """Bind ``source`` at ``target`` read-only: nobody, root included, writes through it."""
    if not is_mounted(target):
        for path in (source, target):
            safefs.require_real_dir(path)
        proc.run(["mount", "--bind", source, target], timeout=MOUNT_TIMEOUT)
    proc.run(["mount", "-o", "remount,bind,ro", target], timeout=MOUNT_TIMEOUT)


def unmount(target: Path, *, timeout: float = MOUNT_TIMEOUT) -> None:
    """Unmount ``target`` if mounted, retrying while it is busy."""

    def attempt() -> bool:
        return _umount(target) and not is_mounted(target)

    wait_for(attempt, timeout=timeout, what=f"{target} to unmount", first_interval=0.05)
