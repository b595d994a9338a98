"""Verify a seed's copy against the source's backup manifest, reading each file once.

``pg_verifybackup`` reads the whole copy again after ``pg_basebackup`` has written it: on a
5 GiB base that is seconds of the seed spent after the copy. Here a thread checksums each file
while the copy goes on, as soon as ``pg_basebackup`` has finished it (its change time is
``SETTLE`` old: any later write would give it a newer one), from the page cache the copy just
filled. When the copy is done, :func:`check` compares every file with the manifest: present, a
regular file, the right size and CRC-32C; a file whose size, times or inode changed since the
thread read it, and a file it never read, is read then. Nothing outside the manifest may be
there. ``pg_verifybackup --skip-checksums`` still checks the manifest's own checksum, the tree
and the WAL the copy needs (``pg_waldump``): it reads no data file, so it is cheap.

Root reads the Postgres user's files here: no link is followed (directories are opened one
descriptor at a time with ``O_NOFOLLOW``), and anything but a directory or regular file is
refused.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crc32c

from pgoverlay.errors import SeedError

SETTLE_NS = 100_000_000  # a file this long unchanged is finished (timestamps are coarse: ~ms)
CHUNK = 1 << 20  # large reads, yet within the CPU cache: the copy is in the page cache
INTERVAL = 0.2  # seconds between two looks at the copy while it is made (each stats every file)
# Not in the manifest: the manifest itself, and the WAL (pg_waldump checks it). pg_verifybackup
# also skips postgresql.auto.conf and the signal files, which `pg_basebackup -R` writes; the
# seed does not use -R, so they are checked like any file the manifest lists.
IGNORED = frozenset({"backup_manifest", "pg_wal"})
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True)
class Expected:
    size: int
    algorithm: str
    checksum: str


@dataclass(frozen=True)
class Read:
    """What the watching thread read of a file, and the file's identity when it did."""

    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int
    crc: str

    def still(self, st: os.stat_result) -> bool:
        """Is the file as it was when it was read? Any write since then changed one of these."""
        return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) == (
            self.ino,
            self.size,
            self.mtime_ns,
            self.ctime_ns,
        )


def crc_hex(value: int) -> str:
    """A CRC-32C as backup manifests write it: the value's bytes in little-endian order."""
    return value.to_bytes(4, "little").hex()


def _checksum(fd: int, buffer: bytearray) -> tuple[int, str]:
    """Bytes read and CRC-32C of the open file ``fd``, from its start, in large reads."""
    view, crc, offset = memoryview(buffer), 0, 0
    while True:
        got = os.preadv(fd, [view], offset)
        if got == 0:
            return offset, crc_hex(crc)
        crc = crc32c.crc32c(view[:got], crc)
        offset += got


@contextlib.contextmanager
def _opened(name: str, flags: int, dir_fd: int | None) -> Iterator[int]:
    fd = os.open(name, flags, dir_fd=dir_fd)
    try:
        yield fd
    finally:
        os.close(fd)


def walk(root: Path, prefix: str = "") -> Iterator[tuple[str, int, os.DirEntry[str]]]:
    """Every entry below ``root`` that is not a directory, as (manifest path, parent directory
    descriptor, entry); directories are entered without following links, and a link to a
    directory is given like a file (to be refused). ``IGNORED`` is left out at the top."""

    def below(fd: int, rel: str) -> Iterator[tuple[str, int, os.DirEntry[str]]]:
        with os.scandir(fd) as entries:
            listed = list(entries)
        for entry in listed:
            path = f"{rel}/{entry.name}" if rel else entry.name
            if not rel and not prefix and entry.name in IGNORED:
                continue
            if entry.is_dir(follow_symlinks=False):
                try:
                    child = os.open(entry.name, _DIR, dir_fd=fd)
                except FileNotFoundError:
                    continue
                try:
                    yield from below(child, path)
                finally:
                    os.close(child)
            else:
                yield path, fd, entry

    try:
        top = os.open(root, _DIR)
    except FileNotFoundError:
        return
    try:
        yield from below(top, prefix)
    finally:
        os.close(top)


class Watch:
    """A thread that checksums the files of a copy being made under ``roots`` ((directory,
    manifest path prefix) pairs: the data directory, and where its tablespaces land), each
    once it is finished. Use it as a context manager around the copy; ``reads`` then holds
    what it read, by manifest path."""

    def __init__(self, roots: Sequence[tuple[Path, str]], *, interval: float = INTERVAL) -> None:
        self.roots = list(roots)
        self.interval = interval
        self.reads: dict[str, Read] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="seed-verify", daemon=True)
        self._buffer = bytearray(CHUNK)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):  # the copy changes under the walk:
                self.look()  # check() reads what this missed
            self._stop.wait(self.interval)

    def look(self) -> None:
        """One pass over the copy: checksum each regular file finished since the last pass."""
        for root, prefix in self.roots:
            for path, dir_fd, entry in walk(root, prefix):
                if self._stop.is_set():
                    return
                with contextlib.suppress(OSError):
                    self._consider(path, dir_fd, entry)

    def _consider(self, path: str, dir_fd: int, entry: os.DirEntry[str]) -> None:
        now = time.time_ns()
        st = entry.stat(follow_symlinks=False)
        known = self.reads.get(path)
        if not stat.S_ISREG(st.st_mode) or (known is not None and known.still(st)):
            return
        if st.st_ctime_ns > now - SETTLE_NS:
            return  # still being written, or just finished: a later pass reads it
        with _opened(entry.name, _FILE, dir_fd) as fd:
            before = os.fstat(fd)
            if not stat.S_ISREG(before.st_mode) or before.st_ctime_ns > now - SETTLE_NS:
                return
            size, crc = _checksum(fd, self._buffer)
            after = os.fstat(fd)
        if size == before.st_size and after.st_ctime_ns == before.st_ctime_ns:
            self.reads[path] = Read(
                before.st_ino, size, before.st_mtime_ns, before.st_ctime_ns, crc
            )


