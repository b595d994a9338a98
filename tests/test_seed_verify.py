"""The seed's own verification of the copy (runner/seed/verify.py) catches what pg_verifybackup
caught: a changed byte (also one changed after the watching thread read the file), a missing,
extra, truncated or linked file, a copy whose stream ended before the manifest. Real copies
of a real server, made by pg_basebackup."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import source_dsn
from pgoverlay.errors import SeedError
from pgoverlay.runner import proc, seed
from pgoverlay.runner.polling import wait_for
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.postgres.tools import Tools
from pgoverlay.runner.runtime import choose
from pgoverlay.runner.seed import durable, lockdown, verify


@pytest.fixture(scope="module")
def pristine(pool: Pool, source: cluster.Running) -> Iterator[Path]:
    """One plain pg_basebackup of the test source, as the seed makes it."""
    work = pool.home / "verify-pristine"
    work.mkdir(mode=0o700)
    os.chown(work, pool.owner.uid, pool.owner.gid)
    proc.run(
        [
            pgbin.newest().tool("pg_basebackup"),
            "-D",
            work / "data",
            "-d",
            source_dsn(source),
            "-X",
            "stream",
            "-c",
            "fast",
            "--no-password",
        ],
        timeout=300,
        user=pool.owner,
    )
    yield work / "data"
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def copy(pool: Pool, pristine: Path, tmp_path: Path) -> Iterator[Path]:
    """A fresh copy of the pristine backup for one test to damage."""
    target = pool.home / f"verify-{os.urandom(4).hex()}"
    shutil.copytree(pristine, target, symlinks=True)
    yield target
    shutil.rmtree(target, ignore_errors=True)


def biggest_file(datadir: Path) -> Path:
    """The largest data file of the copy (the test table): a file the manifest checksums."""
    return max(
        (p for p in (datadir / "base").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size
    )


def flip_byte(path: Path) -> None:
    with path.open("r+b") as f:
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_an_untouched_copy_passes_and_every_manifest_file_is_read(copy: Path) -> None:
    listed = verify.load_manifest(copy)
    read: list[str] = []
    assert verify.check(copy, {}, on_read=read.append) == len(read)
    with_checksum = {p for p, e in listed.items() if e.algorithm != "NONE"}
    assert set(read) == with_checksum and len(with_checksum) > 100


def test_a_flipped_byte_is_caught_and_named(copy: Path) -> None:
    victim = biggest_file(copy)
    flip_byte(victim)
    with pytest.raises(SeedError, match=r"CRC-32C") as caught:
        verify.check(copy, {})
    assert os.fspath(victim.relative_to(copy)) in str(caught.value)


def watched(copy: Path) -> dict[str, verify.Read]:
    """What the watching thread reads of ``copy`` once every file has settled."""
    watch = verify.Watch([(copy, "")])
    expected = {p for p, e in verify.load_manifest(copy).items() if e.algorithm != "NONE"}

    def all_read() -> bool:
        watch.look()
        return expected <= set(watch.reads)

    wait_for(all_read, timeout=60, what="the watch to read every file of the copy")
    return watch.reads


def test_files_the_watch_read_are_not_read_again(copy: Path) -> None:
    reads = watched(copy)
    read_again: list[str] = []
    verify.check(copy, reads, on_read=read_again.append)
    assert read_again == []


def test_a_byte_flipped_after_the_watch_read_the_file_is_caught(copy: Path) -> None:
    reads = watched(copy)
    victim = biggest_file(copy)
    flip_byte(victim)
    with pytest.raises(SeedError, match=r"CRC-32C"):
        verify.check(copy, reads)


def test_a_missing_file_is_caught(copy: Path) -> None:
    victim = biggest_file(copy)
    victim.unlink()
    with pytest.raises(SeedError, match=r"is missing"):
        verify.check(copy, {})


def test_an_extra_file_is_caught(copy: Path) -> None:
    (copy / "base" / "planted").write_bytes(b"not from the source")
    with pytest.raises(SeedError, match=r"base/planted is not in the manifest"):
        verify.check(copy, {})


def test_a_truncated_file_is_caught(copy: Path) -> None:
    victim = biggest_file(copy)
    os.truncate(victim, victim.stat().st_size - 8192)
    with pytest.raises(SeedError, match=r"the manifest says"):
        verify.check(copy, {})


@pytest.mark.parametrize("kind", ["file", "directory"])
def test_a_link_in_place_of_a_listed_file_or_directory_is_refused_not_followed(
    copy: Path, tmp_path: Path, kind: str
) -> None:
    """A hostile source (or the Postgres user) puts a link where the manifest lists a file;
    the link's target has the very content the manifest expects, so only refusing the link
    itself catches it."""
    victim = biggest_file(copy) if kind == "file" else biggest_file(copy).parent
    outside = tmp_path / "outside"
    if kind == "file":
        shutil.copy2(victim, outside)
        victim.unlink()
    else:
        shutil.copytree(victim, outside)
        shutil.rmtree(victim)
    victim.symlink_to(outside)
    with pytest.raises(SeedError, match=r"is a symbolic link \(not followed\)"):
        verify.check(copy, {})


def test_a_copy_whose_stream_ended_before_the_manifest_is_refused(copy: Path) -> None:
    (copy / "backup_manifest").unlink()
    with pytest.raises(SeedError, match=r"no backup_manifest"):
        verify.check(copy, {})


def test_a_cut_manifest_is_refused(copy: Path) -> None:
    manifest = copy / "backup_manifest"
    os.truncate(manifest, manifest.stat().st_size // 2)
    with pytest.raises(SeedError, match=r"cannot be read as a manifest"):
        verify.check(copy, {})


class Damaging:
    """The real programs, except that the copy is damaged right after pg_basebackup made it."""

    def __init__(self, real: Tools, damage: Callable[[Path], None]) -> None:
        self.real, self.damage = real, damage

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def run_streaming(self, tool: str, args: list[Any], **kwargs: Any) -> str:
        out = self.real.run_streaming(tool, args, **kwargs)
        if tool == "pg_basebackup":
            self.damage(Path(args[args.index("-D") + 1]))
        return out


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda d: flip_byte(biggest_file(d)), id="flipped-byte"),
        pytest.param(lambda d: biggest_file(d).unlink(), id="missing-file"),
        pytest.param(lambda d: (d / "global" / "planted").write_text("x"), id="extra-file"),
    ],
)
def test_a_seed_whose_copy_is_damaged_fails_and_leaves_nothing(
    pool: Pool,
    source: cluster.Running,
    monkeypatch: pytest.MonkeyPatch,
    damage: Callable[[Path], None],
) -> None:
    real = choose.tools_for  # the function seed looks up by this name
    monkeypatch.setattr(seed, "tools_for", lambda *a, **k: Damaging(real(*a, **k), damage))
    name = f"damaged-{os.urandom(3).hex()}"  # a seed wrongly made stays out of the other cases
    with pytest.raises(SeedError, match=r"manifest|verification"):
        seed.seed(pool, name, source_dsn=source_dsn(source))
    assert pool.registry.bases(name) == []
    assert not any(p.name.startswith(f"{name}-") for p in (pool.root / "staging").iterdir())


def test_the_seed_command_starts_without_the_services_web_stack() -> None:
    """`pgoverlay base seed` is timed against a bare pg_basebackup: its start imports only what
    seeding needs, not the engine service's web server."""
    code = (
        "import sys, pgoverlay.cli, pgoverlay.cli.base, pgoverlay.runner.seed; "
        "print(sorted(m for m in ('fastapi', 'uvicorn', 'starlette') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_copy_is_prepared_without_flushing_and_synced_before_it_is_ready(
    pool: Pool, source: cluster.Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The preparing server runs with fsync off (nothing waits for the disk while the copy is
    prepared); the base is flushed by syncfs, the last call still before it is registered
    ready, on the store where the base lives."""
    name = f"flushed-{os.urandom(3).hex()}"
    seen: dict[str, Any] = {"syncs": []}
    real_check = lockdown.check_branch_user

    def check_branch_user(conn: Any, **kwargs: Any) -> None:
        seen["fsync"] = conn.execute("SHOW fsync").fetchone()[0]
        real_check(conn, **kwargs)

    real_syncfs = durable.syncfs

    def syncfs(path: Path) -> None:
        if threading.current_thread() is threading.main_thread():  # the registry's thread
            seen["syncs"].append((path, [b.state for b in pool.registry.bases(name)]))
        else:
            seen["syncs"].append((path, "flushed in a thread"))
        real_syncfs(path)

    monkeypatch.setattr(lockdown, "check_branch_user", check_branch_user)
    monkeypatch.setattr(durable, "syncfs", syncfs)
    made = seed.seed(pool, name, source_dsn=source_dsn(source))
    try:
        assert seen["fsync"] == "off"
        assert seen["syncs"][0] == (pool.staging_dir(name, made.version), "flushed in a thread")
        assert seen["syncs"][-1] == (pool.store_dir(name, made.version), ["seeding"])
        assert made.state == "ready"
    finally:
        seed.remove_version(pool, name, made.version)


def test_a_flush_the_disk_refuses_fails_the_seed_and_leaves_nothing(
    pool: Pool, source: cluster.Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write error met by the flush that runs during the preparation (in its own thread)
    fails the seed, says what to check, and removes the version."""
    real_syncfs = durable.syncfs

    def syncfs(path: Path) -> None:
        if path.parent.name == "staging":  # the early flush, started on the staged copy
            raise SeedError("the base could not be written to the pool's disk (syncfs: EIO)")
        real_syncfs(path)

    monkeypatch.setattr(durable, "syncfs", syncfs)
    name = f"unflushed-{os.urandom(3).hex()}"
    with pytest.raises(SeedError, match="could not be written to the pool's disk"):
        seed.seed(pool, name, source_dsn=source_dsn(source))
    assert pool.registry.bases(name) == []
    assert not any(p.name.startswith(f"{name}-") for p in (pool.root / "staging").iterdir())


class VerifyingBeside:
    """The real programs; pg_verifybackup waits, before it runs, until the seed compares the
    checksums: it passes only if the two run side by side."""

    def __init__(self, real: Tools, events: list[str]) -> None:
        self.real, self.events = real, events

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def run(self, tool: str, args: list[Any], **kwargs: Any) -> Any:
        if tool == "pg_verifybackup":
            wait_for(
                lambda: "checksums compared" in self.events,
                timeout=60,
                what="the checksums compared beside pg_verifybackup",
            )
        return self.real.run(tool, args, **kwargs)


def test_the_copy_is_flushed_while_it_is_verified_and_both_verifications_run_side_by_side(
    pool: Pool, source: cluster.Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk writes the copy while the CPU verifies it from the page cache: the flush of the
    staged copy has started when the checksums are compared, and pg_verifybackup (the tree and
    the WAL) runs while they are. The seed still makes a ready base."""
    events: list[str] = []
    real_syncfs, real_check, real_tools = durable.syncfs, verify.check, choose.tools_for

    def syncfs(path: Path) -> None:
        if path.parent.name == "staging":
            events.append("flush started")
        real_syncfs(path)

    def check(datadir: Path, reads: dict[str, verify.Read], **kwargs: Any) -> int:
        events.append("checksums compared")
        wait_for(lambda: "flush started" in events, timeout=60, what="the copy's flush to start")
        return real_check(datadir, reads, **kwargs)

    monkeypatch.setattr(durable, "syncfs", syncfs)
    monkeypatch.setattr(verify, "check", check)
    monkeypatch.setattr(
        seed, "tools_for", lambda *a, **k: VerifyingBeside(real_tools(*a, **k), events)
    )
    name = f"beside-{os.urandom(3).hex()}"
    made = seed.seed(pool, name, source_dsn=source_dsn(source))
    try:
        assert made.state == "ready"
        assert {"flush started", "checksums compared"} <= set(events)
    finally:
        seed.remove_version(pool, name, made.version)
