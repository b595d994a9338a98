"""The PR's SQL, run as the branch login role, tries to reach the runner's OS and to become a
superuser. Every attack must fail, on a base whose source handed its application roles
dangerous powers: an owner with CREATEROLE and pg_execute_server_program, a member of a
superuser role, grants on server-side file functions and on a superuser-only parameter, and
production logins with known passwords.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers import (
    RUNTIMES,
    as_branch_role,
    as_engine,
    branch_of,
    cli,
    extra_server,
    remove_base,
    source_dsn,
)
from pgoverlay.errors import SeedError
from pgoverlay.runner import branch, seed
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion, Branch
from pgoverlay.runner.postgres import cluster

pytestmark = pytest.mark.slow

PRODUCTION_PASSWORD = "prod-secret-Zq8"  # noqa: S105 - a test source's made-up password


@pytest.fixture(scope="module")
def attack_source(pool: Pool) -> Iterator[cluster.Running]:
    with extra_server(pool, "attack-source", options={"wal_level": "replica"}) as srv:
        with psycopg.connect(**srv.conninfo(user="postgres"), autocommit=True) as conn:
            for statement in (
                "ALTER ROLE postgres PASSWORD 'prod-secret-Zq8'",
                "CREATE ROLE ops NOLOGIN SUPERUSER",
                "CREATE ROLE app_owner NOLOGIN CREATEROLE",
                "GRANT pg_execute_server_program, pg_read_server_files, pg_write_server_files "
                "TO app_owner",
                "GRANT ops TO app_owner",
                "CREATE ROLE app_admin LOGIN SUPERUSER PASSWORD 'prod-secret-Zq8'",
                "CREATE ROLE app_user LOGIN PASSWORD 'prod-secret-Zq8'",
                "CREATE DATABASE shop OWNER app_owner",
                # A role with the branch role's name, a superuser in production.
                "CREATE ROLE pgoverlay LOGIN SUPERUSER PASSWORD 'prod-secret-Zq8'",
                "GRANT ops, pg_execute_server_program TO pgoverlay",
                "GRANT SET ON PARAMETER session_preload_libraries TO app_owner, pgoverlay",
            ):
                conn.execute(statement)
        with psycopg.connect(
            **srv.conninfo(user="postgres", dbname="shop"), autocommit=True
        ) as conn:
            conn.execute("GRANT EXECUTE ON FUNCTION lo_import(text) TO app_owner")
            conn.execute("GRANT EXECUTE ON FUNCTION pg_read_file(text) TO app_owner, pgoverlay")
            # Routines that run as a superuser for their callers, running dynamic SQL: one
            # granted only to app_owner in production, one left open to everyone.
            conn.execute(
                "CREATE FUNCTION run_admin(q text) RETURNS void LANGUAGE plpgsql "
                "SECURITY DEFINER AS $$BEGIN EXECUTE q; END$$"
            )
            conn.execute("REVOKE EXECUTE ON FUNCTION run_admin(text) FROM PUBLIC")
            conn.execute("GRANT EXECUTE ON FUNCTION run_admin(text) TO app_owner")
            conn.execute(
                "CREATE PROCEDURE maintain(q text) LANGUAGE plpgsql "
                "SECURITY DEFINER AS $$BEGIN EXECUTE q; END$$"
            )
            # Wrappers of the server's file functions, in an untrusted language: one left open
            # to PUBLIC (the default), one handed to app_owner.
            conn.execute(
                "CREATE FUNCTION read_any(text) RETURNS text LANGUAGE internal STRICT "
                "AS 'pg_read_file_all'"
            )
            conn.execute(
                "CREATE FUNCTION list_any(text) RETURNS SETOF text LANGUAGE internal STRICT "
                "AS 'pg_ls_dir_1arg'"
            )
            conn.execute("ALTER FUNCTION list_any(text) OWNER TO app_owner")
            conn.execute("SET ROLE app_owner")
            conn.execute("CREATE TABLE orders (id int PRIMARY KEY, note text)")
            conn.execute(
                "INSERT INTO orders SELECT g, 'order ' || g FROM generate_series(1, 100) g"
            )
        yield srv


@pytest.fixture(scope="module")
def seeded(
    pool: Pool, env: dict[str, str], attack_source: cluster.Running
) -> Iterator[tuple[BaseVersion, str]]:
    """The base, seeded through the command, and what the command printed."""
    done = cli(
        ["base", "seed", "attack", "--from", source_dsn(attack_source, dbname="shop")], env=env
    )
    assert done.returncode == 0, done.stderr
    base = pool.registry.latest_base("attack")
    assert base is not None
    yield base, done.stdout + done.stderr
    remove_base(pool, base)


@pytest.fixture(scope="module", params=RUNTIMES)
def attacked(
    request: pytest.FixtureRequest, pool: Pool, seeded: tuple[BaseVersion, str]
) -> Iterator[Branch]:
    """A branch of the attack base, in each runtime."""
    base, _ = seeded
    runtime = str(request.param)
    with branch_of(pool, base, name=f"attack-{runtime}", runtime=runtime) as made:
        yield made


def refused(conn: psycopg.Connection[Any], statement: str) -> None:
    """``statement`` fails for lack of privilege."""
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(statement)


def test_seed_prints_and_records_what_it_neutralised(
    pool: Pool, env: dict[str, str], seeded: tuple[BaseVersion, str]
) -> None:
    base, output = seeded
    expected = [
        "role app_owner: membership in pg_execute_server_program revoked",
        "role app_owner: membership in pg_read_server_files revoked",
        "role app_owner: membership in pg_write_server_files revoked",
        "role app_owner: membership in ops revoked",
        "role pgoverlay: membership in ops revoked",
        "role pgoverlay: membership in pg_execute_server_program revoked",
        "role app_owner: CREATEROLE removed (it could grant itself any role)",
        "role app_admin: login and password removed",
        "role app_user: login and password removed",
        "role postgres: password removed (bootstrap superuser)",
        "role app_owner: privileges on parameter session_preload_libraries revoked",
        "role pgoverlay: privileges on parameter session_preload_libraries revoked",
        "database shop: EXECUTE on lo_import(text) revoked from app_owner",
        "database shop: EXECUTE on pg_read_file(text) revoked from app_owner",
        "database shop: EXECUTE on pg_read_file(text) revoked from pgoverlay",
        "database shop: list_any(text) (internal) given to the bootstrap superuser, from app_owner",
        "database shop: EXECUTE on read_any(text) (internal, runs code in the server) revoked "
        "from PUBLIC",
        "database shop: maintain(text) runs as its caller, not as its owner, the superuser "
        "postgres",
        "database shop: run_admin(text) runs as its caller, not as its owner, the superuser "
        "postgres",
    ]
    for note in expected:
        assert f"neutralised in the base: {note}" in output, note
        assert note in base.neutralised_notes, note
    listed = json.loads(cli(["base", "list", "--json"], env=env).stdout)
    mine = [b for b in listed if b["name"] == "attack"]
    assert mine and set(expected) <= set(mine[0]["neutralised"])
    table = cli(["base", "list"], env={**env, "COLUMNS": "400"}).stdout
    assert "attack v1 neutralised: role app_owner: CREATEROLE removed" in table
    assert PRODUCTION_PASSWORD not in output + json.dumps(listed) + table


def test_seed_list_tells_a_base_prepared_before_lockdown_apart(
    pool: Pool, env: dict[str, str], seeded: tuple[BaseVersion, str]
) -> None:
    base, _ = seeded
    pool.registry.update_base(
        base.name, base.version, neutralised=""
    )  # as an older release left it
    try:
        listed = json.loads(cli(["base", "list", "--json"], env=env).stdout)
        assert [b["neutralised"] for b in listed if b["name"] == "attack"] == [None]
        table = cli(["base", "list"], env={**env, "COLUMNS": "400"}).stdout
        assert "not locked down" in table
    finally:
        pool.registry.update_base(base.name, base.version, neutralised=base.neutralised)


def test_the_base_keeps_no_password_and_no_path_to_a_superuser_or_the_os(
    pool: Pool, seeded: tuple[BaseVersion, str], attacked: Branch
) -> None:
    base, _ = seeded
    with as_engine(pool, attacked, base) as conn:
        with_password = conn.execute(
            "SELECT rolname FROM pg_authid WHERE rolpassword IS NOT NULL"
        ).fetchall()
        assert with_password == [(attacked.user,)]
        logins = conn.execute(
            "SELECT rolname FROM pg_roles WHERE rolcanlogin ORDER BY 1"
        ).fetchall()
        assert logins == sorted([(base.superuser,), (attacked.user,)])
        # Transitively, the branch role reaches no superuser and no dangerous predefined role.
        reached = conn.execute(
            """WITH RECURSIVE up(oid) AS (
                 SELECT oid FROM pg_roles WHERE rolname = %s
                 UNION SELECT a.roleid FROM pg_auth_members a JOIN up ON a.member = up.oid)
               SELECT r.rolname FROM up JOIN pg_roles r USING (oid)
                WHERE r.rolsuper OR r.rolcreaterole OR r.rolname IN
                  ('pg_execute_server_program', 'pg_read_server_files', 'pg_write_server_files')""",
            (attacked.user,),
        ).fetchall()
        assert reached == []
        assert conn.execute(
            "SELECT pg_has_role(%s, 'app_owner', 'MEMBER')", (attacked.user,)
        ).fetchone() == (True,), "the branch role still owns what app_owner owns"


def test_branch_role_cannot_run_programs_on_the_runner(
    pool: Pool, attacked: Branch, tmp_path: Path
) -> None:
    marker = Path("/tmp") / f"pgoverlay-attack-{uuid.uuid4().hex}"
    with as_branch_role(pool, attacked) as conn:
        refused(conn, "GRANT pg_execute_server_program TO current_user")
        refused(conn, f"COPY (SELECT 1) TO PROGRAM 'touch {marker}'")
        conn.execute("SET ROLE app_owner")  # the owner the source gave the power to
        refused(conn, "GRANT pg_execute_server_program TO current_user")
        refused(conn, f"COPY (SELECT 1) TO PROGRAM 'touch {marker}'")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SET ROLE ops")  # app_owner's superuser role in the source
    assert not marker.exists()


def test_branch_role_cannot_borrow_a_superuser_through_its_security_definer_routines(
    pool: Pool, attacked: Branch, seeded: tuple[BaseVersion, str]
) -> None:
    base, _ = seeded
    marker = Path("/tmp") / f"pgoverlay-attack-{uuid.uuid4().hex}"
    shell = f"COPY (SELECT 1) TO PROGRAM ''touch {marker}''"
    with as_branch_role(pool, attacked) as conn:
        for role in ("NONE", "app_owner"):
            conn.execute(f"SET ROLE {role}")
            refused(conn, f"CALL maintain('{shell}')")
            refused(conn, "CALL maintain('ALTER ROLE pgoverlay SUPERUSER')")
        conn.execute("SET ROLE app_owner")  # the role production granted it to
        refused(conn, f"SELECT run_admin('{shell}')")
        # The routines are still there, and do what their caller may do.
        conn.execute("SELECT run_admin('UPDATE orders SET note = note WHERE id = 1')")
        conn.execute("RESET ROLE")
        row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        assert row.fetchone() == (False,)
    with as_engine(pool, attacked, base) as conn:
        left = conn.execute(
            """SELECT p.oid::regprocedure::text FROM pg_proc p
                 JOIN pg_roles r ON r.oid = p.proowner
                WHERE p.prosecdef AND r.rolsuper"""
        ).fetchall()
        assert left == []
    assert not marker.exists()


def test_branch_role_cannot_read_the_servers_files(pool: Pool, attacked: Branch) -> None:
    with as_branch_role(pool, attacked) as conn:
        refused(conn, "GRANT pg_read_server_files TO current_user")
        for role in ("NONE", "app_owner"):
            conn.execute(f"SET ROLE {role}")
            refused(conn, "SELECT pg_read_file('/etc/passwd')")
            refused(conn, "COPY orders (note) FROM '/etc/passwd'")
            refused(conn, "SELECT lo_import('/etc/passwd')")
            # Production's own wrappers: a relative path reads the server's data directory.
            refused(conn, "SELECT read_any('postgresql.auto.conf')")
            refused(conn, "SELECT list_any('.')")
            refused(conn, "SELECT lo_export(lo_create(0), '/tmp/pgoverlay-attack-lo')")
        assert conn.execute("SELECT count(*) FROM pg_largeobject_metadata").fetchone() == (0,)


def test_branch_role_cannot_write_the_servers_files(pool: Pool, attacked: Branch) -> None:
    target = Path("/tmp") / f"pgoverlay-attack-{uuid.uuid4().hex}"
    with as_branch_role(pool, attacked) as conn:
        refused(conn, "GRANT pg_write_server_files TO current_user")
        for role in ("NONE", "app_owner"):
            conn.execute(f"SET ROLE {role}")
            refused(conn, f"COPY (SELECT 'x') TO '{target}'")
    assert not target.exists()


def test_branch_role_cannot_change_the_servers_configuration(pool: Pool, attacked: Branch) -> None:
    with as_branch_role(pool, attacked) as conn:
        for role in ("NONE", "app_owner"):
            conn.execute(f"SET ROLE {role}")
            refused(conn, "ALTER SYSTEM SET work_mem = '1MB'")
            refused(conn, "SET session_preload_libraries = 'libc.so.6'")
            refused(conn, "ALTER ROLE CURRENT_USER SET session_preload_libraries = 'libc.so.6'")


def test_branch_role_cannot_load_untrusted_code(pool: Pool, attacked: Branch) -> None:
    with as_branch_role(pool, attacked) as conn:
        for extension in ("file_fdw", "adminpack", "dblink", "postgres_fdw"):
            refused(conn, f"CREATE EXTENSION {extension}")
        refused(
            conn,
            "CREATE FUNCTION getpid_c() RETURNS int LANGUAGE c AS 'libc.so.6', 'getpid'",
        )
        refused(
            conn,
            "CREATE FUNCTION f() RETURNS int LANGUAGE internal AS 'pg_backend_pid'",
        )
        with pytest.raises(psycopg.Error):
            conn.execute("CREATE LANGUAGE plpython3u")
        assert conn.execute(
            "SELECT count(*) FROM pg_language WHERE NOT lanpltrusted AND lanname NOT IN "
            "('internal', 'c')"
        ).fetchone() == (0,)


def test_branch_role_cannot_make_or_become_a_superuser(pool: Pool, attacked: Branch) -> None:
    with as_branch_role(pool, attacked) as conn:
        assert conn.execute(
            "SELECT rolsuper, rolcreaterole FROM pg_roles WHERE rolname = current_user"
        ).fetchone() == (False, False)
        refused(conn, "CREATE ROLE intruder LOGIN PASSWORD 'x'")
        refused(conn, "ALTER ROLE CURRENT_USER SUPERUSER")
        refused(conn, "ALTER ROLE app_admin LOGIN PASSWORD 'x'")
        refused(conn, "GRANT app_admin TO CURRENT_USER")
        refused(conn, "GRANT ops TO CURRENT_USER")
        conn.execute("SET ROLE app_owner")
        refused(conn, "CREATE ROLE intruder")
        refused(conn, "ALTER ROLE app_owner CREATEROLE")


def test_production_logins_and_the_bootstrap_superuser_cannot_log_in_over_tcp(
    pool: Pool, seeded: tuple[BaseVersion, str], attacked: Branch
) -> None:
    base, _ = seeded
    for user in ("app_admin", "app_user", base.superuser):
        kwargs = {
            **branch.connection(pool, attacked).connect_kwargs(),
            "user": user,
            "password": PRODUCTION_PASSWORD,
        }
        with pytest.raises(psycopg.OperationalError, match="pg_hba.conf rejects connection"):
            psycopg.connect(**kwargs, connect_timeout=10)
    # The branch role still can, and the engine still reaches the base's superuser.
    with as_branch_role(pool, attacked) as conn:
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (100,)
        conn.execute("ALTER TABLE orders ADD COLUMN shipped boolean")
    with as_engine(pool, attacked, base) as conn:
        assert conn.execute(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
        ).fetchone() == (True,)


def test_createrole_setting_gives_nothing_on_postgres_15_or_older(
    pool: Pool, seeded: tuple[BaseVersion, str]
) -> None:
    base, _ = seeded
    assert (base.pg_major or 0) <= 15, "this test is about Postgres 15 or older"
    pool.settings.branch_createrole = True
    try:
        b = branch.create(pool, "attack-createrole", base_name="attack", runtime="local")
        with as_branch_role(pool, b) as conn:
            assert conn.execute(
                "SELECT rolcreaterole FROM pg_roles WHERE rolname = current_user"
            ).fetchone() == (False,)
            refused(conn, "CREATE ROLE intruder")
    finally:
        pool.settings.branch_createrole = False
        branch.destroy(pool, "attack-createrole")


def test_seed_refuses_a_source_whose_bootstrap_superuser_has_the_branch_roles_name(
    pool: Pool,
) -> None:
    user = pool.settings.branch_user
    with (
        extra_server(pool, "attack-bootstrap", superuser=user) as srv,
        pytest.raises(SeedError, match="PGOVERLAY_BRANCH_USER to another name"),
    ):
        seed.seed(
            pool, "attack-bootstrap", source_dsn=source_dsn(srv, user=user, dbname="postgres")
        )
    assert pool.registry.bases("attack-bootstrap") == []


def test_a_masked_base_is_locked_down_the_same_way(
    pool: Pool, attack_source: cluster.Running, tmp_path: Path
) -> None:
    rules = tmp_path / "orders-rules.yml"
    rules.write_text("tables:\n  public.orders:\n    note: {fake: text}\n")
    base = seed.seed(
        pool, "attack-masked", source_dsn=source_dsn(attack_source, dbname="shop"), mask=rules
    )
    try:
        assert base.masked
        for note in (
            "role app_owner: membership in pg_execute_server_program revoked",
            "role app_owner: CREATEROLE removed (it could grant itself any role)",
            "role app_admin: login and password removed",
        ):
            assert note in base.neutralised_notes, note
        b = branch.create(pool, "attack-masked", base_name="attack-masked", runtime="local")
        with as_branch_role(pool, b) as conn:
            conn.execute("SET ROLE app_owner")
            refused(conn, "COPY (SELECT 1) TO PROGRAM 'true'")
        kwargs = {
            **branch.connection(pool, b).connect_kwargs(),
            "user": "app_admin",
            "password": PRODUCTION_PASSWORD,
        }
        with pytest.raises(psycopg.OperationalError, match="pg_hba.conf rejects connection"):
            psycopg.connect(**kwargs, connect_timeout=10)
    finally:
        branch.destroy(pool, "attack-masked")
        seed.remove_version(pool, base.name, base.version)
