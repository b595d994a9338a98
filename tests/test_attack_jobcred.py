"""A job on another runner (the Action with `server:`, the listener on another host) logs in to
its branch, through the front door, with a credential the engine minted for it when it asked
for the branch's connection, never with the branch role's own password: PR SQL can change that
one (``ALTER ROLE CURRENT_USER PASSWORD``), and the door admits no role the engine did not mint.

The real engine service, the real `pgoverlay door` (as its own user) listening on the host's
end of a network namespace (tests/netns.py), a local OIDC issuer for the job's token, and psql
on the other machine for the attacker's client.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apikit import Api, running_door
from netns import Machine
from psycopg import sql

from helpers import require
from pgoverlay.runner import audit as auditmod
from pgoverlay.runner.branch import grants, reconcile
from pgoverlay.runner.polling import wait_for
from pgoverlay.runner.pool import Pool, gc
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.service.engine import LocalEngine
from pgoverlay.runner.service.models import CreateRequest, GrantRequest, TraceRequest
from pgoverlay.runner.service.netclient import NetworkEngine, StaticCredential
from pgoverlay.runner.service.views import Connection, TraceMark

REPOSITORY, REPOSITORY_ID = "acme/shop", 4001
CHOSEN = "chosen-by-the-pr"


@dataclass
class World:
    api: Api
    machine: Machine  # the attacker's: anywhere on the network
    psql: str

    def engine(self) -> NetworkEngine:
        """The engine as a job of acme/shop's pull request #42 reaches it: its OIDC token."""
        token = StaticCredential(self.api.of(REPOSITORY, REPOSITORY_ID))
        return NetworkEngine(self.api.server, credential=token, ca_file=self.api.certs.ca_file)

    def login(self, *, dbname: str, user: str, password: str) -> str:
        """psql on the other machine through the door: ``connected``, or its error."""
        conninfo = (
            f"host={self.machine.host} port={self.api.door_port} dbname={dbname} user={user} "
            f"sslmode=verify-full sslrootcert={os.fspath(self.api.certs.ca_file)}"
        )
        done = self.machine.run(
            ["env", f"PGPASSWORD={password}", self.psql, "-X", "-At", conninfo, "-c", "SELECT 1"]
        )
        return "connected" if done.returncode == 0 else done.stderr.strip()


