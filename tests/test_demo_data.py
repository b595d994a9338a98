"""Tests for pgoverlay.runner.demo.data: the demo "shop" database.

The main test loads scale 1 into a throwaway Postgres cluster (initdb in a temp
dir, unix socket only) and checks counts, emails, foreign keys and size.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pgoverlay.runner.demo.data import (
    DEMO_DATABASE,
    demo_data_sql,
    demo_index_sql,
    demo_row_counts,
    demo_schema_sql,
    demo_tables,
)
from pgoverlay.runner.polling import wait_for

MiB = 1024 * 1024
# pg_database_size() of the loaded scale-1 database: ~32 MiB of tables and
# indexes plus the ~7 MiB catalog of an empty Postgres 15 database.
SCALE1_DB_SIZE_BAND = (32 * MiB, 48 * MiB)
# Tables + indexes (+ TOAST) only, as documented in runner/demo/data.py.
SCALE1_RELATION_SIZE_BAND = (27 * MiB, 38 * MiB)

EMAIL_RE = r"^[a-z][a-z._]*[0-9]+@[a-z0-9-]+(\.[a-z0-9-]+)+$"


def _require(condition: bool, reason: str) -> None:
    """Skip when an environment prerequisite is missing, but fail in CI (CI=true)."""
    if condition:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must be able to run this test: {reason}", pytrace=False)
    pytest.skip(reason)


# --------------------------------------------------------------------------
# pure tests
# --------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, 1001, 10**9, True, 1.0, "1", None])
def test_scale_is_validated(bad: object) -> None:
    with pytest.raises(ValueError):
        demo_data_sql(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        demo_row_counts(bad)  # type: ignore[arg-type]


def test_statement_shape() -> None:
    assert DEMO_DATABASE == "shop"
    schema = demo_schema_sql()
    assert all(s.lstrip().upper().startswith("CREATE TABLE") for s in schema)
    created = [re.findall(r"^\s*CREATE TABLE (\w+)", s)[0] for s in schema]
    assert created == list(demo_tables())

    for scale in (1, 10, 1000):
        data = demo_data_sql(scale)
        assert data[-1] == "ANALYZE"
        inserts = [s for s in data if s.startswith("INSERT INTO")]
        assert len(inserts) == len(demo_tables())
        # indexes and FKs come after every insert
        first_index = data.index(demo_index_sql()[0])
        assert first_index > max(data.index(s) for s in inserts)
        assert not any(s.rstrip().endswith(";") for s in data), "one statement per entry"
    # deterministic and scale-dependent
    assert demo_data_sql(3) == demo_data_sql(3)
    assert demo_data_sql(3) != demo_data_sql(4)
    assert demo_row_counts(10)["orders"] == 10 * demo_row_counts(1)["orders"]


# --------------------------------------------------------------------------
# throwaway Postgres
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Cluster:
    bindir: Path
    datadir: Path
    sockdir: Path
    port: int

    def conninfo(self, dbname: str) -> str:
        return f"host={self.sockdir} port={self.port} user=postgres dbname={dbname}"


def _bindir() -> Path | None:
    env = os.environ.get("PGOVERLAY_TEST_PG_BINDIR")
    candidates = [Path(env)] if env else []
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    for c in candidates:
        if (c / "initdb").is_file() and (c / "postgres").is_file():
            return c
    return None


def _as_postgres(argv: list[str], *, as_postgres_user: bool) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if as_postgres_user else argv


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    _require(shutil.which("runuser") is not None or os.geteuid() != 0, "runuser is missing")
    bindir = _bindir()
    _require(bindir is not None, "no Postgres server binaries under /usr/lib/postgresql")
    assert bindir is not None
    psycopg = pytest.importorskip("psycopg")

    # Postgres refuses to run as root: run initdb/pg_ctl as the `postgres` user.
    root = os.geteuid() == 0
    if root:
        try:
            pg_user = pwd.getpwnam("postgres")
        except KeyError:
            _require(False, "no 'postgres' OS user to run the server as")
            raise
    # Not under pytest's tmp_path: its parents are 0700 root, unreadable for postgres.
    base = Path(tempfile.mkdtemp(prefix="pgoverlay-demo-"))
    datadir, sockdir, log = base / "data", base / "sock", base / "postgres.log"
    sockdir.mkdir()
    if root:
        for p in (base, sockdir):
            os.chown(p, pg_user.pw_uid, pg_user.pw_gid)
    port = 5432
    pg_ctl = str(bindir / "pg_ctl")
    started = False
    try:
        subprocess.run(
            _as_postgres(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(datadir),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-sync",
                ],
                as_postgres_user=root,
            ),
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )
        opts = (
            f"-c listen_addresses='' -k {sockdir} -p {port} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
            "-c shared_buffers=128MB -c max_wal_size=1GB -c autovacuum=off"
        )
        subprocess.run(
            _as_postgres(
                [pg_ctl, "-D", str(datadir), "-l", str(log), "-o", opts, "-w", "-t", "60", "start"],
                as_postgres_user=root,
            ),
            check=True,
            capture_output=True,
            text=True,
            timeout=90,
        )
        started = True
        c = Cluster(bindir=bindir, datadir=datadir, sockdir=sockdir, port=port)

        def accepts() -> bool | None:
            try:
                psycopg.connect(c.conninfo("postgres"), autocommit=True).close()
            except psycopg.OperationalError:
                return None
            return True

        wait_for(accepts, timeout=30, what=f"the server on {sockdir} to accept logins")
        yield c
    except subprocess.CalledProcessError as exc:
        logtext = log.read_text() if log.exists() else ""
        pytest.fail(f"{exc.cmd[:5]} failed: {exc.stderr}\n{logtext}", pytrace=False)
    finally:
        if started:
            subprocess.run(
                _as_postgres(
                    [pg_ctl, "-D", str(datadir), "-m", "immediate", "-w", "-t", "60", "stop"],
                    as_postgres_user=root,
                ),
                capture_output=True,
                timeout=90,
            )
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def shop_scale1(cluster: Cluster) -> Iterator[str]:
    """Create and load the demo database at scale 1; yields its conninfo."""
    import psycopg

    with psycopg.connect(cluster.conninfo("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{DEMO_DATABASE}"')
    conninfo = cluster.conninfo(DEMO_DATABASE)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for stmt in demo_schema_sql():
            conn.execute(stmt)
        for stmt in demo_data_sql(1):
            conn.execute(stmt)
    yield conninfo


# --------------------------------------------------------------------------
# database tests
# --------------------------------------------------------------------------


def _one(conninfo: str, sql: str) -> Any:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
    assert row is not None
    return row[0]


@pytest.mark.slow
def test_row_counts(shop_scale1: str) -> None:
    expected = demo_row_counts(1)
    for table in demo_tables():
        n = _one(shop_scale1, f"SELECT count(*) FROM {table}")
        assert n > 0, table
        if table == "order_items":  # 1..5 lines per order, ~2.5 on average
            assert expected["orders"] * 2 <= n <= expected["orders"] * 4
        else:
            assert n == expected[table], table


@pytest.mark.slow
def test_emails_unique_and_well_formed(shop_scale1: str) -> None:
    assert _one(shop_scale1, "SELECT count(DISTINCT email) = count(*) FROM customers") is True
    assert _one(shop_scale1, f"SELECT count(*) FROM customers WHERE email !~ '{EMAIL_RE}'") == 0
    unique_constraint = (
        "SELECT count(*) FROM pg_constraint WHERE conname = 'customers_email_key' AND contype = 'u'"
    )
    assert _one(shop_scale1, unique_constraint) == 1
    # names look like names, phones like international numbers
    bad_names = "SELECT count(*) FROM customers WHERE full_name !~ '^[A-Z][a-z]+ [A-Z][a-z]+$'"
    assert _one(shop_scale1, bad_names) == 0
    bad_phones = (
        "SELECT count(*) FROM customers WHERE phone IS NOT NULL "
        r"AND phone !~ '^\+[0-9]{1,3} [0-9]{3} [0-9]{3} [0-9]{4}$'"
    )
    assert _one(shop_scale1, bad_phones) == 0
    assert _one(shop_scale1, "SELECT count(DISTINCT full_name) FROM customers") > 1000


@pytest.mark.slow
def test_foreign_keys_valid(shop_scale1: str) -> None:
    orphans = {
        "orders->customers": "SELECT count(*) FROM orders o "
        "LEFT JOIN customers c ON c.id = o.customer_id WHERE c.id IS NULL",
        "items->orders": "SELECT count(*) FROM order_items i "
        "LEFT JOIN orders o ON o.id = i.order_id WHERE o.id IS NULL",
        "items->products": "SELECT count(*) FROM order_items i "
        "LEFT JOIN products p ON p.id = i.product_id WHERE p.id IS NULL",
        "events->customers": "SELECT count(*) FROM events e "
        "LEFT JOIN customers c ON c.id = e.customer_id "
        "WHERE e.customer_id IS NOT NULL AND c.id IS NULL",
    }
    for name, sql in orphans.items():
        assert _one(shop_scale1, sql) == 0, name
    validated_fks = "SELECT count(*) FROM pg_constraint WHERE contype = 'f' AND convalidated"
    assert _one(shop_scale1, validated_fks) == 4
    # every order has items and its total matches them; nobody orders before signing up
    empty_orders = (
        "SELECT count(*) FROM orders o "
        "WHERE NOT EXISTS (SELECT 1 FROM order_items i WHERE i.order_id = o.id)"
    )
    assert _one(shop_scale1, empty_orders) == 0
    wrong_totals = (
        "SELECT count(*) FROM orders o WHERE total <> "
        "(SELECT sum(quantity * unit_price) FROM order_items i WHERE i.order_id = o.id)"
    )
    assert _one(shop_scale1, wrong_totals) == 0
    early_orders = (
        "SELECT count(*) FROM orders o JOIN customers c ON c.id = o.customer_id "
        "WHERE o.placed_at < c.created_at"
    )
    assert _one(shop_scale1, early_orders) == 0


@pytest.mark.slow
def test_data_spread_indexes_and_sequences(shop_scale1: str) -> None:
    import psycopg

    assert _one(shop_scale1, "SELECT count(DISTINCT date_part('year', placed_at)) FROM orders") >= 6
    assert _one(shop_scale1, "SELECT count(DISTINCT status) FROM orders") == 6
    assert _one(shop_scale1, "SELECT count(DISTINCT category) FROM products") == 10
    assert _one(shop_scale1, "SELECT count(DISTINCT payload->>'user_agent') FROM events") == 7
    assert _one(shop_scale1, "SELECT count(*) FROM pg_indexes WHERE schemaname = 'public'") >= 15
    # ANALYZE ran
    stats = "SELECT count(*) FROM pg_stats WHERE schemaname = 'public' AND tablename = 'orders'"
    assert _one(shop_scale1, stats) > 0
    # identity sequences were moved past the loaded ids: a plain INSERT works
    with psycopg.connect(shop_scale1) as conn:  # not autocommit: rolled back below
        row = conn.execute(
            "INSERT INTO customers (email, full_name, country) "
            "VALUES ('new.customer@example.com', 'New Customer', 'US') RETURNING id"
        ).fetchone()
        conn.rollback()
    assert row is not None
    assert row[0] == demo_row_counts(1)["customers"] + 1


@pytest.mark.slow
def test_size_in_band(shop_scale1: str) -> None:
    db_size = _one(shop_scale1, "SELECT pg_database_size(current_database())")
    rel_size = _one(
        shop_scale1,
        "SELECT sum(pg_total_relation_size(c.oid))::bigint FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND c.relkind = 'r'",
    )
    lo, hi = SCALE1_DB_SIZE_BAND
    assert lo <= db_size <= hi, f"pg_database_size = {db_size / MiB:.1f} MiB"
    lo, hi = SCALE1_RELATION_SIZE_BAND
    assert lo <= rel_size <= hi, f"tables+indexes = {rel_size / MiB:.1f} MiB"


@pytest.mark.slow
def test_deterministic(cluster: Cluster, shop_scale1: str) -> None:
    """A second load of scale 1 yields exactly the same rows."""
    import psycopg

    with psycopg.connect(cluster.conninfo("postgres"), autocommit=True) as conn:
        conn.execute("CREATE DATABASE shop_again")
    again = cluster.conninfo("shop_again")
    with psycopg.connect(again, autocommit=True) as conn:
        for stmt in demo_schema_sql() + demo_data_sql(1):
            conn.execute(stmt)
    for table in demo_tables():
        order = "order_id, line_no" if table == "order_items" else "id"
        digest = f"SELECT md5(string_agg(t::text, '|' ORDER BY {order})) FROM {table} t"
        assert _one(again, digest) == _one(shop_scale1, digest), table
