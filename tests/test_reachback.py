"""A source that is wired to another live server, as production often is: a logical subscriber of
a running publisher, with a postgres_fdw server whose user mappings hold a password. Neither
preparing its base nor any branch of it may connect to that server, or keep its credentials.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers import (
    RUNTIMES,
    as_branch_role,
    as_engine,
    branch_of,
    extra_server,
    free_tcp_port,
    remove_base,
    source_dsn,
)
from pgoverlay.runner import seed
from pgoverlay.runner.polling import wait_for
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion, Branch
from pgoverlay.runner.postgres import cluster

pytestmark = pytest.mark.slow

PUB_SECRET = "pub-secret-R4t"  # noqa: S105 - made-up passwords of the test's publisher
FDW_SECRET = "fdw-secret-K9w"  # noqa: S105
TCP_CONNECTION = re.compile(r"connection received: host=(?!\[local\])")


@dataclass(frozen=True)
class Wired:
    publisher: cluster.Running
    publisher_log: Path
    source: cluster.Running
    walsender_pid: int  # the real subscriber's connection to the publisher


def _publisher_conn(srv: cluster.Running, dbname: str = "pub") -> psycopg.Connection[Any]:
    """Through the publisher's socket: these checks add no TCP connection to its log."""
    return psycopg.connect(**srv.conninfo(user="postgres", dbname=dbname), autocommit=True)


def tcp_connections(wired: Wired) -> int:
    """TCP connections the publisher has received so far (log_connections=on)."""
    return len(TCP_CONNECTION.findall(wired.publisher_log.read_text()))


@pytest.fixture(scope="module")
def wired(pool: Pool) -> Iterator[Wired]:
    port = free_tcp_port()
    publisher_options = {
        "wal_level": "logical",
        "listen_addresses": "127.0.0.1",
        "port": str(port),
        "log_connections": "on",
        "max_wal_senders": "10",
        "max_replication_slots": "10",
    }
    hba = (
        "local all all trust\n"
        "host all all 127.0.0.1/32 scram-sha-256\n"
        "host replication all 127.0.0.1/32 scram-sha-256\n"
    )
    with extra_server(pool, "publisher", options=publisher_options, hba=hba) as publisher:
        with _publisher_conn(publisher, "postgres") as conn:
            conn.execute(f"CREATE ROLE repl LOGIN REPLICATION PASSWORD '{PUB_SECRET}'")
            conn.execute(f"CREATE ROLE fdw_user LOGIN PASSWORD '{FDW_SECRET}'")
            conn.execute("CREATE DATABASE pub")
        with _publisher_conn(publisher) as conn:
            conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
            conn.execute("INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 50) g")
            conn.execute("GRANT SELECT ON items TO repl, fdw_user")
            conn.execute("CREATE PUBLICATION items_pub FOR TABLE items")
        remote = f"host=127.0.0.1 port={port} dbname=pub"
        with extra_server(
            pool,
            "subscriber",
            # cluster.running cuts servers off from logical replication; this one is the real
            # subscriber, so it gets its apply workers back.
            options={"wal_level": "replica", "max_logical_replication_workers": "4"},
        ) as source:
            with psycopg.connect(**source.conninfo(user="postgres"), autocommit=True) as conn:
                conn.execute("CREATE ROLE app_owner")
                conn.execute("CREATE DATABASE app OWNER app_owner")
            with psycopg.connect(
                **source.conninfo(user="postgres", dbname="app"), autocommit=True
            ) as conn:
                conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
                conn.execute("ALTER TABLE items OWNER TO app_owner")
                conn.execute(
                    f"CREATE SUBSCRIPTION items_sub CONNECTION '{remote} user=repl "
                    f"password={PUB_SECRET}' PUBLICATION items_pub"
                )
                wait_for(
                    lambda: (
                        conn.execute("SELECT count(*) FROM items").fetchone() == (50,)
                        and conn.execute(
                            "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'"
                        ).fetchone()
                        == (0,)
                    ),
                    timeout=60,
                    what="the subscription to copy the publisher's rows",
                )
                conn.execute("CREATE EXTENSION postgres_fdw")
                conn.execute("CREATE EXTENSION dblink")
                conn.execute(
                    f"CREATE SERVER prod FOREIGN DATA WRAPPER postgres_fdw "
                    f"OPTIONS (host '127.0.0.1', port '{port}', dbname 'pub')"
                )
                conn.execute("GRANT USAGE ON FOREIGN SERVER prod TO app_owner")
                for who in ("PUBLIC", "app_owner"):
                    conn.execute(
                        f"CREATE USER MAPPING FOR {who} SERVER prod "
                        f"OPTIONS (user 'fdw_user', password '{FDW_SECRET}')"
                    )
                conn.execute(
                    "CREATE FOREIGN TABLE remote_items (id int, name text) SERVER prod "
                    "OPTIONS (table_name 'items')"
                )
                conn.execute("ALTER FOREIGN TABLE remote_items OWNER TO app_owner")
                # The wiring works on the source, so the checks on branches are not vacuous.
                conn.execute("SET ROLE app_owner")
                assert conn.execute("SELECT count(*) FROM remote_items").fetchone() == (50,)
                conn.execute("RESET ROLE")
                conn.execute("CHECKPOINT")
            with _publisher_conn(publisher) as conn:
                row = conn.execute(
                    "SELECT pid FROM pg_stat_replication WHERE application_name = 'items_sub'"
                ).fetchone()
                assert row is not None, "the real subscriber is not streaming"
            yield Wired(
                publisher=publisher,
                publisher_log=publisher.socket_dir / "postgres.log",
                source=source,
                walsender_pid=int(row[0]),
            )


