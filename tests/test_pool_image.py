"""Nothing lingers in the pool image: blocks freed by a masked seed, a destroyed or reset branch go
back to the host, so no original value survives in the image and its allocation follows the
pool's use."""

from __future__ import annotations

import errno
import json
import os
import secrets
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from helpers import cli, dismantle, require_root, source_dsn, top_ports
from pgoverlay.errors import TimeoutExpiredError
from pgoverlay.runner import branch, proc, seed
from pgoverlay.runner import pool as poolmod
from pgoverlay.runner.polling import wait_for
from pgoverlay.runner.pool import Pool, discard, mounts
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.settings import Settings

MiB = 1024**2
PORTS_OLD = top_ports(0, 21)  # the small pool's branches, apart from the main pool's
CHUNK = 16 * MiB
ROWS = 600
# In every original value and in no masked one: fakes and hashes never contain it.
MARKER = f"orig{secrets.token_hex(6)}".encode()

RULES = """
tables:
  customers:
    email: {fake: email}
    full_name: {fake: name}
    notes: {fake: text}
    tax_id: hash
  sessions: truncate
"""


# -- a raw search of a sparse file -----------------------------------------------------------


def allocated_ranges(fd: int) -> Iterator[tuple[int, int]]:
    """The (start, end) of every allocated extent of a sparse file, from SEEK_DATA/SEEK_HOLE."""
    size = os.fstat(fd).st_size
    position = 0
    while position < size:
        try:
            start = os.lseek(fd, position, os.SEEK_DATA)
        except OSError as err:
            if err.errno == errno.ENXIO:  # no data after position
                return
            raise
        end = os.lseek(fd, start, os.SEEK_HOLE)
        yield start, end
        position = end


def find_all(path: Path, needle: bytes, *, chunk: int = CHUNK) -> list[int]:
    """Offsets of ``needle`` in the allocated extents of ``path``, read in chunks that overlap by
    ``len(needle) - 1`` bytes, so a needle across a chunk boundary is found once."""
    found: list[int] = []
    fd = os.open(path, os.O_RDONLY)
    try:
        for start, end in allocated_ranges(fd):
            tail = b""
            position = start
            while position < end:
                data = os.pread(fd, min(chunk, end - position), position)
                if not data:
                    break
                window = tail + data
                origin = position - len(tail)
                hit = window.find(needle)
                while hit != -1:
                    found.append(origin + hit)
                    hit = window.find(needle, hit + 1)
                tail = window[len(window) - (len(needle) - 1) :]
                position += len(data)
    finally:
        os.close(fd)
    return found


def test_search_finds_a_needle_across_a_chunk_boundary_and_skips_holes(tmp_path: Path) -> None:
    image = tmp_path / "sparse"
    with open(image, "wb") as handle:
        handle.truncate(64 * MiB)
        handle.seek(MiB - 5)  # straddles the 1 MiB chunk boundary
        handle.write(b"needle")
        handle.seek(40 * MiB)
        handle.write(b"xxneedlexx")
    assert find_all(image, b"needle", chunk=MiB) == [MiB - 5, 40 * MiB + 2]
    fd = os.open(image, os.O_RDONLY)
    try:
        allocated = sum(end - start for start, end in allocated_ranges(fd))
    finally:
        os.close(fd)
    assert allocated < 64 * MiB // 4  # holes are not read


def test_mount_options_join_the_mounts_own_and_its_filesystems() -> None:
    text = (
        "44 27 7:0 / /var/tmp/p\\040q/pool rw,noatime - xfs /dev/loop0 rw,discard,inode64\n"
        "45 44 7:0 /store/a/1 /var/tmp/p\\040q/pool/bases/a/1 ro,relatime - xfs /dev/loop0 rw\n"
    )
    found = mounts.parse_options(text)
    assert found["/var/tmp/p q/pool"] == {"rw", "noatime", "discard", "inode64"}
    assert "discard" not in found["/var/tmp/p q/pool/bases/a/1"]


def allocated_bytes(pool: Pool) -> int:
    return (pool.home / "pool.img").stat().st_blocks * 512


# -- a masked seed from a source with distinctive values ---------------------------------------


