"""A deliberately hostile source: a streaming replica whose files archive WAL, fetch WAL, ask for
1 TB of shared_buffers, turn SSL on with certificates that do not exist and wait for a synchronous
standby; its postgresql.conf lives outside the data directory, and a table lives in a tablespace
outside it. Branches of its base must start, work, stay apart, and never touch the world.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import signal
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from helpers import (
    RUNTIMES,
    as_engine,
    assert_no_leaks,
    postgres_processes_for,
    require_runtime,
    server_pid,
    source_dsn,
)
from pgoverlay.runner import branch, proc, seed
from pgoverlay.runner.branch import lookup
from pgoverlay.runner.polling import wait_for
from pgoverlay.runner.pool import Pool, gc
from pgoverlay.runner.pool.registry import BaseVersion, Branch
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.postgres import cluster

pytestmark = pytest.mark.slow

HOSTILE = {
    "archive_mode": "on",
    "shared_buffers": "1TB",
    "ssl": "on",
    "ssl_cert_file": "/nonexistent/pgoverlay-test/server.crt",
    "ssl_key_file": "/nonexistent/pgoverlay-test/server.key",
    "synchronous_standby_names": "*",
}
ROWS = 1000


@dataclass(frozen=True)
class Hostile:
    replica: cluster.Running
    markers: Path  # any file here means a branch (or prepare) ran a production command
    replica_tablespace: Path


@pytest.fixture(scope="module", params=RUNTIMES)
def branch_runtime(request: pytest.FixtureRequest, hostile_base: BaseVersion) -> str:
    """The runtime branches of these tests run in."""
    require_runtime(str(request.param), hostile_base.pg_major or 0)
    return str(request.param)


def create_branch(pool: Pool, name: str, *, base_name: str, runtime: str) -> Branch:
    return branch.create(pool, name, base_name=base_name, runtime=runtime)


def _owned_dir(pool: Pool, path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True)
    os.chown(path, pool.owner.uid, pool.owner.gid)
    return path


@pytest.fixture(scope="module")
def hostile(pool: Pool) -> Iterator[Hostile]:
    install = pgbin.newest()
    work = _owned_dir(pool, pool.home / "hostile")
    markers = _owned_dir(pool, work / "markers")
    primary_ts = _owned_dir(pool, work / "primary-ts")
    replica_ts = work / "replica-ts"
    etc = _owned_dir(pool, work / "etc")
    primary_dir, replica_dir = work / "primary", work / "replica"
    cluster.initdb(install, primary_dir, owner=pool.owner)
    try:
        with cluster.running(
            install,
            primary_dir,
            owner=pool.owner,
            scratch=pool.tmp,
            options={"wal_level": "replica", "fsync": "off", "max_wal_senders": "5"},
        ) as primary:
            with psycopg.connect(**primary.conninfo(user="postgres"), autocommit=True) as conn:
                conn.execute(
                    sql.SQL("CREATE TABLESPACE far LOCATION {}").format(
                        sql.Literal(os.fspath(primary_ts))
                    )
                )
                conn.execute("CREATE DATABASE app")
            with psycopg.connect(
                **primary.conninfo(user="postgres", dbname="app"), autocommit=True
            ) as conn:
                conn.execute("CREATE TABLE near (id int PRIMARY KEY, note text)")
                conn.execute("CREATE TABLE far_rows (id int PRIMARY KEY, note text) TABLESPACE far")
                for table in ("near", "far_rows"):
                    conn.execute(
                        sql.SQL(
                            "INSERT INTO {} SELECT g, 'base ' || g FROM generate_series(1, %s) g"
                        ).format(sql.Identifier(table)),
                        (ROWS,),
                    )
                conn.execute("CHECKPOINT")
            proc.run(
                [
                    install.tool("pg_basebackup"),
                    "-D",
                    replica_dir,
                    "-h",
                    os.fspath(primary.socket_dir),
                    "-p",
                    str(primary.port),
                    "-U",
                    "postgres",
                    "-R",
                    "-X",
                    "stream",
                    "-c",
                    "fast",
                    f"--tablespace-mapping={primary_ts}={replica_ts}",
                ],
                timeout=300,
                user=pool.owner,
            )
            # As Debian does: the configuration lives outside the data directory.
            for name in ("postgresql.conf", "pg_hba.conf", "pg_ident.conf"):
                shutil.move(replica_dir / name, etc / name)
            with cluster.running(
                install,
                replica_dir,
                owner=pool.owner,
                scratch=pool.tmp,
                options={
                    "config_file": os.fspath(etc / "postgresql.conf"),
                    "ident_file": os.fspath(etc / "pg_ident.conf"),
                    "primary_conninfo": (
                        f"host={primary.socket_dir} port={primary.port} user=postgres"
                    ),
                    "hot_standby": "on",
                },
            ) as replica:
                with psycopg.connect(**replica.conninfo(user="postgres"), autocommit=True) as conn:
                    assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
                    # Written into the replica's files now, applied by nobody: a copy carries them.
                    settings = {
                        **HOSTILE,
                        "archive_command": f"touch {markers}/archive-%f",
                        "restore_command": f"touch {markers}/restore-%f; false",
                    }
                    for key, value in settings.items():
                        conn.execute(
                            sql.SQL("ALTER SYSTEM SET {} = {}").format(
                                sql.Identifier(key), sql.Literal(value)
                            )
                        )
                # Something written on the primary after the copy reaches the replica by streaming.
                with psycopg.connect(
                    **primary.conninfo(user="postgres", dbname="app"), autocommit=True
                ) as conn:
                    conn.execute("INSERT INTO far_rows VALUES (0, 'streamed')")
                with psycopg.connect(
                    **replica.conninfo(user="postgres", dbname="app"), autocommit=True
                ) as conn:
                    wait_for(
                        lambda: (
                            conn.execute("SELECT count(*) FROM far_rows WHERE id = 0").fetchone()
                            == (1,)
                        ),
                        timeout=60,
                        what="the replica to replay the primary's insert",
                    )
                yield Hostile(replica=replica, markers=markers, replica_tablespace=replica_ts)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def hostile_base(pool: Pool, hostile: Hostile, caplog_module: list[str]) -> Iterator[BaseVersion]:
    base = seed.seed(pool, "hostile", source_dsn=source_dsn(hostile.replica))
    yield base
    seed.remove_version(pool, base.name, base.version)


@pytest.fixture(scope="module")
def caplog_module() -> Iterator[list[str]]:
    """Warnings logged while the module's fixtures run (caplog is function-scoped)."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                lines.append(record.getMessage())

    handler = Collect()
    logging.getLogger("pgoverlay").addHandler(handler)
    yield lines
    logging.getLogger("pgoverlay").removeHandler(handler)