@pytest.fixture(scope="module")
def seeded(pool: Pool, wired: Wired) -> Iterator[tuple[BaseVersion, int]]:
    """The base, and the publisher's count of TCP connections just before it was seeded."""
    before = tcp_connections(wired)
    base = seed.seed(pool, "wired", source_dsn=source_dsn(wired.source))
    yield base, before
    remove_base(pool, base)


@pytest.fixture(scope="module", params=RUNTIMES)
def wired_branch(
    request: pytest.FixtureRequest, pool: Pool, seeded: tuple[BaseVersion, int]
) -> Iterator[Branch]:
    base, _ = seeded
    runtime = str(request.param)
    with branch_of(pool, base, name=f"wired-{runtime}", runtime=runtime) as made:
        yield made


def assert_publisher_sees_only_the_real_subscriber(wired: Wired, tcp_before: int) -> None:
    with _publisher_conn(wired.publisher) as conn:
        assert conn.execute("SELECT pid FROM pg_stat_replication").fetchall() == [
            (wired.walsender_pid,)
        ]
        slots = conn.execute("SELECT slot_name, active_pid FROM pg_replication_slots").fetchall()
        assert slots == [("items_sub", wired.walsender_pid)]
        assert conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE usename IN ('fdw_user', 'repl') "
            "AND backend_type = 'client backend'"
        ).fetchone() == (0,)
    assert tcp_connections(wired) == tcp_before, "something connected to the publisher over TCP"


def test_seed_disables_subscriptions_and_drops_user_mappings_and_says_so(
    pool: Pool, wired: Wired, seeded: tuple[BaseVersion, int]
) -> None:
    base, tcp_before = seeded
    for note in (
        "database app: subscription items_sub: disabled, slot_name NONE, connection string removed",
        "database app: user mapping for PUBLIC on foreign server prod removed",
        "database app: user mapping for app_owner on foreign server prod removed",
    ):
        assert note in base.neutralised_notes, note
    # Preparing the base started Postgres on the copy: it did not reach the publisher either.
    assert_publisher_sees_only_the_real_subscriber(wired, tcp_before)
    store = pool.store_dir(base.name, base.version)
    for path in store.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            for secret in (PUB_SECRET, FDW_SECRET):
                assert secret.encode() not in data, f"{secret} left in {path}"


def test_a_branch_never_connects_to_the_publisher_or_the_foreign_server(
    pool: Pool, wired: Wired, seeded: tuple[BaseVersion, int], wired_branch: Branch
) -> None:
    base, tcp_before = seeded
    with as_engine(pool, wired_branch, base) as conn:
        assert conn.execute(
            "SELECT subenabled, subslotname, subconninfo FROM pg_subscription"
        ).fetchall() == [(False, None, "")]
        assert conn.execute("SHOW max_logical_replication_workers").fetchone() == ("0",)
        assert conn.execute("SELECT count(*) FROM pg_user_mappings").fetchone() == (0,)
        assert conn.execute("SELECT srvname FROM pg_foreign_server").fetchall() == [("prod",)]
    with as_branch_role(pool, wired_branch) as conn:
        for role in ("NONE", "app_owner"):
            conn.execute(f"SET ROLE {role}")
            with pytest.raises(psycopg.Error):
                conn.execute("SELECT count(*) FROM remote_items")
            with pytest.raises(psycopg.Error):
                conn.execute("SELECT dblink_connect('prod')")
            with pytest.raises(psycopg.Error):
                conn.execute("SELECT * FROM dblink('prod', 'SELECT 1') AS t(x int)")
            with pytest.raises(psycopg.Error):
                conn.execute("ALTER SUBSCRIPTION items_sub ENABLE")
            with pytest.raises(psycopg.Error):
                conn.execute("ALTER SUBSCRIPTION items_sub REFRESH PUBLICATION")
        conn.execute("RESET ROLE")
        # pg_read_all_data reads the catalogs too: they hold no credential any more.
        for query in (
            "SELECT subconninfo FROM pg_subscription",
            "SELECT umoptions::text FROM pg_user_mapping",
            "SELECT rolpassword FROM pg_authid WHERE rolname <> current_user",
        ):
            for row in conn.execute(query).fetchall():
                assert not any(s in str(row) for s in (PUB_SECRET, FDW_SECRET, "SCRAM")), query
    assert_publisher_sees_only_the_real_subscriber(wired, tcp_before)
