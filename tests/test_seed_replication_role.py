"""Seeding as the quick start does: through the command, from a source reached as a role that
has ``LOGIN REPLICATION`` and no other right. Everything after the copy runs as the copy's own
superuser; what the role cannot read of the source before the copy is a warning, not a failure.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from helpers import as_branch_role, cli, extra_server, remove_base, source_dsn
from pgoverlay.runner import branch
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.postgres import cluster

pytestmark = pytest.mark.slow

# The role may replicate and connect, as a production pg_hba.conf lets a replication user.
HBA = "local all postgres trust\nlocal replication replicator trust\nlocal all replicator trust\n"


@pytest.fixture(scope="module")
def repl_source(pool: Pool) -> Iterator[cluster.Running]:
    with extra_server(pool, "repl-source", options={"wal_level": "replica"}, hba=HBA) as srv:
        with psycopg.connect(**srv.conninfo(user="postgres"), autocommit=True) as conn:
            conn.execute("CREATE ROLE replicator LOGIN REPLICATION")
            conn.execute("CREATE ROLE app_owner NOLOGIN")
            conn.execute("CREATE DATABASE app OWNER app_owner")
        with psycopg.connect(
            **srv.conninfo(user="postgres", dbname="app"), autocommit=True
        ) as conn:
            conn.execute("SET ROLE app_owner")
            conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
            conn.execute("INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 10) g")
        yield srv


def test_a_role_with_only_login_and_replication_seeds_a_base_through_the_command(
    pool: Pool, env: dict[str, str], repl_source: cluster.Running
) -> None:
    srv = repl_source
    with psycopg.connect(**srv.conninfo(user="replicator", dbname="app"), autocommit=True) as conn:
        row = conn.execute(
            "SELECT rolsuper, rolcreaterole, rolcreatedb, rolbypassrls, rolreplication "
            "FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        assert row == (False, False, False, False, True)
        assert conn.execute(
            "SELECT count(*) FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.member "
            "WHERE r.rolname = 'replicator'"
        ).fetchone() == (0,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT count(*) FROM pg_authid")
    try:
        done = cli(
            ["base", "seed", "repl", "--from", source_dsn(srv, user="replicator", dbname="app")],
            env={**env, "COLUMNS": "400"},
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, output
        base = pool.registry.latest_base("repl")
        assert base is not None and base.superuser == "postgres"
        # The lockdown read pg_authid: as the copy's superuser, not as the replicator.
        assert "role replicator: login removed" in base.neutralised_notes, output
        # What only a more privileged role could read of the source is said, not failed on.
        assert "replicator cannot read these settings of the source" in output, output
        assert "shared_preload_libraries" in output and "pg_read_all_settings" in output
        b = branch.create(pool, "repl-branch", base_name="repl", runtime="local")
        with as_branch_role(pool, b) as conn:
            assert conn.execute("SELECT count(*) FROM items").fetchone() == (10,)
    finally:
        made = pool.registry.latest_base("repl")
        if made is not None:
            remove_base(pool, made)


def test_a_library_the_role_could_not_see_preloaded_is_refused_from_the_copys_files(
    pool: Pool, env: dict[str, str], repl_source: cluster.Running
) -> None:
    with psycopg.connect(**repl_source.conninfo(user="postgres"), autocommit=True) as conn:
        # Configured, not yet applied: only the copied postgresql.auto.conf says so.
        conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'no_such_lib'")
        try:
            done = cli(
                ["base", "seed", "repl-lib", "--from", source_dsn(repl_source, user="replicator")],
                env={**env, "COLUMNS": "400"},
            )
        finally:
            conn.execute("ALTER SYSTEM RESET shared_preload_libraries")
    assert done.returncode != 0
    assert "preloads library 'no_such_lib'" in done.stderr, done.stderr
    assert "postgresql-15-no-such-lib" in done.stderr
    assert pool.registry.bases("repl-lib") == []


def test_a_role_with_only_login_and_replication_seeds_a_masked_base(
    pool: Pool, env: dict[str, str], repl_source: cluster.Running, tmp_path: Path
) -> None:
    """The rules are checked against the source's catalogs as the role, and applied to the
    copy as its superuser."""
    rules = tmp_path / "items-rules.yml"
    rules.write_text("tables:\n  public.items:\n    name: {fake: text}\n")
    try:
        done = cli(
            [
                "base",
                "seed",
                "repl-masked",
                "--mask",
                str(rules),
                "--from",
                source_dsn(repl_source, user="replicator"),
            ],
            env={**env, "COLUMNS": "400"},
        )
        assert done.returncode == 0, done.stdout + done.stderr
        base = pool.registry.latest_base("repl-masked")
        assert base is not None and base.masked
    finally:
        made = pool.registry.latest_base("repl-masked")
        if made is not None:
            remove_base(pool, made)