@pytest.fixture(scope="module")
def personal(source: cluster.Running) -> Iterator[str]:
    """Database `imageleak` on the source: every value of its personal columns holds MARKER.
    Dropped afterwards, so no later seed copies it into the pool."""
    rnd = secrets.token_hex
    with psycopg.connect(**source.conninfo(user="postgres"), autocommit=True) as conn:
        conn.execute("CREATE DATABASE imageleak OWNER app_owner")
    marker = MARKER.decode()
    with psycopg.connect(**source.conninfo(user="postgres", dbname="imageleak")) as conn:
        conn.execute("SET ROLE app_owner")
        conn.execute(
            "CREATE TABLE customers (id int PRIMARY KEY, email text NOT NULL UNIQUE, "
            "full_name text NOT NULL, notes text, tax_id text)"
        )
        conn.execute("ALTER TABLE customers ALTER notes SET STORAGE EXTERNAL")  # TOAST, as is
        conn.execute("CREATE TABLE sessions (id int PRIMARY KEY, token text NOT NULL)")
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO customers VALUES (%s, %s, %s, %s, %s)",
                [
                    (
                        i,
                        f"{marker}.{i}@realmail.test",
                        f"Real {marker} Person{i}",
                        # the marker in every ~2 kB TOAST chunk
                        "".join(f"{marker}{rnd(24)}" for _ in range(70)),
                        f"TAX-{marker}-{i}",
                    )
                    for i in range(ROWS)
                ],
            )
            cur.executemany(
                "INSERT INTO sessions VALUES (%s, %s)",
                [(i, f"sess-{marker}-{i}") for i in range(ROWS)],
            )
        conn.execute("RESET ROLE")
        conn.commit()
        conn.execute("CHECKPOINT")
        conn.commit()
    yield "imageleak"
    with psycopg.connect(**source.conninfo(user="postgres"), autocommit=True) as conn:
        conn.execute("DROP DATABASE imageleak")


@pytest.fixture(scope="module")
def masked(
    pool: Pool, source: cluster.Running, personal: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BaseVersion]:
    rules = tmp_path_factory.mktemp("rules") / "imageleak.yml"
    rules.write_text(RULES)
    base = seed.seed(pool, "imageleak", source_dsn=source_dsn(source, dbname=personal), mask=rules)
    yield base
    seed.remove_version(pool, base.name, base.version)


def _wait_until(probe: Callable[[], bool], *, what: str, timeout: float = 60) -> None:
    """Online discard is issued after the log commits: look again, with a deadline."""
    wait_for(probe, timeout=timeout, what=what, first_interval=0.2, max_interval=2)


def test_no_original_value_of_a_masked_seed_is_left_anywhere_in_the_pool_image(
    pool: Pool, masked: BaseVersion
) -> None:
    image = pool.home / "pool.img"

    def clean() -> bool:
        os.sync()
        return not find_all(image, MARKER)

    try:
        _wait_until(clean, what="the original values to leave the pool image")
    except TimeoutExpiredError:
        offsets = find_all(image, MARKER)
        pytest.fail(
            f"{len(offsets)} original values are still in {image}, e.g. at offsets "
            f"{offsets[:5]}: the blocks the seed freed kept their bytes"
        )


def fill(pool: Pool, name: str) -> None:
    """Write ~200 MiB into branch ``name``, through to the image."""
    with psycopg.connect(
        **branch.connection(pool, branch.get(pool, name)).connect_kwargs()
    ) as conn:
        conn.autocommit = True
        conn.execute("CREATE TABLE ballast (filler text)")
        conn.execute("ALTER TABLE ballast ALTER COLUMN filler SET STORAGE PLAIN")
        conn.execute(
            "INSERT INTO ballast SELECT repeat(md5(g::text), 60) FROM generate_series(1, 80000) g"
        )
        conn.execute("CHECKPOINT")
    os.sync()


def assert_given_back(pool: Pool, *, before: int, filled: int) -> None:
    """The image's allocation comes back to within a few MiB of ``before``."""

    def given_back() -> bool:
        os.sync()
        return allocated_bytes(pool) <= before + 4 * MiB

    try:
        _wait_until(given_back, what="the freed blocks to leave the pool image")
    except TimeoutExpiredError:
        pytest.fail(
            f"the pool image holds {(allocated_bytes(pool) - before) / MiB:.0f} MiB more than "
            f"before the branch ({before / MiB:.0f} MiB then, {filled / MiB:.0f} MiB filled)"
        )


def test_destroying_a_filled_branch_gives_its_blocks_back_to_the_host(
    pool: Pool, masked: BaseVersion
) -> None:
    os.sync()
    before = allocated_bytes(pool)
    branch.create(pool, "image-fill", base_name=masked.name)
    try:
        fill(pool, "image-fill")
        filled = allocated_bytes(pool)
        assert filled > before + 150 * MiB, (before, filled)  # the fill reached the image
    finally:
        branch.destroy(pool, "image-fill")
    assert_given_back(pool, before=before, filled=filled)


