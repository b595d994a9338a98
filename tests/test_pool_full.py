"""A branch that fills the pool fails alone: the base and the other branches keep working."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from helpers import Undo, dismantle, require_root, source_dsn, top_ports
from pgoverlay.errors import PoolFullError
from pgoverlay.runner import branch, seed
from pgoverlay.runner import pool as poolmod
from pgoverlay.runner.branch import access
from pgoverlay.runner.pool import Pool, gc
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.settings import Settings


@pytest.fixture()
def small_pool(source: cluster.Running) -> Iterator[Pool]:
    require_root()
    home = Path(tempfile.mkdtemp(prefix="pgoverlay-full-", dir="/var/tmp"))
    low, high = top_ports(30, 20)
    p = poolmod.init(Settings(home=home, port_min=low, port_max=high), size="400M")
    try:
        seed.seed(p, "small", source_dsn=source_dsn(source))
        yield p
    finally:
        dismantle(p)


def fill(pool: Pool, name: str) -> str:
    """Write into ``name`` until the pool is full; return the error Postgres gave."""
    kwargs = branch.connection(pool, branch.get(pool, name)).connect_kwargs()
    with psycopg.connect(**kwargs, autocommit=True) as conn:
        conn.execute("CREATE TABLE ballast (filler text)")
        conn.execute("ALTER TABLE ballast ALTER COLUMN filler SET STORAGE PLAIN")
        for _ in range(400):
            try:
                conn.execute(
                    "INSERT INTO ballast SELECT repeat(md5(g::text), 60) "
                    "FROM generate_series(1, 100000) g"
                )
            except psycopg.Error as err:
                return str(err)
    raise AssertionError("the pool never filled up")


def test_a_branch_filling_the_pool_fails_alone(small_pool: Pool) -> None:
    pool = small_pool
    branch.create(pool, "bystander")
    branch.create(pool, "hog")
    base_dir = pool.base_dir("small", 1)
    before = sorted(os.fspath(p.relative_to(base_dir)) for p in base_dir.rglob("*"))

    error = fill(pool, "hog")
    # Either the statement fails (a data file could not be extended), or, when a WAL write is
    # what hits the full disk first, the server stops (PANIC) and the client loses its
    # connection: the branch's log then says why.
    if "server closed the connection" in error:
        error = branch.layout(pool, "hog").log_file.read_text(errors="replace")
    assert "No space left on device" in error or "could not extend file" in error

    # The base is untouched and the bystander still answers reads.
    assert sorted(os.fspath(p.relative_to(base_dir)) for p in base_dir.rglob("*")) == before
    bystander = branch.get(pool, "bystander")
    with psycopg.connect(
        **branch.connection(pool, bystander).connect_kwargs(), autocommit=True
    ) as conn:
        assert conn.execute("SELECT count(*) FROM accounts").fetchone() == (200000,)

    # A new branch needs almost no space (copy-up is a reflink clone): it is either made and
    # serves reads, or refused as "pool is full" with nothing left behind.
    try:
        latecomer = branch.create(pool, "latecomer")
    except PoolFullError as err:
        assert "pool is full" in str(err)
        assert pool.registry.branch("latecomer") is None
        assert not branch.layout(pool, "latecomer").root.exists()
    else:
        with psycopg.connect(**branch.connection(pool, latecomer).connect_kwargs()) as conn:
            assert conn.execute("SELECT count(*) FROM accounts").fetchone() == (200000,)
        branch.destroy(pool, "latecomer")

    # Destroying the hog gives the space back; the bystander writes again.
    branch.destroy(pool, "hog")
    gc.collect(pool)  # restarts the bystander if the full disk made it stop
    with psycopg.connect(
        **branch.connection(pool, bystander).connect_kwargs(), autocommit=True
    ) as conn:
        conn.execute("CREATE TABLE after_full (x int)")
        conn.execute("INSERT INTO after_full VALUES (1)")


def test_a_full_pool_met_by_the_engines_first_session_is_pool_full(
    pool: Pool, base: BaseVersion, undo: Undo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's session that gives a branch its password is the branch's first: on a full
    pool its catalog's copy-up fails there, and that is "the pool is full", as a client's first
    session says, not a start failure."""
    undo.branch("full-first-session")
    made = branch.create(pool, "full-first-session", base_name=base.name)

    def full(*_: object, **__: object) -> None:
        raise psycopg.OperationalError(
            'connection failed: FATAL:  could not open file "base/16385/1259": No space left '
            "on device"
        )

    monkeypatch.setattr(access, "engine_connection", full)
    with pytest.raises(PoolFullError, match="the pool is full, so branch full-first-session"):
        access.role_password(pool, base, made, None, what="its password", fix="none")
