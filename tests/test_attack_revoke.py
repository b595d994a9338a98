"""Attacks on the credentials of a branch that outlive what the registry says: a revoke or an
expiry while the branch is suspended, a revoke killed between its steps, an expired
credential's session left open, and passwords changed in SQL (by PR code, or by a read-write
reviewer who `SET ROLE`s to the branch role). Each on real branches, logging in over TCP as a
reviewer or a job would."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apikit import running_door
from psycopg import sql

from helpers import as_engine, cli, masked_base
from pgoverlay.runner import branch, polling
from pgoverlay.runner.branch import expiry, grants, lookup, reconcile
from pgoverlay.runner.pool import Pool, gc
from pgoverlay.runner.pool.registry import BaseVersion, Branch
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.service import serve
from pgoverlay.runner.service.engine import LocalEngine

MASKED = "revoke-masked"
CHOSEN = "chosen-by-the-attacker-1"


@pytest.fixture(scope="module")
def masked(
    pool: Pool, source: cluster.Running, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BaseVersion]:
    folder = tmp_path_factory.mktemp("revoke-rules")
    with masked_base(
        pool, source, name=MASKED, database="revokedb", rows=20, folder=folder
    ) as made:
        yield made


@pytest.fixture
def made(pool: Pool, masked: BaseVersion) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        branch.destroy(pool, name)


def _create(pool: Pool, made: list[str], name: str) -> Branch:
    made.append(name)
    return branch.create(pool, name, base_name=MASKED)


def login(b: Branch, role: str, password: str) -> psycopg.Connection[Any]:
    return psycopg.connect(
        host="127.0.0.1",
        port=b.port,
        dbname=b.database,
        user=role,
        password=password,
        connect_timeout=10,
        autocommit=True,
    )


def refused(b: Branch, role: str, password: str) -> str:
    try:
        with login(b, role, password):
            pass
    except psycopg.OperationalError as err:
        return str(err)
    raise AssertionError(f"{role} logged in to {b.name}")


def role_exists(pool: Pool, b: Branch, role: str) -> bool:
    base = pool.registry.base(b.base_name, b.base_version)
    assert base is not None
    with as_engine(pool, b, base) as conn:
        return (
            conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
            is not None
        )


def set_password(conn: psycopg.Connection[Any], role: str, password: str) -> None:
    conn.execute(
        sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(role), sql.Literal(password))
    )


# -- item 1: a revoke, an expiry reach a suspended branch ------------------------------------


def test_a_revoke_while_suspended_is_gone_at_the_wake(
    pool: Pool, masked: BaseVersion, made: list[str]
) -> None:
    b = _create(pool, made, "rvk-susp")
    done = grants.grant(pool, b.name, login="leaver")
    branch.suspend(pool, b.name)
    assert grants.revoke(pool, b.name, "leaver")
    woken = branch.wake(pool, b.name)
    assert "leaver" in refused(woken, "leaver", done.password)
    assert not role_exists(pool, woken, "leaver")


def test_an_expiry_while_suspended_drops_the_role_at_the_wake(
    pool: Pool, masked: BaseVersion, made: list[str]
) -> None:
    b = _create(pool, made, "rvk-expire")
    done = grants.grant(pool, b.name, login="brief", ttl=60)
    kept = grants.grant(pool, b.name, login="stayer")
    branch.suspend(pool, b.name)
    report = gc.collect(pool, now=done.grant.expires_at + 1)
    assert f"brief in {b.name}" in report.expired_grants
    woken = branch.wake(pool, b.name)
    assert not role_exists(pool, woken, "brief")
    with login(woken, "stayer", kept.password) as conn:  # an unexpired one stays as it was
        assert conn.execute("SELECT current_user").fetchone() == ("stayer",)


def test_a_revoke_killed_after_forgetting_leaves_a_role_gc_drops(
    pool: Pool, masked: BaseVersion, made: list[str], env: dict[str, str]
) -> None:
    b = _create(pool, made, "rvk-crash")
    done = grants.grant(pool, b.name, login="halfway")
    killed = cli(
        ["access", "revoke", b.name, "halfway"],
        env={**env, "PGOVERLAY_FAULT_POINT": "revoke:forgotten"},
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert pool.registry.grants(b.name) == []
    report = gc.collect(pool)
    assert any(line.startswith(b.name) for line in report.reconciled), report.lines()
    assert "halfway" in refused(b, "halfway", done.password)


def test_a_wake_killed_before_its_roles_are_reconciled_admits_nobody(
    pool: Pool, masked: BaseVersion, made: list[str], env: dict[str, str]
) -> None:
    """The server of a waking branch admits the engine alone until its roles are what the
    registry says: a revoked role killed halfway through the wake cannot log in, and the gc
    that finishes the wake drops it."""
    b = _create(pool, made, "rvk-wake-crash")
    done = grants.grant(pool, b.name, login="gone")
    branch.suspend(pool, b.name)
    assert grants.revoke(pool, b.name, "gone")
    killed = cli(
        ["branch", "resume", b.name],
        env={**env, "PGOVERLAY_FAULT_POINT": "restart:password"},
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert lookup.is_running(pool, b)
    assert "pg_hba.conf rejects" in refused(b, "gone", done.password)
    assert b.name in gc.collect(pool).finished
    assert not role_exists(pool, b, "gone")
    with login(b, b.user, b.password):
        pass


# -- item 6: an expired credential's sessions end at its expiry ------------------------------


def test_an_expired_credentials_open_session_ends_within_seconds_of_its_expiry(
    pool: Pool,
    masked: BaseVersion,
    made: list[str],
    service: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The engine service's expiry timer (``serve.expiry_timer``, started here on the test
    pool as the service starts it) ends the session a reviewer holds through the front door
    when the credential's time is up: not at the next gc, minutes later."""
    assert (
        serve.expiry_timer(pool.settings.replace(service_expiry_timer=False), threading.Event())
        is None
    )
    b = _create(pool, made, "rvk-timer")
    folder = tmp_path_factory.mktemp("door-expiry")
    stop = threading.Event()
    with running_door(pool, masked, folder, policy="owners: [acme]\n") as door:
        # granted once the door answers: starting it (and the engine service with its
        # settings) may take longer than the credential lasts on a busy machine
        done = grants.grant(pool, b.name, login="shortlived", ttl=6)
        session = psycopg.connect(
            host="localhost",
            port=door.door_port,
            dbname=b.name,
            user="shortlived",
            password=done.password,
            sslmode="verify-full",
            sslrootcert=str(door.certs.ca_file),
            connect_timeout=30,
            autocommit=True,
        )
        timer = serve.expiry_timer(pool.settings, stop)
        assert timer is not None
        try:
            assert session.execute("SELECT current_user").fetchone() == ("shortlived",)

            def ended() -> float | None:
                try:
                    session.execute("SELECT 1")
                except psycopg.OperationalError:
                    return time.time()
                return None

            at = polling.wait_for(
                ended,
                timeout=done.grant.expires_at - time.time() + expiry.BOUND + 10,
                what="the expired credential's session to end",
                max_interval=0.1,
            )
        finally:
            stop.set()
            timer.join(timeout=30)
            session.close()
    print(f"the session ended {at - done.grant.expires_at:.2f} s after the expiry")
    assert done.grant.expires_at <= at <= done.grant.expires_at + expiry.BOUND + 1
    assert pool.registry.grants(b.name) == [] and not role_exists(pool, b, "shortlived")


