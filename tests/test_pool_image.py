"""Nothing lingers in the pool image: blocks freed by a masked seed, a destroyed or reset branch go
back to the host, so no original value survives in the image and its allocation follows the
pool's use."""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from helpers import source_dsn
from pgoverlay.errors import TimeoutExpiredError
from pgoverlay.runner import branch, cluster, seed
from pgoverlay.runner.polling import wait_for
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.registry import BaseVersion

MiB = 1024**2
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


def test_destroying_a_filled_branch_gives_its_blocks_back_to_the_host(
    pool: Pool, masked: BaseVersion
) -> None:
    os.sync()
    before = allocated_bytes(pool)
    b = branch.create(pool, "image-fill", base_name=masked.name)
    try:
        with psycopg.connect(**branch.connect_kwargs(pool, b), autocommit=True) as conn:
            conn.execute("CREATE TABLE ballast (filler text)")
            conn.execute("ALTER TABLE ballast ALTER COLUMN filler SET STORAGE PLAIN")
            conn.execute(
                "INSERT INTO ballast SELECT repeat(md5(g::text), 60) "
                "FROM generate_series(1, 80000) g"
            )
            conn.execute("CHECKPOINT")
        os.sync()
        filled = allocated_bytes(pool)
        assert filled > before + 150 * MiB, (before, filled)  # the fill reached the image
    finally:
        branch.destroy(pool, "image-fill")

    def given_back() -> bool:
        os.sync()
        return allocated_bytes(pool) <= before + 4 * MiB

    try:
        _wait_until(given_back, what="the destroyed branch's blocks to leave the pool image")
    except TimeoutExpiredError:
        pytest.fail(
            f"the pool image holds {(allocated_bytes(pool) - before) / MiB:.0f} MiB more than "
            f"before the branch ({before / MiB:.0f} MiB then, {filled / MiB:.0f} MiB filled)"
        )
