"""Tests for pgoverlay.runner.branch.sizes: FIEMAP-based upper-layer accounting."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgoverlay.runner.branch import sizes
from pgoverlay.runner.branch.sizes import (
    FIEMAP_EXTENT_DATA_INLINE,
    FIEMAP_EXTENT_DELALLOC,
    FIEMAP_EXTENT_LAST,
    FIEMAP_EXTENT_SHARED,
    FIEMAP_EXTENT_UNKNOWN,
    Extent,
    LayerSize,
    exclusive_bytes,
    file_extents,
    layer_size,
)
from pgoverlay.runner.units import format_bytes

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
# a reflink clone owns no data blocks; leave room for nothing more than a stray block or two
NEAR_ZERO = 64 * KiB


def _require(condition: bool, reason: str) -> None:
    """Skip when an environment prerequisite is missing, but fail in CI (CI=true)."""
    if condition:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must be able to run this test: {reason}", pytrace=False)
    pytest.skip(reason)


def _write_file(path: Path, size: int, chunk: int = MiB) -> None:
    """Write ``size`` bytes of random data and fsync, so every block is allocated."""
    with open(path, "wb") as f:
        for _ in range(size // chunk):
            f.write(os.urandom(chunk))
        f.flush()
        os.fsync(f.fileno())


def _umount(mountpoint: Path) -> None:
    result = subprocess.run(["umount", str(mountpoint)], capture_output=True, text=True)
    if result.returncode != 0:
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)
        pytest.fail(f"umount {mountpoint} failed: {result.stderr.strip()}")


@contextlib.contextmanager
def _loop_fs(tmp_path: Path, name: str, mkfs: list[str], size: int) -> Iterator[Path]:
    """Make a sparse image, format it with ``mkfs`` and loop-mount it; always unmount."""
    _require(sys.platform.startswith("linux"), "needs Linux (FIEMAP, loop devices, OverlayFS)")
    _require(os.geteuid() == 0, "needs root to loop-mount a filesystem image")
    _require(shutil.which(mkfs[0]) is not None, f"{mkfs[0]} is not installed")
    image = tmp_path / f"{name}.img"
    with open(image, "wb") as f:
        f.truncate(size)
    made = subprocess.run([*mkfs, str(image)], capture_output=True, text=True)
    _require(made.returncode == 0, f"{' '.join(mkfs)} failed: {made.stderr.strip()}")
    mountpoint = tmp_path / name
    mountpoint.mkdir()
    mounted = subprocess.run(
        ["mount", "-o", "loop", str(image), str(mountpoint)], capture_output=True, text=True
    )
    _require(mounted.returncode == 0, f"cannot loop-mount {name}: {mounted.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        _umount(mountpoint)


@pytest.fixture
def xfs(tmp_path: Path) -> Iterator[Path]:
    """A freshly made XFS filesystem with reflink, loop-mounted."""
    with _loop_fs(tmp_path, "xfs", ["mkfs.xfs", "-q", "-m", "reflink=1"], 512 * MiB) as mnt:
        yield mnt


@pytest.fixture
def ext4(tmp_path: Path) -> Iterator[Path]:
    """A freshly made ext4 filesystem (no reflink), loop-mounted."""
    with _loop_fs(tmp_path, "ext4", ["mkfs.ext4", "-q", "-F"], 128 * MiB) as mnt:
        yield mnt


# --- pure functions ----------------------------------------------------------------------


def test_exclusive_bytes_skips_shared_extents() -> None:
    extents = [
        Extent(logical=0, length=4 * MiB, flags=FIEMAP_EXTENT_SHARED),
        Extent(logical=4 * MiB, length=1 * MiB, flags=0),
        Extent(logical=5 * MiB, length=3 * MiB, flags=FIEMAP_EXTENT_SHARED | FIEMAP_EXTENT_LAST),
    ]
    assert exclusive_bytes(extents) == 1 * MiB


def test_exclusive_bytes_counts_delalloc_unknown_and_inline() -> None:
    extents = [
        Extent(0, 8 * KiB, FIEMAP_EXTENT_DELALLOC | FIEMAP_EXTENT_UNKNOWN),
        Extent(8 * KiB, 60, FIEMAP_EXTENT_DATA_INLINE | FIEMAP_EXTENT_LAST),
    ]
    assert exclusive_bytes(extents) == 8 * KiB + 60


def test_exclusive_bytes_empty() -> None:
    assert exclusive_bytes([]) == 0
    assert exclusive_bytes(iter([])) == 0


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1, "1 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (40 * KiB, "40.0 KiB"),
        (1536, "1.5 KiB"),
        (MiB, "1.0 MiB"),
        (MiB - 1, "1.0 MiB"),
        (int(5.2 * GiB), "5.20 GiB"),
        (1024 * GiB, "1.00 TiB"),
        (-2 * MiB, "-2.0 MiB"),
    ],
)
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text


# --- walking, on whatever filesystem tmp_path is ---------------------------------------


def test_layer_size_logical_counts_hardlinks_once_and_ignores_symlinks(tmp_path: Path) -> None:
    layer = tmp_path / "layer"
    (layer / "base" / "1").mkdir(parents=True)
    (layer / "base" / "1" / "16384").write_bytes(b"x" * 10_000)
    os.link(layer / "base" / "1" / "16384", layer / "hardlink")
    outside = tmp_path / "outside"
    outside.write_bytes(b"y" * 50_000)
    (layer / "to_outside").symlink_to(outside)
    (layer / "to_dir").symlink_to(tmp_path, target_is_directory=True)
    with open(layer / "sparse", "wb") as f:
        f.truncate(3 * MiB)
    os.mkfifo(layer / "fifo")

    size = layer_size(layer)
    assert size.logical_bytes == 10_000 + 3 * MiB
    # Only the one file's blocks: not the link's second name, the sparse file's hole, nor what
    # the symlinks point to.
    block = os.statvfs(layer).f_bsize
    assert size.physical_bytes == -(-10_000 // block) * block


def test_layer_size_empty_dir(tmp_path: Path) -> None:
    assert layer_size(tmp_path) == LayerSize(logical_bytes=0, physical_bytes=0)


def test_layer_size_rejects_missing_or_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        layer_size(tmp_path / "missing")
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(NotADirectoryError):
        layer_size(tmp_path / "file")


def test_layer_size_falls_back_to_st_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    _write_file(data, 100 * KiB, chunk=4 * KiB)

    def unsupported(fd: int) -> list[Extent]:
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(sizes, "_fd_extents", unsupported)
    size = layer_size(tmp_path)
    assert size == LayerSize(100 * KiB, os.stat(data).st_blocks * 512)


def test_layer_size_propagates_other_fiemap_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "data").write_bytes(b"x")

    def broken(fd: int) -> list[Extent]:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(sizes, "_fd_extents", broken)
    with pytest.raises(OSError, match="Input/output"):
        layer_size(tmp_path)


def test_layer_size_skips_files_that_vanish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "stays").write_bytes(b"a" * 1000)
    (tmp_path / "gone").write_bytes(b"b" * 5000)
    (tmp_path / "subdir").mkdir()
    (tmp_path / "subdir" / "gone_too").write_bytes(b"c" * 7000)
    original = sizes._measure_file

    def racing(path: str) -> tuple[tuple[int, int], int, int] | None:
        if "gone" in os.path.basename(path):
            os.unlink(path)  # a live Postgres removed it between readdir and open
        return original(path)

    monkeypatch.setattr(sizes, "_measure_file", racing)
    assert layer_size(tmp_path).logical_bytes == 1000


def test_file_extents_loops_past_one_batch(tmp_path: Path) -> None:
    """More extents than one ioctl batch (512) are all returned, in order."""
    path = tmp_path / "holes"
    count = 1100
    block = os.urandom(4 * KiB)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for i in range(count):
            os.pwrite(fd, block, i * 64 * KiB)  # 4 KiB of data, then a 60 KiB hole
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        extents = file_extents(path)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.ENOTTY):
            pytest.skip(f"filesystem of {tmp_path} has no FIEMAP")
        raise
    assert len(extents) == count
    assert [e.logical for e in extents] == [i * 64 * KiB for i in range(count)]
    assert all(e.length == 4 * KiB for e in extents)
    assert extents[-1].flags & FIEMAP_EXTENT_LAST
    assert exclusive_bytes(extents) == count * 4 * KiB


def test_file_extents_does_not_follow_symlinks(tmp_path: Path) -> None:
    (tmp_path / "target").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    with pytest.raises(OSError) as info:
        file_extents(tmp_path / "link")
    assert info.value.errno == errno.ELOOP


# --- real filesystems ------------------------------------------------------------------


@pytest.mark.slow
def test_xfs_reflink_clone_is_free_until_rewritten(xfs: Path) -> None:
    (xfs / "base").mkdir()
    (xfs / "layer").mkdir()
    source = xfs / "base" / "relation"
    clone = xfs / "layer" / "relation"
    _write_file(source, 8 * MiB)
    subprocess.run(["cp", "--reflink=always", str(source), str(clone)], check=True)

    assert all(e.flags & FIEMAP_EXTENT_SHARED for e in file_extents(clone))
    before = layer_size(xfs / "layer")
    assert before.logical_bytes == 8 * MiB
    assert before.physical_bytes <= NEAR_ZERO

    fd = os.open(clone, os.O_WRONLY)
    try:
        os.pwrite(fd, os.urandom(1 * MiB), 4 * MiB - 512 * KiB)  # 1 MiB in the middle
        os.fsync(fd)
    finally:
        os.close(fd)

    after = layer_size(xfs / "layer")
    assert after.logical_bytes == 8 * MiB
    grown = after.physical_bytes - before.physical_bytes
    assert 1 * MiB <= grown <= 1 * MiB + 256 * KiB, format_bytes(grown)
    # the untouched parts of the clone are still shared with the source
    shared = sum(e.length for e in file_extents(clone) if e.flags & FIEMAP_EXTENT_SHARED)
    assert shared >= 6 * MiB


@pytest.mark.slow
def test_overlayfs_copy_up_on_xfs_is_a_free_reflink(xfs: Path) -> None:
    lower, upper, work, merged = (xfs / d for d in ("lower", "upper", "work", "merged"))
    for d in (lower, upper, work, merged):
        d.mkdir()
    _write_file(lower / "relation", 8 * MiB)
    options = f"lowerdir={lower},upperdir={upper},workdir={work}"
    mounted = subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", options, str(merged)],
        capture_output=True,
        text=True,
    )
    _require(mounted.returncode == 0, f"cannot mount overlay: {mounted.stderr.strip()}")
    try:
        assert layer_size(upper) == LayerSize(0, 0)
        os.close(os.open(merged / "relation", os.O_RDWR))  # opening for write copies up
        assert (upper / "relation").is_file()
        size = layer_size(upper)
        assert size.logical_bytes == 8 * MiB
        assert size.physical_bytes <= NEAR_ZERO
    finally:
        _umount(merged)


@pytest.mark.slow
def test_plain_copy_on_ext4_counts_fully(ext4: Path) -> None:
    (ext4 / "layer").mkdir()
    source = ext4 / "relation"
    _write_file(source, 8 * MiB)
    subprocess.run(["cp", "--reflink=never", str(source), str(ext4 / "layer")], check=True)
    os.sync()

    copy = ext4 / "layer" / "relation"
    assert not any(e.flags & FIEMAP_EXTENT_SHARED for e in file_extents(copy))
    size = layer_size(ext4 / "layer")
    assert size.logical_bytes == 8 * MiB
    assert 8 * MiB <= size.physical_bytes <= 8 * MiB + NEAR_ZERO