@pytest.fixture(scope="module")
def world(
    pool: Pool, base: BaseVersion, service: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    require(shutil.which("ip") is not None, "needs iproute2 (ip netns)")
    folder = tmp_path_factory.mktemp("jobcred")
    psql = os.fspath(pgbin.newest().tool("psql"))
    with Machine() as machine:
        try:
            with running_door(
                pool,
                base,
                folder,
                policy="owners: [acme]\n",
                host=machine.host,
                address=machine.host,
            ) as api:
                yield World(api, machine, psql)
        finally:
            engine = LocalEngine(pool)
            for b in pool.registry.branches():
                if b.name.startswith("jc-"):
                    engine.destroy(b.name)


def _connect(c: Connection) -> psycopg.Connection[Any]:
    return psycopg.connect(**c.connect_kwargs(), autocommit=True, connect_timeout=60)


def test_a_password_pr_sql_gives_the_branch_role_is_refused_through_the_door(
    world: World, pool: Pool
) -> None:
    """A `server:` job's PR SQL changes the branch role's password; a client on another
    machine that logs in through the door as the branch role with it is refused, as an unknown
    user is, while the job's own credential keeps working."""
    engine = world.engine()
    made = engine.create(CreateRequest(name="jc-own-role", base=world.api.base.name))
    job = engine.connection(made.name)
    with _connect(job) as pr_sql:  # a migration of the pull request
        assert pr_sql.execute("SELECT current_user").fetchone() == (made.user,)
        pr_sql.execute(sql.SQL("ALTER ROLE CURRENT_USER PASSWORD {}").format(sql.Literal(CHOSEN)))
    unknown = world.login(dbname="jc-no-such", user=made.user, password=CHOSEN)
    own = world.login(dbname=made.name, user=made.user, password=CHOSEN)
    assert own == unknown and f'password authentication failed for user "{made.user}"' in own
    # The job's credential is the engine's, and is what the door lets in.
    assert job.user != made.user
    assert world.login(dbname=made.name, user=job.user, password=job.password) == "connected"
    # Its password is in the answer alone: the registry keeps its verifier.
    kept = pool.registry.grant(made.name, job.user)
    assert kept is not None and kept.job and kept.password == "" and not kept.app
    assert kept.granted_by == f"job:{REPOSITORY}"
    assert kept.expires_at <= kept.granted_at + grants.JOB_SECONDS
    lines = [
        x
        for x in auditmod.read(pool.home / auditmod.DOOR_LOG)
        if x.get("branch") == made.name and x.get("user") == made.user
    ]
    assert lines and all(x["outcome"] == "refused:role" for x in lines)
    assert engine.destroy(made.name).destroyed


def test_a_jobs_migrations_make_the_branch_roles_objects_as_a_local_run_does(
    world: World, pool: Pool
) -> None:
    """What a job's credential creates belongs to the branch role (its sessions start as that
    role), so the preview app's credential and the next job use it as after a local run; the
    job's role goes with nothing when it is dropped."""
    engine = world.engine()
    made = engine.create(CreateRequest(name="jc-owner", base=world.api.base.name))
    job = engine.connection(made.name)
    with _connect(job) as db:
        db.execute("CREATE TABLE made_by_the_job (id int)")
        db.execute("CREATE SEQUENCE job_seq")
        owners = db.execute(
            "SELECT DISTINCT pg_get_userbyid(relowner) FROM pg_class "
            "WHERE relname IN ('made_by_the_job', 'job_seq')"
        ).fetchall()
        assert owners == [(made.user,)]
        assert db.execute("SELECT session_user").fetchone() == (job.user,)
    app = engine.grant(made.name, GrantRequest(app=True))
    assert app.password is not None
    preview = world.login(dbname=made.name, user=app.role, password=app.password)
    assert preview == "connected"
    with psycopg.connect(
        host=world.machine.host,
        port=world.api.door_port,
        dbname=made.name,
        user=app.role,
        password=app.password,
        sslmode="verify-full",
        sslrootcert=os.fspath(world.api.certs.ca_file),
    ) as db:
        assert db.execute("SELECT count(*) FROM made_by_the_job").fetchone() == (0,)
    again = engine.connection(made.name)  # the next job: a new password, the same role
    same_password = again.password == job.password  # compared apart: no password in a failure
    assert again.user == job.user and not same_password
    refused = world.login(dbname=made.name, user=job.user, password=job.password)
    assert "password authentication failed" in refused
    with _connect(again) as db:
        assert db.execute("SELECT count(*) FROM made_by_the_job").fetchone() == (0,)
    assert engine.destroy(made.name).destroyed


def test_a_job_credential_pr_sql_changed_is_set_back_and_one_past_its_time_is_dropped(
    world: World, pool: Pool
) -> None:
    """The job's credential is reconciled as every grant is: a password PR SQL gave it (after
    `SET ROLE NONE`) is set back at the next gc, and once its time is up its role is dropped
    and the door refuses it."""
    engine = world.engine()
    made = engine.create(CreateRequest(name="jc-reconciled", base=world.api.base.name))
    job = engine.connection(made.name)
    with _connect(job) as pr_sql:
        pr_sql.execute("SET ROLE NONE")
        pr_sql.execute(sql.SQL("ALTER ROLE CURRENT_USER PASSWORD {}").format(sql.Literal(CHOSEN)))
    report = gc.collect(pool)
    line = next(x for x in report.reconciled if x.startswith(made.name))
    assert f"set back {job.user}" in line
    assert "password authentication failed" in world.login(
        dbname=made.name, user=job.user, password=CHOSEN
    )
    assert world.login(dbname=made.name, user=job.user, password=job.password) == "connected"
    kept = pool.registry.grant(made.name, job.user)
    assert kept is not None
    done = reconcile.settle(pool, made.name)  # nothing to do
    assert done is not None and not done
    with pool.registry.transaction() as db:  # its time is up
        db.execute(
            "UPDATE grants SET expires_at = ? WHERE branch = ? AND role = ?",
            (kept.granted_at - 1, made.name, job.user),
        )
    done = reconcile.settle(pool, made.name)
    assert done is not None and done.dropped == [job.user]
    assert pool.registry.grant(made.name, job.user) is None
    assert "password authentication failed" in world.login(
        dbname=made.name, user=job.user, password=job.password
    )
    assert engine.destroy(made.name).destroyed


def test_the_trace_of_a_jobs_migration_sees_its_statements_and_locks(
    world: World, pool: Pool
) -> None:
    """The engine's trace (log settings, log lines, pg_locks samples) follows the role the
    job's sessions log in as, its credential's, not the branch role it acts as."""
    engine = world.engine()
    made = engine.create(CreateRequest(name="jc-traced", base=world.api.base.name))
    job = engine.connection(made.name)
    engine.trace_begin(made.name, TraceRequest(interval=0.01))
    seen: list[TraceMark] = []
    with _connect(job) as db:
        db.execute("CREATE TABLE traced_by_the_job (id int)")
        oid = db.execute("SELECT 'traced_by_the_job'::regclass::oid").fetchone()
        assert oid is not None
        with db.transaction():
            db.execute("LOCK TABLE traced_by_the_job IN SHARE MODE")

            def sampled() -> bool | None:
                seen.append(engine.trace_mark(made.name))
                return any(s.relation == oid[0] for m in seen for s in m.locks) or None

            wait_for(sampled, timeout=30, what="the sampler to see the job's lock")
    seen.append(engine.trace_end(made.name))
    logged = [e.message for m in seen for e in m.log]
    assert any("CREATE TABLE traced_by_the_job" in x for x in logged), logged
    assert engine.destroy(made.name).destroyed


def test_a_jobs_credential_ends_when_its_job_gives_its_hold_back(world: World, pool: Pool) -> None:
    """The job's credential lasts as long as the job: when its hold on the branch is given
    back (the job's end), the credential is revoked and its sessions end."""
    engine = world.engine()
    made = engine.create(CreateRequest(name="jc-held", base=world.api.base.name))
    with engine.hold(made.name, wait=10):
        job = engine.connection(made.name)
        assert world.login(dbname=made.name, user=job.user, password=job.password) == "connected"
        session = _connect(job)
    with session, pytest.raises(psycopg.OperationalError):
        session.execute("SELECT 1")
    assert pool.registry.grant(made.name, job.user) is None
    refused = world.login(dbname=made.name, user=job.user, password=job.password)
    assert "password authentication failed" in refused
    assert engine.destroy(made.name).destroyed


@pytest.mark.slow
def test_a_jobs_migration_over_its_credential_is_probed_as_a_local_one_is(
    world: World, tmp_path: Path
) -> None:
    """The Action's probe and the engine's trace of a `server:` job, whose sessions log in as
    the job's role and act as the branch role: the probe sees the migration's lock block its
    reads and writes, as on the pool's host."""
    from pgoverlay.action import migrations
    from pgoverlay.action.insight import probe
    from pgoverlay.action.insight.model import Thresholds
    from pgoverlay.action.insight.observe import Observer

    engine = world.engine()
    made = engine.create(CreateRequest(name="jc-probed", base=world.api.base.name))
    files = {
        "000_t.sql": "CREATE TABLE t AS SELECT g AS id, g AS v FROM generate_series(1, 50000) g;\n"
        "ALTER TABLE t ADD PRIMARY KEY (id);\n",
        "001_add_column.sql": "ALTER TABLE t ADD COLUMN a int;\nSELECT pg_sleep(2);\n",
    }
    (tmp_path / "db").mkdir()
    for file, text in files.items():
        (tmp_path / "db" / file).write_text(text)
    target = engine.connection(made.name)
    options = probe.Options(target=target)
    major = world.api.base.pg_major or 15
    with Observer(
        engine, made.name, repository=None, thresholds=Thresholds(), pg_major=major,
        max_seconds=600, probing=options,
    ) as observer:  # fmt: skip
        runs = migrations.apply_files(
            migrations.RunOptions(target=target, timeout=300, watcher=observer),
            tmp_path,
            migrations.all_files(tmp_path, "db"),
            psql=pgbin.for_major(major).tool("psql"),
            skip_recorded=True,
        )
    assert observer.problem == ""
    run = {Path(r.name).name: r for r in runs}["001_add_column.sql"]
    assert run.status == "applied", run.error
    assert run.insight is not None
    assert [b.relation for b in run.insight.blocking] == ["public.t"], run.insight.notes
    blocked = run.insight.blocking[0]
    assert blocked.reads_blocked > 0.5 and blocked.writes_blocked > 0.5, blocked
    assert engine.destroy(made.name).destroyed
