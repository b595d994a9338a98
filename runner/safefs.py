"""Root's file operations where another user can write: no link is followed, and every file is
checked to be the kind it should be before root reads, writes, chowns or removes it.

The pool's own directories are root's, so a path made of them is safe to walk. Below a
directory the pool's user owns (a branch's upper, work and log directories, a socket directory,
a staging copy), that user may put a symlink, a FIFO or a hard link anywhere at any moment:
these helpers open the last component with ``O_NOFOLLOW`` (and ``O_NONBLOCK``, so a FIFO cannot
block root), walk deeper paths one directory file descriptor at a time, check what they opened
with ``fstat``, and remove trees with ``shutil.rmtree`` (which uses file descriptors and never
follows a link on Linux).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from pgoverlay.errors import UnsafeFileError, UnsafePathError

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
TAIL_BYTES = 64 * 1024

assert shutil.rmtree.avoids_symlink_attacks, "this platform's rmtree follows links"


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
    ):
        if test(mode):
            return name
    return "a regular file"


def _refuse(path: Path | str, why: str) -> UnsafePathError:
    return UnsafePathError(
        f"{path} is {why}: pgoverlay does not follow or trust it (someone other than root "
        "changed the pool's files); remove it and run the command again"
    )


def _check_regular(fd: int, path: Path | str, *, uid: int | None) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, _kind(st.st_mode) + ", not a regular file")
    if st.st_nlink != 1:
        raise _refuse(path, f"a file with {st.st_nlink} hard links")
    if uid is not None and st.st_uid != uid:
        raise _refuse(path, f"owned by uid {st.st_uid}, not {uid}")
    return st


def _blocking(fd: int) -> None:
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)


def open_regular(
    path: Path,
    flags: int,
    *,
    mode: int = 0o600,
    uid: int | None = None,
    dir_fd: int | None = None,
) -> int:
    """Open ``path`` (never through a symlink) and return its descriptor, if it is a regular
    file with one link (and owned by ``uid``, when given); raise UnsafePathError if not."""
    try:
        fd = os.open(path, flags | _NOFOLLOW, mode, dir_fd=dir_fd)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise _refuse(path, "a symbolic link") from None
        if err.errno == errno.ENXIO:  # a FIFO opened for writing without a reader
            raise _refuse(path, "a FIFO") from None
        raise
    try:
        _check_regular(fd, path, uid=uid)
        _blocking(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_log(path: Path, *, uid: int, gid: int) -> int:
    """Open a server's log for appending, as root, in a directory its user owns: a new file is
    made for that user; an existing one must be that user's regular file with one link. Anything
    else in its place (a link to a root file, a FIFO) is removed, never written through."""
    for _ in range(2):
        try:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | _NOFOLLOW
            fd = os.open(path, flags, 0o600)
        except FileExistsError:
            try:
                return open_regular(path, os.O_WRONLY | os.O_APPEND, uid=uid)
            except UnsafePathError:
                path.unlink()  # unlink never follows the link it removes
                continue
        os.fchown(fd, uid, gid)
        _blocking(fd)
        return fd
    raise _refuse(path, "replaced again while it was being made")


def clear_unsafe(path: Path, *, uid: int) -> None:
    """Remove whatever is at ``path`` unless it is ``uid``'s regular file with one link, so a
    program that opens ``path`` later (a server in a container) finds a file or nothing."""
    try:
        os.close(open_regular(path, os.O_RDONLY, uid=uid))
    except FileNotFoundError:
        return
    except UnsafePathError:
        path.unlink()


def read_tail(path: Path, *, limit: int = TAIL_BYTES) -> str | None:
    """The last ``limit`` bytes of a regular file as text; None if it does not exist. Raises
    UnsafePathError for anything else (a link, a FIFO, a hard link to another file)."""
    try:
        fd = open_regular(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - limit), os.SEEK_SET)
        return os.read(fd, limit).decode(errors="replace")
    finally:
        os.close(fd)


def read_small(path: Path, *, limit: int = TAIL_BYTES) -> str | None:
    """The first ``limit`` bytes of a regular file; None if it is missing or not a plain file."""
    try:
        fd = open_regular(path, os.O_RDONLY)
    except (OSError, UnsafePathError):
        return None
    try:
        return os.read(fd, limit).decode(errors="replace")
    finally:
        os.close(fd)


def make_dir(path: Path, *, uid: int, gid: int, mode: int, exist_ok: bool = False) -> None:
    """Create directory ``path`` (or, with ``exist_ok``, take the real directory that is there)
    and give it ``uid``, ``gid`` and ``mode`` through a descriptor, never through a link."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if not exist_ok:
            raise
    try:
        fd = os.open(path, _DIR)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            st = os.lstat(path)
            raise _refuse(path, _kind(st.st_mode) + ", not a directory") from None
        raise
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def repair_file(path: Path, *, uid: int, gid: int, mode: int) -> bool:
    """Give an existing regular file ``uid``, ``gid`` and ``mode``; False if it is missing.
    Raises UnsafePathError if it is a link or not a regular file."""
    try:
        fd = open_regular(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return True


def write_new(path: Path, text: str, *, uid: int, gid: int, mode: int) -> None:
    """Write ``text`` to a file made afresh at ``path`` (whatever was there is removed first)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
        _blocking(fd)
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def write_whole(path: Path, text: str, *, uid: int, gid: int, mode: int) -> None:
    """Replace ``path`` with ``text``, written to a file of this call's own beside it and then
    renamed into place: a reader sees all of it or none, and two writers at once never share
    the partial file."""
    partial = path.with_name(f".{path.name}.{os.urandom(8).hex()}.partial")
    write_new(partial, text, uid=uid, gid=gid, mode=mode)
    try:
        os.replace(partial, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)


def remove_tree(path: Path) -> None:
    """Remove ``path``: a directory with everything in it, or a file or link (the link itself).
    Missing is fine."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def empty_fd(fd: int) -> None:
    """Remove everything inside the directory open at ``fd``, following no link."""
    for name in os.listdir(fd):
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(name, dir_fd=fd)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=fd)