def load_manifest(datadir: Path) -> dict[str, Expected]:
    """The files the manifest in ``datadir`` lists, by path (the Postgres user's file: read
    without following a link)."""
    try:
        with (
            _opened(os.fspath(datadir), _DIR, None) as top,
            _opened("backup_manifest", _FILE, top) as fd,
        ):
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise SeedError("the copy's backup_manifest is not a regular file; seed again")
            raw = b"".join(iter(lambda: os.read(fd, 1 << 20), b""))
    except FileNotFoundError:
        raise SeedError(
            "the copy has no backup_manifest: pg_basebackup did not finish; seed again"
        ) from None
    except OSError as err:
        raise SeedError(f"cannot read the copy's backup_manifest: {err.strerror}") from None
    try:
        doc: dict[str, Any] = json.loads(raw)
        files: dict[str, Expected] = {}
        for item in doc["Files"]:
            path = item.get("Path")
            if path is None:  # a name that is not UTF-8: the manifest hex-encodes it
                path = bytes.fromhex(item["Encoded-Path"]).decode("utf-8", "surrogateescape")
            files[str(path)] = Expected(
                size=int(item["Size"]),
                algorithm=str(item.get("Checksum-Algorithm", "NONE")),
                checksum=str(item.get("Checksum", "")).lower(),
            )
    except (ValueError, KeyError, TypeError, AttributeError):
        raise SeedError(
            "the copy's backup_manifest cannot be read as a manifest: the copy is incomplete "
            "or damaged; seed again"
        ) from None
    return files


def _wrong(path: str, why: str) -> SeedError:
    return SeedError(
        f"the copy does not match the source's backup manifest: {path} {why}; the copy is "
        "removed: seed again, and check the source's disk and the network if it happens again"
    )


def check(
    datadir: Path, reads: dict[str, Read], *, on_read: Callable[[str], None] | None = None
) -> int:
    """Check the copy in ``datadir`` (its tablespaces in place) against its manifest, using
    ``reads`` for files whose checksum is known and still valid; ``on_read`` is told of every
    file read here. Returns how many files were read here. Raises SeedError on any
    difference, naming the first."""
    expected = load_manifest(datadir)
    try:
        seen, read_here = _compare(datadir, expected, reads, on_read)
    except OSError as err:  # the tree changed while it was checked: only another hand does that
        raise SeedError(
            f"the copy changed while it was checked ({err.strerror}: {err.filename}); it is "
            "removed: seed again"
        ) from None
    missing = sorted(set(expected) - seen)
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise _wrong(missing[0] + more, "is missing")
    return read_here


def _compare(
    datadir: Path,
    expected: dict[str, Expected],
    reads: dict[str, Read],
    on_read: Callable[[str], None] | None,
) -> tuple[set[str], int]:
    """Every file below ``datadir`` against ``expected``: the paths seen, and how many files
    were read (not known from ``reads``)."""
    seen: set[str] = set()
    buffer = bytearray(CHUNK)
    read_here = 0
    for path, dir_fd, entry in walk(datadir):
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            raise _wrong(path, "is a symbolic link (not followed)")
        if not stat.S_ISREG(st.st_mode):
            raise _wrong(path, "is not a regular file")
        want = expected.get(path)
        if want is None:
            raise _wrong(path, "is not in the manifest (an extra file)")
        seen.add(path)
        if st.st_size != want.size:
            raise _wrong(path, f"has {st.st_size} bytes, the manifest says {want.size}")
        if want.algorithm == "NONE":
            continue
        if want.algorithm != "CRC32C":
            raise SeedError(
                f"the copy's manifest uses {want.algorithm} checksums; pgoverlay checks CRC32C, "
                "pg_basebackup's default: seed again without changing the manifest checksums"
            )
        known = reads.get(path)
        if known is not None and known.still(st):
            crc = known.crc
        else:
            try:
                with _opened(entry.name, _FILE, dir_fd) as fd:
                    if not stat.S_ISREG(os.fstat(fd).st_mode):
                        raise _wrong(path, "is not a regular file")
                    size, crc = _checksum(fd, buffer)
            except OSError as err:
                if err.errno == errno.ELOOP:
                    raise _wrong(path, "is a symbolic link (not followed)") from None
                raise _wrong(path, f"cannot be read ({err.strerror})") from None
            read_here += 1
            if on_read is not None:
                on_read(path)
            if size != want.size:
                raise _wrong(path, f"changed size while it was checked ({size} bytes)")
        if crc != want.checksum:
            raise _wrong(path, f"has CRC-32C {crc}, the manifest says {want.checksum}")
    return seen, read_here