# -- item 2, the engine's side: passwords changed in SQL do not stick --------------------------


def test_pr_sql_that_changes_its_own_password_does_not_lock_the_engine_or_the_job_out(
    pool: Pool, masked: BaseVersion, made: list[str]
) -> None:
    """PR SQL runs ALTER ROLE CURRENT_USER PASSWORD: the engine (its own socket, no password)
    keeps working, and the next job's password (``connection``) is the stored one again; the
    attacker's stops working."""
    b = _create(pool, made, "rvk-own-pw")
    with psycopg.connect(**branch.connection(pool, b).connect_kwargs(), autocommit=True) as pr:
        pr.execute(sql.SQL("ALTER ROLE CURRENT_USER PASSWORD {}").format(sql.Literal(CHOSEN)))
    done = grants.grant(pool, b.name, login="reviewer")  # the engine needs no password of it
    assert grants.revoke(pool, b.name, "reviewer") and done.password
    given = LocalEngine(pool).connection(b.name)  # a job's start
    with psycopg.connect(**given.connect_kwargs()) as job:
        assert job.execute("SELECT current_user").fetchone() == (b.user,)
    assert "password authentication failed" in refused(b, b.user, CHOSEN)
    branch.suspend(pool, b.name)
    branch.wake(pool, b.name)
    assert "password authentication failed" in refused(b, b.user, CHOSEN)