def store_digest(root: Path) -> str:
    """Every path, type, mode and byte under ``root``."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        digest.update(f"{path.relative_to(root)}|{stat.S_IFMT(st.st_mode)}|{st.st_mode}".encode())
        if path.is_symlink():
            digest.update(os.readlink(path).encode())
        elif path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def write_heavily(conn: psycopg.Connection[Any], tag: str) -> None:
    """About 30 MB of WAL: many 1 MiB segments of the base, and several 16 MiB ones."""
    for table in ("near", "far_rows"):
        conn.execute(
            sql.SQL(
                "INSERT INTO {} SELECT 100000 + g, %s || repeat('x', 200) "
                "FROM generate_series(1, 60000) g"
            ).format(sql.Identifier(table)),
            (tag,),
        )
    conn.execute("UPDATE far_rows SET note = note || %s WHERE id <= %s", (tag, ROWS))
    conn.execute("CHECKPOINT")
    conn.execute("SELECT pg_switch_wal()")


def test_seed_from_a_hostile_standby_records_and_warns_what_branches_override(
    pool: Pool, hostile: Hostile, hostile_base: BaseVersion, caplog_module: list[str]
) -> None:
    assert hostile_base.source_role == "standby"
    assert hostile_base.tablespaces == "far"
    recorded = json.loads(hostile_base.source_settings)
    assert recorded["archive_mode"] == "on" and recorded["shared_buffers"] == "1TB"
    assert recorded["primary_conninfo"] == "(set)", "only whether a conninfo is set is kept"
    assert "touch" not in hostile_base.source_settings
    warned = "\n".join(caplog_module)
    for expected in (
        "archive_mode is on in the source: branches run with archive_mode=off",
        "archive_command is set in the source",
        "restore_command is set in the source",
        "primary_conninfo is set in the source",
        "ssl is on in the source",
        "shared_buffers is 1TB in the source: branches run with 32MB",
        "synchronous_standby_names is set in the source",
        "outside its data directory",
    ):
        assert expected in warned, expected
    store = pool.store_dir(hostile_base.name, hostile_base.version)
    # The hostile settings are in the base's files, so the checks below are not vacuous.
    auto = (store / "postgresql.auto.conf").read_text()
    assert "archive_mode = 'on'" in auto and "shared_buffers = '1TB'" in auto
    # What may carry production's credentials is gone from the base's files, value and all.
    for name in ("primary_conninfo", "archive_command", "restore_command"):
        assert f"\n{name} = " not in auto and f"credentials): {name}\n" in auto, name
    assert "markers" not in auto and "user=postgres" not in auto
    assert not (store / "postgresql.conf").exists()
    assert not (store / "standby.signal").exists()
    control = proc.run(
        [
            pgbin.for_major(15).tool("pg_controldata"),
            "-D",
            pool.base_dir("hostile", hostile_base.version),
        ],
        timeout=60,
        user=pool.owner,
    ).stdout
    # Crash recovery from the backup label, not archive recovery: no new timeline.
    assert re.search(r"^Latest checkpoint's TimeLineID:\s+1$", control, re.MULTILINE), control
    assert re.search(r"^Database cluster state:\s+shut down$", control, re.MULTILINE), control
    spaces = list((store / "pg_tblspc").iterdir())
    assert len(spaces) == 1 and spaces[0].is_dir() and not spaces[0].is_symlink()
    assert not list(pool.root.joinpath("staging").iterdir()), "staging left behind"


def test_branches_of_a_hostile_base_start_work_apart_and_leave_the_base_untouched(
    pool: Pool, hostile: Hostile, hostile_base: BaseVersion, branch_runtime: str
) -> None:
    store = pool.store_dir(hostile_base.name, hostile_base.version)
    before = store_digest(store)
    names = ["hostile-a", "hostile-b"]
    made = [
        create_branch(pool, name, base_name="hostile", runtime=branch_runtime) for name in names
    ]
    try:
        for b, tag in zip(made, ("a", "b"), strict=True):
            with as_engine(pool, b, hostile_base) as conn:
                shown = {
                    name: conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()
                    for name in ("archive_mode", "ssl", "shared_buffers", "restore_command")
                }
                assert shown == {
                    "archive_mode": ("off",),
                    "ssl": ("off",),
                    "shared_buffers": ("32MB",),
                    "restore_command": ("",),
                }
                assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)
                # The tablespace is in place: its location is inside the branch's data directory.
                location = conn.execute(
                    "SELECT oid, pg_tablespace_location(oid) FROM pg_tablespace "
                    "WHERE spcname = 'far'"
                ).fetchone()
                assert location is not None
                assert location[1] == f"pg_tblspc/{location[0]}"
                write_heavily(conn, tag)  # would hang with a synchronous standby required
            # A client over TCP with the branch password sees the writes too.
            with psycopg.connect(**branch.connection(pool, b).connect_kwargs()) as client:
                assert client.execute("SELECT 1").fetchone() == (1,)
        for b, tag, other in zip(made, ("a", "b"), ("b", "a"), strict=True):
            with as_engine(pool, b, hostile_base) as conn:
                for table in ("near", "far_rows"):
                    counts = conn.execute(
                        sql.SQL(
                            "SELECT count(*) FILTER (WHERE note LIKE %s), "
                            "count(*) FILTER (WHERE note LIKE %s) FROM {}"
                        ).format(sql.Identifier(table)),
                        (f"{tag}x%", f"{other}x%"),
                    ).fetchone()
                    assert counts == (60000, 0), (b.name, table, counts)
                assert conn.execute(
                    "SELECT count(*) FROM far_rows WHERE id = 0 AND note LIKE 'streamed%'"
                ).fetchone() == (1,)
            upper = branch.layout(pool, b.name).upper
            written = [p for p in (upper / "pg_tblspc").rglob("*") if p.is_file()]
            assert written, "the tablespace's writes belong in the branch's own layer"
            assert branch.layer_size(pool, b.name).logical_bytes > 10 * 1024 * 1024
        assert list(hostile.markers.iterdir()) == [], "a production command ran"
        imposed = {o.name: (o.base_value, o.branch_value) for o in lookup.overrides(pool, names[0])}
        assert imposed["archive_mode"] == ("on", "off")
        assert imposed["shared_buffers"] == ("1TB", "32MB")
        assert imposed["ssl"] == ("on", "off")
        branch.reset(pool, names[0])
        with as_engine(pool, branch.get(pool, names[0]), hostile_base) as conn:
            assert conn.execute("SELECT count(*) FROM far_rows").fetchone() == (ROWS + 1,)
            assert conn.execute("SELECT count(*) FROM near").fetchone() == (ROWS,)
    finally:
        for b in made:
            branch.destroy(pool, b.name)
    for b in made:
        assert_no_leaks(pool, b.name, port=b.port)
    assert list(hostile.markers.iterdir()) == [], "a production command ran"
    assert store_digest(store) == before, "the base changed"


def test_seed_via_dump_from_a_source_with_tablespaces_restores_into_the_default_one(
    pool: Pool, hostile: Hostile, caplog_module: list[str], branch_runtime: str
) -> None:
    already = len(caplog_module)
    dumped = seed.seed(pool, "hostile-dump", source_dsn=source_dsn(hostile.replica), via="dump")
    try:
        warned = caplog_module[already:]
        assert any("restored without them" in line for line in warned), warned
        assert not any("archive_mode" in line for line in warned), "a dump brings no settings"
        b = create_branch(pool, "hostile-dumped", base_name="hostile-dump", runtime=branch_runtime)
        try:
            with as_engine(pool, b, dumped) as conn:
                assert conn.execute("SELECT count(*) FROM far_rows").fetchone() == (ROWS + 1,)
                assert conn.execute("SELECT count(*) FROM pg_tablespace").fetchone() == (2,)
        finally:
            branch.destroy(pool, b.name)
    finally:
        seed.remove_version(pool, dumped.name, dumped.version)


def test_a_pool_with_its_own_certificate_gives_branches_ssl(
    pool: Pool, hostile_base: BaseVersion, branch_runtime: str
) -> None:
    certs = _owned_dir(pool, pool.home / "pool-ssl")
    cert, key = certs / "server.crt", certs / "server.key"
    try:
        proc.run(
            [
                "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                "-subj", "/CN=pgoverlay-test", "-keyout", key, "-out", cert,
            ],
            timeout=60,
            user=pool.owner,
        )  # fmt: skip
        with_ssl = Pool(
            pool.settings.replace(ssl_cert_file=cert, ssl_key_file=key),
            pool.info,
        )
        b = create_branch(with_ssl, "hostile-ssl", base_name="hostile", runtime=branch_runtime)
        try:
            kwargs = {**branch.connection(with_ssl, b).connect_kwargs(), "sslmode": "require"}
            with psycopg.connect(**kwargs) as conn:
                assert conn.execute(
                    "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
                ).fetchone() == (True,)
        finally:
            branch.destroy(with_ssl, b.name)
            with_ssl.close()
        assert_no_leaks(pool, b.name, port=b.port)
    finally:
        shutil.rmtree(certs, ignore_errors=True)


def test_a_crashed_branch_of_a_base_with_tablespaces_recovers_its_writes(
    pool: Pool, hostile_base: BaseVersion, branch_runtime: str
) -> None:
    b = create_branch(pool, "hostile-crash", base_name="hostile", runtime=branch_runtime)
    try:
        with as_engine(pool, b, hostile_base) as conn:
            conn.execute("INSERT INTO far_rows VALUES (-1, 'before the crash')")
        # The server and all its processes, as a crash.
        os.killpg(server_pid(pool, b.name), signal.SIGKILL)
        root = branch.layout(pool, b.name).root
        wait_for(lambda: postgres_processes_for(root) == [], timeout=30, what="the branch to die")
        # Docker notes a container's death a moment after its processes are gone.
        wait_for(
            lambda: not branch.status(pool, b.name).running, timeout=30, what="the death noticed"
        )
        report = gc.collect(pool)
        assert "hostile-crash" in report.restarted, report.problems
        with as_engine(pool, b, hostile_base) as conn:
            assert conn.execute("SELECT note FROM far_rows WHERE id = -1").fetchone() == (
                "before the crash",
            )
    finally:
        branch.destroy(pool, b.name)
    assert_no_leaks(pool, b.name, port=b.port)