def test_resetting_a_filled_branch_gives_its_blocks_back_to_the_host(
    pool: Pool, masked: BaseVersion
) -> None:
    branch.create(pool, "image-reset", base_name=masked.name)
    try:
        os.sync()
        before = allocated_bytes(pool)
        fill(pool, "image-reset")
        filled = allocated_bytes(pool)
        assert filled > before + 150 * MiB, (before, filled)
        branch.reset(pool, "image-reset")
        assert_given_back(pool, before=before, filled=filled)
    finally:
        branch.destroy(pool, "image-reset")


def test_pool_status_and_doctor_show_the_image_allocation_next_to_the_pool_use(
    pool: Pool, env: dict[str, str]
) -> None:
    done = cli(["pool", "status", "--json"], env=env)
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert status["discard"] is True
    assert abs(status["image_allocated_bytes"] - allocated_bytes(pool)) < 64 * MiB
    assert 0 < status["used_bytes"] < status["size_bytes"]
    doctor = {c["name"]: c for c in json.loads(cli(["doctor", "--json"], env=env).stdout)}
    assert doctor["discard"]["verdict"] == "ok"
    assert "pool.img occupies" in doctor["discard"]["detail"]
    assert "used in the pool" in doctor["discard"]["detail"]


# -- a pool image mounted before without discard -------------------------------------------------


@pytest.fixture(scope="module")
def old_pool(source: cluster.Running) -> Iterator[Settings]:
    """A small pool of its own, with a base."""
    require_root()
    home = Path(tempfile.mkdtemp(prefix="pgoverlay-discard-", dir="/var/tmp"))
    settings = Settings(home=home, port_min=PORTS_OLD[0], port_max=PORTS_OLD[1])
    p = poolmod.init(settings, size="1G")
    try:
        seed.seed(p, "small", source_dsn=source_dsn(source))
        p.close()
        yield settings
    finally:
        dismantle(Pool.open(settings))


def mount_without_discard(settings: Settings) -> Pool:
    """Mount the pool image as pool init did before: without discard."""
    root = settings.home / "pool"
    for point in mounts.mounts_under(root):
        mounts.unmount(Path(point))
    mounts.unmount(root)
    proc.run(["mount", "-o", "loop,noatime", settings.home / "pool.img", root], timeout=60)
    assert not discard.discards(root)
    p = Pool.open(settings)
    poolmod.remount_bases(p)
    return p


def test_pool_init_mounts_an_image_made_without_discard_again_with_it(
    old_pool: Settings, env: dict[str, str]
) -> None:
    mount_without_discard(old_pool).close()
    done = cli(["pool", "init"], env={**env, "PGOVERLAY_HOME": os.fspath(old_pool.home)})
    assert done.returncode == 0, done.stderr
    assert discard.discards(old_pool.home / "pool")
    p = Pool.open(old_pool)
    try:
        assert mounts.is_mounted(p.base_dir("small", 1))  # the base is bound again
        branch.create(p, "after-remount")
        branch.destroy(p, "after-remount")
    finally:
        p.close()


def test_a_pool_image_in_use_without_discard_is_trimmed_after_a_destroy(
    old_pool: Settings, env: dict[str, str]
) -> None:
    p = mount_without_discard(old_pool)
    try:
        branch.create(p, "keeps-it-busy")
        # A branch exists: init leaves the mount alone, and says so.
        done = cli(["pool", "init"], env={**env, "PGOVERLAY_HOME": os.fspath(old_pool.home)})
        assert done.returncode == 0, done.stderr
        assert not discard.discards(p.root)
        doctor = cli(["doctor", "--json"], env={**env, "PGOVERLAY_HOME": os.fspath(p.home)})
        found = {c["name"]: c for c in json.loads(doctor.stdout)}
        assert found["discard"]["verdict"] == "warn"
        assert "pgoverlay pool init" in found["discard"]["detail"]
        os.sync()
        before = allocated_bytes(p)
        branch.create(p, "filled")
        fill(p, "filled")
        filled = allocated_bytes(p)
        assert filled > before + 150 * MiB, (before, filled)
        branch.destroy(p, "filled")
        assert_given_back(p, before=before, filled=filled)
    finally:
        for b in p.registry.branches():
            branch.destroy(p, b.name)
        p.close()
