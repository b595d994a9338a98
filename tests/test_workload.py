"""Production's workload kept with a base (runner/seed/workload.py): captured from a real source's
pg_stat_statements when a base is seeded, given again by `base workload`, shown by `base show`
and the engine, root's alone, and removed with its version by `base rm` and by gc."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import PORTS
from psycopg import sql

from helpers import cli, extra_server, os_user, port_free, require_root, source_dsn
from pgoverlay.runner import seed
from pgoverlay.runner.pool import Pool, gc
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.seed import bases, workload
from pgoverlay.runner.service.engine import LocalEngine
from pgoverlay.runner.service.shape import as_dict
from pgoverlay.runner.service.views import BaseWorkload

SECRET = "s3cret-literal-in-a-utility"
READER = "pgo-runner"  # a workflow's user: in the service's group


# -- pure: which statements, in which order ---------------------------------------------------


def test_only_plannable_statements_are_kept_and_their_comments_are_stripped() -> None:
    assert workload.plannable("/* app:checkout */ SELECT id FROM t WHERE id = $1") == (
        "SELECT id FROM t WHERE id = $1"
    )
    assert workload.plannable("-- hot path\nupdate t set n = n + $1") == "update t set n = n + $1"
    kept = [
        "INSERT INTO t VALUES ($1)",
        "DELETE FROM t WHERE id = $1",
        "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN DELETE",
        "WITH a AS (SELECT $1) SELECT * FROM a",
        "VALUES ($1)",
        "(SELECT $1) UNION (SELECT $2)",
        "WITH d AS (DELETE FROM t RETURNING *) INSERT INTO x SELECT * FROM d",
        "TABLE t",
        # more than the 10,000 tokens sqlparse's grouping would refuse
        "SELECT * FROM t WHERE id IN (" + ", ".join(f"${i}" for i in range(1, 6001)) + ")",
    ]
    for text in kept:
        assert workload.plannable(text) == text, text
    refused = [
        f"ALTER ROLE app PASSWORD '{SECRET}'",
        "CREATE TABLE x AS SELECT 1",
        "SELECT 1 INTO newtable",
        "EXPLAIN SELECT 1",
        "COPY t TO STDOUT",
        "DECLARE c CURSOR FOR SELECT 1",
        "SET search_path = public",
        "SELECT 1; SELECT 2",
        "WITH a AS (SELECT 1) SELECT * INTO newtable FROM a",
        "$1",
        "/* only a comment */",
    ]
    for text in refused:
        assert workload.plannable(text) is None, text


def test_the_top_statements_are_chosen_by_total_time_then_calls_each_query_id_once() -> None:
    counted = [
        workload.Counted(1, "SELECT 1", calls=10, total_ms=5.0, rows=10),
        workload.Counted(2, "SELECT 2", calls=30, total_ms=50.0, rows=30),
        workload.Counted(3, "SELECT 3", calls=20, total_ms=50.0, rows=20),
        workload.Counted(4, "VACUUM t", calls=1, total_ms=900.0, rows=0),
        workload.Counted(5, workload.HIDDEN, calls=1, total_ms=800.0, rows=0),
        # the same statement counted for another role: one statement, its counts added
        workload.Counted(1, "SELECT 1", calls=10, total_ms=60.0, rows=10),
    ]
    chosen = workload.choose(counted, top=3, elapsed=10.0)
    assert [s.queryid for s in chosen] == [1, 2, 3]
    assert (chosen[0].calls, chosen[0].total_ms, chosen[0].rows) == (20, 65.0, 20)
    assert chosen[0].mean_ms == pytest.approx(3.25)
    assert chosen[0].per_second == pytest.approx(2.0)
    assert [s.queryid for s in workload.choose(counted, top=2, elapsed=None)] == [1, 2]
    assert workload.choose(counted, top=2, elapsed=None)[0].per_second == 0.0


# -- a real source with pg_stat_statements ------------------------------------------------------


@pytest.fixture(scope="module")
def stats_source(pool: Pool) -> Iterator[cluster.Running]:
    """A source of this module's own that preloads pg_stat_statements (the session's does not,
    and the library needs a server started with it), with a known workload run on it."""
    with extra_server(
        pool,
        "stats-source",
        options={"shared_preload_libraries": "pg_stat_statements", "wal_level": "replica"},
    ) as srv:
        with psycopg.connect(**srv.conninfo(user="postgres"), autocommit=True) as conn:
            conn.execute("CREATE DATABASE app")
            conn.execute("CREATE ROLE plain LOGIN")
        with psycopg.connect(**srv.conninfo(user="postgres", dbname="app"), autocommit=True) as c:
            c.execute("CREATE EXTENSION pg_stat_statements")
            c.execute("CREATE TABLE orders (id int PRIMARY KEY, total numeric NOT NULL)")
            c.execute("INSERT INTO orders SELECT g, g FROM generate_series(1, 5000) g")
            c.execute("GRANT SELECT ON orders TO plain")
            c.execute("SELECT pg_stat_statements_reset()")
            for i in range(1, 51):
                c.execute("/* app:checkout */ SELECT total FROM orders WHERE id = %s", (i,))
            for i in range(1, 11):
                c.execute("UPDATE orders SET total = total + 1 WHERE id = %s", (i,))
            for _ in range(3):
                c.execute("SELECT count(*) FROM orders WHERE total > 100")
            c.execute(f"ALTER ROLE plain PASSWORD '{SECRET}'")
            c.execute("CREATE TABLE scratch AS SELECT 1 AS one")
        with psycopg.connect(**srv.conninfo(user="plain", dbname="app"), autocommit=True) as c:
            c.execute("SELECT id FROM orders WHERE id < 3")
        yield srv


def _remove(pool: Pool, name: str) -> None:
    with contextlib.suppress(Exception):
        bases.remove(pool, name, destroy_branches=True)


def _query(found: Any, start: str) -> Any:
    (match,) = [s for s in found.statements if s.query.startswith(start)]
    return match


def test_a_seed_keeps_the_sources_top_statements_with_rates_root_only_and_rm_removes_them(
    pool: Pool, stats_source: cluster.Running, env: dict[str, str], service: Path
) -> None:
    require_root()
    name = "workload-seed"
    try:
        base = seed.seed(pool, name, source_dsn=source_dsn(stats_source))
        path = pool.workload_file(name, base.version)
        st = path.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o600)
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(path.parent.parent.stat().st_mode) == 0o700
        raw = path.read_text()
        assert SECRET not in raw and "app:checkout" not in raw
        found = workload.load(path)
        assert found is not None and (found.name, found.version) == (name, base.version)
        assert found.stats_reset is not None and found.captured_at > found.stats_reset
        point = _query(found, "SELECT total FROM orders WHERE id = $1")
        assert point.calls == 50 and point.rows == 50
        assert point.mean_ms == pytest.approx(point.total_ms / 50)
        elapsed = found.captured_at - found.stats_reset
        assert point.per_second == pytest.approx(50 / elapsed, rel=0.2)
        update = _query(found, "UPDATE orders SET total = total + $2 WHERE id = $1")
        assert update.calls == 10
        assert not [
            s
            for s in found.statements
            if s.query.split()[0].upper()
            not in ("SELECT", "INSERT", "UPDATE", "DELETE", "MERGE", "WITH")
        ]
        assert not [s for s in found.statements if "CREATE" in s.query or "ALTER" in s.query]
        order = [(s.total_ms, s.calls) for s in found.statements]
        assert order == sorted(order, reverse=True)

        # the engine answers it; `base show` prints a count and the first few with rates
        answered = LocalEngine(pool, uid=0).base_workload(name)
        assert answered == found
        shown = cli(["base", "show", name, "--top", "50"], env=env)
        assert shown.returncode == 0, shown.stderr
        assert f"workload of v{base.version}: {len(found.statements)} statements" in shown.stdout
        assert f"{point.per_second:9.2f}/s" in shown.stdout
        as_json = cli(["base", "show", name, "--json"], env=env)
        assert as_json.returncode == 0, as_json.stderr
        statements = json.loads(as_json.stdout)["workload"]["statements"]
        assert len(statements) == len(found.statements)
        # a member of the service's group reads it through the engine service's socket
        os_user(READER, groups=["pgoverlay"])
        asked = cli(["base", "show", name, "--json"], env=env, user=READER, groups=["pgoverlay"])
        assert asked.returncode == 0, asked.stderr
        assert json.loads(asked.stdout)["workload"] == as_dict(found)

        bases.remove(pool, name)
        assert not path.exists() and not path.parent.exists()
    finally:
        _remove(pool, name)


def test_workload_top_keeps_the_first_n_by_total_time(
    pool: Pool, stats_source: cluster.Running
) -> None:
    require_root()
    name = "workload-top"
    # Two statements far above the rest by total time: the ranking of the module's light
    # statements moves with what each seed itself reads of the source between two captures.
    with psycopg.connect(
        **stats_source.conninfo(user="postgres", dbname="app"), autocommit=True
    ) as c:
        for _ in range(4):
            c.execute("SELECT pg_sleep(0.05)")
            c.execute("SELECT pg_sleep(0.025), 1")  # a query of its own
    try:
        everything = seed.seed(pool, name, source_dsn=source_dsn(stats_source), workload_top=100)
        full = workload.load(pool.workload_file(name, everything.version))
        assert full is not None and len(full.statements) > 2
        # the seed's own reads of the source (its checks, its space estimate) are not production's
        assert not [s.query for s in full.statements if "pg_database_size" in s.query]
        assert [s.query for s in full.statements[:2]] == [
            "SELECT pg_sleep($1)",
            "SELECT pg_sleep($1), $2",
        ]
        two = seed.seed(
            pool, name, source_dsn=source_dsn(stats_source), workload_top=2, refresh=True
        )
        top = workload.load(pool.workload_file(name, two.version))
        assert top is not None
        assert [s.queryid for s in top.statements] == [s.queryid for s in full.statements[:2]]
        none = seed.seed(
            pool, name, source_dsn=source_dsn(stats_source), workload_top=0, refresh=True
        )
        assert not pool.workload_file(name, none.version).exists()
        # gc finishes a removal a killed `base rm` left (v2), and removes a superseded version
        # nobody uses (v1): each one's workload goes with it
        pool.registry.mark_removing(name, [two.version], allow_branches=False)
        gc.collect(pool)
        assert [b.version for b in pool.registry.bases(name)] == [none.version]
        assert not pool.workload_file(name, two.version).exists()
        assert not pool.workload_file(name, everything.version).exists()
    finally:
        _remove(pool, name)


def test_a_role_without_pg_read_all_stats_gets_its_own_statements_and_a_note(
    stats_source: cluster.Running,
) -> None:
    with psycopg.connect(**stats_source.conninfo(user="plain", dbname="app"), autocommit=True) as c:
        found = workload.capture(c, top=50, source="test", base="b")
        again = workload.capture(c, top=50, source="test", base="b")  # its own reads: not kept
    assert "pg_read_all_stats" in found.note
    assert [s.query for s in found.statements] == ["SELECT id FROM orders WHERE id < $1"]
    assert [s.query for s in again.statements] == [s.query for s in found.statements]


def test_a_source_without_pg_stat_statements_is_said_in_one_line_and_the_seed_succeeds(
    pool: Pool, source: cluster.Running, env: dict[str, str]
) -> None:
    require_root()
    name = "workload-none"
    try:
        done = cli(["base", "seed", name, "--from", source_dsn(source)], env=env, timeout=600)
        assert done.returncode == 0, done.stderr
        said = [line for line in done.stderr.splitlines() if "pg_stat_statements" in line]
        assert len(said) == 1, done.stderr
        assert "no workload captured" in said[0] and f"base workload {name}" in said[0]
        (version,) = [b.version for b in pool.registry.bases(name)]
        assert not pool.workload_file(name, version).exists()
        shown = cli(["base", "show", name], env=env)
        assert shown.returncode == 0, shown.stderr
        assert "workload: none" in shown.stdout
    finally:
        _remove(pool, name)


def test_base_workload_gives_it_from_a_source_or_an_export_without_reseeding(
    pool: Pool,
    stats_source: cluster.Running,
    source: cluster.Running,
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    require_root()
    name = "workload-given"
    try:
        base = seed.seed(pool, name, source_dsn=source_dsn(source))  # no extension there
        path = pool.workload_file(name, base.version)
        assert not path.exists()
        done = cli(
            ["base", "workload", name, "--from", source_dsn(stats_source), "--top", "3"], env=env
        )
        assert done.returncode == 0, done.stderr
        given = workload.load(path)
        assert given is not None and len(given.statements) == 3
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_uid == 0
        assert [b.version for b in pool.registry.bases(name)] == [base.version]

        export = tmp_path / "export.csv"
        export.write_text(
            "userid,queryid,query,calls,total_exec_time,rows,per_second\n"
            '10,7,"/* c */ SELECT a FROM t WHERE b = $1",100,40.0,100,2.5\n'
            "10,8,VACUUM t,1,9000.0,0,0.1\n"
            "11,7,SELECT a FROM t WHERE b = $1,50,20.0,50,1.5\n"
            "10,9,DELETE FROM t WHERE b = $1,4,80.0,4,0.5\n"
        )
        os.chmod(tmp_path, 0o755)
        done = cli(["base", "workload", name, "--file", os.fspath(export)], env=env)
        assert done.returncode == 0, done.stderr
        from_csv = workload.load(path)
        assert from_csv is not None
        assert [(s.queryid, s.calls, s.per_second) for s in from_csv.statements] == [
            (9, 4, 0.5),
            (7, 150, 4.0),
        ]
        assert from_csv.statements[1].query == "SELECT a FROM t WHERE b = $1"

        as_json = tmp_path / "export.json"
        as_json.write_text(
            json.dumps([{"queryid": 5, "query": "SELECT 1", "calls": 3, "total_time": 1.5}])
        )
        done = cli(["base", "workload", name, "--file", os.fspath(as_json)], env=env)
        assert done.returncode == 0, done.stderr
        from_json = workload.load(path)
        assert from_json is not None
        assert [(s.queryid, s.mean_ms) for s in from_json.statements] == [(5, 0.5)]

        broken = tmp_path / "broken.csv"
        broken.write_text("queryid,query\n1,SELECT 1\n")
        done = cli(["base", "workload", name, "--file", os.fspath(broken)], env=env)
        assert done.returncode != 0
        assert "calls, total_exec_time" in done.stderr and "needs the columns" in done.stderr
    finally:
        _remove(pool, name)


def test_the_kept_workload_is_read_back_as_written() -> None:
    kept = workload.named(
        BaseWorkload(
            captured_at=time.time(),
            source="db:5432 app",
            stats_reset=1.0,
            statements=workload.choose(
                [workload.Counted(1, "SELECT $1", calls=2, total_ms=1.0, rows=2)],
                top=5,
                elapsed=4.0,
            ),
        ),
        "b",
        3,
    )
    assert workload.loads(workload.dumps(kept)) == kept
    assert workload.loads('{"format": 99}') is None


def test_base_workload_from_a_source_that_asks_a_password_takes_it_off_the_command_line(
    pool: Pool, source: cluster.Running, env: dict[str, str], tmp_path: Path
) -> None:
    require_root()
    port = next(p for p in range(PORTS[1] - 40, PORTS[0], -1) if port_free(p))
    password = f"pw-{secrets.token_hex(8)}"
    name = "workload-password"
    with extra_server(
        pool,
        "stats-locked",
        options={
            "shared_preload_libraries": "pg_stat_statements",
            "listen_addresses": "127.0.0.1",
            "port": str(port),
            "password_encryption": "scram-sha-256",
        },
        hba="local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n",
    ) as srv:
        with psycopg.connect(**srv.conninfo(user="postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER ROLE postgres PASSWORD {}").format(password))
            conn.execute("CREATE EXTENSION pg_stat_statements")
            conn.execute("SELECT count(*) FROM pg_class WHERE relpages > 0")
        dsn = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
        try:
            seed.seed(pool, name, source_dsn=source_dsn(source), workload_top=0)
            refused = cli(["base", "workload", name, "--from", dsn], env=env)
            assert refused.returncode != 0
            assert "asks for a password and none was given" in refused.stderr
            secret = tmp_path / "password"
            secret.write_text(password + "\n")
            secret.chmod(0o600)
            given = cli(
                ["base", "workload", name, "--from", dsn, "--password-file", os.fspath(secret)],
                env=env,
            )
            assert given.returncode == 0, given.stderr
            assert password not in given.stdout + given.stderr
            kept = workload.load(pool.workload_file(name, 1))
            assert kept is not None
            assert "SELECT count(*) FROM pg_class WHERE relpages > $1" in [
                s.query for s in kept.statements
            ]
            from_env = cli(
                ["base", "workload", name, "--from", dsn], env={**env, "PGPASSWORD": password}
            )
            assert from_env.returncode == 0, from_env.stderr
        finally:
            _remove(pool, name)