def empty_dir(path: Path) -> None:
    """Remove everything inside directory ``path`` (nothing if it is missing or a link)."""
    try:
        fd = os.open(path, _DIR)
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as err:
        if err.errno == errno.ELOOP:
            return
        raise
    try:
        empty_fd(fd)
    finally:
        os.close(fd)


def _parts(relative: str | os.PathLike[str]) -> list[str]:
    rel = PurePosixPath(relative)
    if rel.is_absolute() or any(part in ("..", "") for part in rel.parts):
        raise _refuse(os.fspath(relative), "not a plain path inside its directory")
    return [part for part in rel.parts if part != "."]


@contextlib.contextmanager
def dir_under(root: Path, relative: str | os.PathLike[str] = ".") -> Iterator[int]:
    """A descriptor of directory ``root/relative``, reached one component at a time without
    following any link (``root`` itself must be a real directory)."""
    fd = os.open(root, _DIR)
    try:
        for part in _parts(relative):
            try:
                child = os.open(part, _DIR, dir_fd=fd)
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _refuse(root / relative, "not a real directory (a link?)") from None
                raise
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def read_under(root: Path, relative: str | os.PathLike[str]) -> str | None:
    """The text of regular file ``root/relative``, reached without following links; None if it
    is missing. Raises UnsafePathError for a link or anything that is not a regular file."""
    parts = _parts(relative)
    if not parts:
        raise _refuse(root, "a directory, not a file")
    try:
        with dir_under(root, PurePosixPath(*parts[:-1])) as parent:
            fd = open_regular(root / relative, os.O_RDONLY, dir_fd=parent)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")
    finally:
        os.close(fd)


def rewrite_under(root: Path, relative: str | os.PathLike[str], text: str) -> None:
    """Replace the content of existing regular file ``root/relative`` (its owner and mode stay),
    reached without following links."""
    parts = _parts(relative)
    with dir_under(root, PurePosixPath(*parts[:-1])) as parent:
        fd = open_regular(root / relative, os.O_WRONLY | os.O_TRUNC, dir_fd=parent)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def inside(root: Path, path: Path) -> Path:
    """``path`` if it names an entry under ``root`` once its parent's links are resolved; raise
    UnsafePathError if it would leave ``root``."""
    if path.name in ("", ".", ".."):
        raise _refuse(path, "not a name inside the pool")
    if not path.parent.resolve().is_relative_to(root.resolve()):
        raise UnsafePathError(
            f"{path} leads outside the pool {root}: pgoverlay does not touch it; the pool's "
            "registry or directories were changed by someone other than pgoverlay"
        )
    return path


def require_real_dir(path: Path) -> None:
    """Refuse ``path`` unless it is a directory itself (not a link to one), reached through no
    link but those above the pool."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, _kind(st.st_mode) + ", not a directory")
    if os.path.realpath(path) != os.path.join(os.path.realpath(path.parent), path.name):
        raise _refuse(path, "reached through a symbolic link")


# -- files someone else chose -------------------------------------------------------------
# Root also reads two kinds of files it does not control: the admin's ``--password-file`` and a
# pull request's migration files. Both are opened without blocking (a FIFO does not hang the
# open), checked with ``fstat`` on the open descriptor (a regular file, no device, FIFO or
# directory; a size under a cap), then read at most to the cap. A file that must stay inside a
# folder (a checkout) is reached one component at a time from that folder with ``O_NOFOLLOW``, so
# a symbolic link that leads out of it, or a directory swapped for a link while it is walked, is
# refused rather than followed.

_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


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


def inside_checkout(root: Path, relative: str | os.PathLike[str]) -> Path | None:
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
    resolved = inside_checkout(root, relative)
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