def test_a_reviewer_who_sets_role_to_the_branch_role_cannot_keep_a_password_of_their_own(
    pool: Pool, masked: BaseVersion, made: list[str]
) -> None:
    """A read-write reviewer changes the branch role's password (through SET ROLE) and their
    own: neither sticks past the next gc, a job's start or a wake."""
    b = _create(pool, made, "rvk-setrole")
    done = grants.grant(pool, b.name, login="mallory")
    with login(b, "mallory", done.password) as conn:
        set_password(conn, "mallory", CHOSEN)
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(b.user)))
        set_password(conn, b.user, CHOSEN)
    with login(b, "mallory", CHOSEN):  # what Postgres lets a role do to itself...
        pass
    report = gc.collect(pool)
    line = next(x for x in report.reconciled if x.startswith(b.name))
    assert "set back mallory" in line and "branch role's password" in line
    assert "password authentication failed" in refused(b, "mallory", CHOSEN)
    assert "password authentication failed" in refused(b, b.user, CHOSEN)
    with login(b, "mallory", done.password), login(b, b.user, b.password):
        pass
    # ... and at a wake, before anyone logs in.
    with login(b, "mallory", done.password) as conn:
        set_password(conn, "mallory", CHOSEN)
    branch.suspend(pool, b.name)
    woken = branch.wake(pool, b.name)
    assert "password authentication failed" in refused(woken, "mallory", CHOSEN)
    with login(woken, "mallory", done.password):
        pass


def test_pr_sql_cannot_change_a_granted_roles_password(
    pool: Pool, masked: BaseVersion, made: list[str]
) -> None:
    """The branch role has no CREATEROLE on Postgres 15 and older (and on 16 administers only
    the roles it made), so it cannot alter a credential the engine minted."""
    b = _create(pool, made, "rvk-pr-alter")
    grants.grant(pool, b.name, login="victim")
    with psycopg.connect(**branch.connection(pool, b).connect_kwargs(), autocommit=True) as pr:
        assert pr.execute(
            "SELECT rolcreaterole FROM pg_roles WHERE rolname = current_user"
        ).fetchone() == (pr.info.server_version >= 160000 and pool.settings.branch_createrole,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            set_password(pr, "victim", CHOSEN)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            pr.execute("ALTER ROLE victim VALID UNTIL 'infinity'")
    assert "password authentication failed" in refused(b, "victim", CHOSEN)


def test_verifies_tells_a_password_from_another() -> None:
    from pgoverlay.runner.postgres import roles

    stored = roles.scram_verifier("right-password")
    assert reconcile.verifies(stored, "right-password")
    assert not reconcile.verifies(stored, "wrong-password")
    assert not reconcile.verifies(None, "right-password")
    assert not reconcile.verifies("md5abc", "right-password")
