"""The Action on a runner that has no pool (the `server` input): the engine reached through the
front door's network API with the job's OIDC token, and the branch through the door's Postgres
port over verified TLS. Everything is real: the engine service, `pgoverlay door` as its own
user, the test CA, a local OIDC issuer and the runner's token service (tests/apikit.py); the
Action runs as a process of a user that is neither root nor in the service's group."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import checkout
import psycopg
import pytest
from apikit import Api, running_door
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from fakegithub import FakeGitHub
from helpers import os_user, read_outputs
from oidckit import TokenService, pull_request_job
from pgoverlay.errors import ConfigError, LockBusyError, NotOwnerError, ServiceError
from pgoverlay.runner.branch import grants
from pgoverlay.runner.polling import wait_for
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.service.engine import LocalEngine
from pgoverlay.runner.service.models import CreateRequest, GrantRequest
from pgoverlay.runner.service.netclient import NetworkEngine, OidcCredential, StaticCredential

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "github" / "webhooks"
POLICY = """
owners:
  - acme
repositories:
  - acme/*
"""
SHOP_ID, WEB_ID = 3002, 3003
HOSTED = "pgo-hosted"  # the hosted runner's user: not root, not in the service's group


@pytest.fixture(scope="module")
def api(
    pool: Pool, base: BaseVersion, service: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Api]:
    folder = tmp_path_factory.mktemp("server")
    try:
        with running_door(pool, base, folder, policy=POLICY, audience="url") as door:
            yield door
    finally:
        engine = LocalEngine(pool)
        for b in pool.registry.branches():
            if b.name.startswith(("srv-", "shop-pr-")):
                engine.destroy(b.name)


def engine_of(api: Api, repository: str, repository_id: int, **kw: Any) -> NetworkEngine:
    credential = StaticCredential(api.of(repository, repository_id))
    return NetworkEngine(api.server, credential=credential, ca_file=api.certs.ca_file, **kw)


def test_the_engine_over_the_network_makes_a_branch_reached_through_the_door(api: Api) -> None:
    engine = engine_of(api, "acme/shop", SHOP_ID)
    door = engine.pool()
    assert (door["door_name"], door["door_port"]) == ("localhost", api.door_port)
    assert door["app_sslmode"] == "verify-full"  # the admin's certificate (the test CA's)
    assert api.base.name in [b.name for b in engine.bases()]
    # The token is of pull request #42 (its ref, refs/pull/42/merge): a create for another is
    # refused, and one that names none is #42's.
    with pytest.raises(NotOwnerError, match="token is of pull request #42 of acme/shop, not #5"):
        engine.create(CreateRequest(name="srv-one", base=api.base.name, pr=5))
    assert api.pool.registry.branch("srv-one") is None
    made = engine.create(CreateRequest(name="srv-one", base=api.base.name))
    assert made.state == "ready" and made.repository == "acme/shop" and made.pr == 42
    c = engine.connection("srv-one")
    # The door, verified with the CA the API was verified with.
    assert (c.host, c.port, c.database, c.sslmode) == (
        "localhost",
        api.door_port,
        "srv-one",
        "verify-full",
    )
    assert c.sslrootcert == os.fspath(api.certs.ca_file)
    # The job's own credential, minted by the engine, never the branch role's password; its
    # sessions act as the branch role, so what it makes is the branch role's, as in a local run.
    own = api.pool.registry.branch("srv-one")
    assert own is not None and c.user == "job_pr_42" != own.user
    with psycopg.connect(**c.connect_kwargs(), autocommit=True) as db:
        assert db.info.pgconn.ssl_in_use
        db.execute("CREATE TABLE over_the_network (id int)")
        assert db.execute(
            "SELECT current_user, session_user, pg_get_userbyid(relowner) FROM pg_class "
            "WHERE oid = 'over_the_network'::regclass"
        ).fetchone() == (own.user, "job_pr_42", own.user)
    assert "sslmode=verify-full" in c.url and "sslrootcert=" in c.url
    assert engine.size("srv-one").physical_bytes > 0
    app = engine.grant("srv-one", GrantRequest(app=True))
    assert app.app and app.password
    with pytest.raises(NotOwnerError, match="only for its pull request's app credential"):
        engine.grant("srv-one", GrantRequest(login="octocat"))
    # Another repository reaches none of it.
    other = engine_of(api, "acme/web", WEB_ID)
    for ask in (lambda: other.connection("srv-one"), lambda: other.size("srv-one")):
        with pytest.raises(NotOwnerError):
            ask()
    assert engine.destroy("srv-one").destroyed


def test_an_untrusted_or_misnamed_server_is_refused_before_anything_is_sent(api: Api) -> None:
    token = StaticCredential(api.of("acme/shop", SHOP_ID))
    # The system's trust store does not hold the test CA.
    with pytest.raises(ServiceError, match="is not who it says.*Set `server-ca`"):
        NetworkEngine(api.server, credential=token).bases()
    for wrong in ("http://localhost:1", "https://localhost:1/api/v1", "https://u:p@localhost"):
        with pytest.raises(ConfigError, match="server: "):
            NetworkEngine(wrong, credential=token)
    closed = NetworkEngine("https://127.0.0.1:9", credential=token, ca_file=api.certs.ca_file)
    with pytest.raises(ServiceError, match="could not be reached.*`server` input"):
        closed.bases()
    with pytest.raises(ConfigError, match="id-token: write"):
        OidcCredential(api.server, environ={})


def test_one_job_of_a_pull_request_holds_its_branch_at_a_time(api: Api) -> None:
    """Two jobs of one repository and branch: the second waits for the first to give it back;
    another repository's job on the same name does not wait."""
    first, second = engine_of(api, "acme/shop", SHOP_ID), engine_of(api, "acme/shop", SHOP_ID)
    order: list[str] = []

    def later() -> None:
        with second.hold("srv-held", wait=60):
            order.append("second holds")

    with first.hold("srv-held", wait=60):
        order.append("first holds")
        waiting = threading.Thread(target=later)
        waiting.start()
        time.sleep(1.5)
        with engine_of(api, "acme/web", WEB_ID).hold("srv-held", wait=5):
            order.append("another repository holds")
        order.append("first gives back")
    waiting.join(timeout=60)
    assert order == [
        "first holds",
        "another repository holds",
        "first gives back",
        "second holds",
    ]
    # Another job's hold is neither renewed nor given back by a guess of its id.
    status, answer, _ = api.call(
        "POST", "/branches/srv-held/hold/not-its-id/renew", token=api.of("acme/shop", SHOP_ID)
    )
    assert status == 409 and answer["code"] == "lock_busy"
    busy = second.hold("srv-busy", wait=0)
    with first.hold("srv-busy", wait=60), pytest.raises(LockBusyError, match="another job"):
        busy.__enter__()


# -- the Action's step, as a process of the hosted runner's user ------------------------------


def pr_payload(action: str, number: int, head_sha: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"pull_request.{action}.json").read_text())
    data["number"] = data["pull_request"]["number"] = number
    data["pull_request"]["head"]["sha"] = head_sha
    for repo in (
        data["repository"],
        data["pull_request"]["head"]["repo"],
        data["pull_request"]["base"]["repo"],
    ):
        repo.update(full_name="acme/shop", name="shop", id=SHOP_ID)
        repo["owner"]["login"] = "acme"
    return data


# The runner's worker, as far as a job's step can tell: it runs the step (argv), then lives
# until its stdin is closed, the end of the job; it exits with the step's code.
WORKER = (
    "import os, subprocess, sys\n"
    "codes = [subprocess.run(sys.argv[1:], stdin=subprocess.DEVNULL).returncode\n"
    "         for _ in range(int(os.environ.get('PGO_TEST_STEPS', '1')))]\n"
    "sys.stdout.flush(); sys.stdin.read(); sys.exit(max(codes))"
)


class Running:
    """A job under way: its worker, and the file its output goes to."""

    def __init__(self, job: Job, worker: subprocess.Popen[bytes], log: Any) -> None:
        self.job, self.worker, self.log = job, worker, log

    def step_done(self) -> dict[str, str] | None:
        """The step's outputs once it has written its status (None: not yet)."""
        try:
            found = read_outputs(self.job.dir / "output")
        except ValueError:  # a block still being written
            return None
        return found if "status" in found else None

    def end(self) -> tuple[int, str, dict[str, str]]:
        """End the job (its worker's stdin closed) and wait for it: its code, log, outputs."""
        assert self.worker.stdin is not None
        self.worker.stdin.close()
        code = self.worker.wait(timeout=600)
        self.log.close()
        return code, self.job.log(), read_outputs(self.job.dir / "output")


class Job:
    """One job's files on the hosted runner, owned by its user."""

    def __init__(self, api: Api, token_env: dict[str, str]) -> None:
        self.api, self.token_env = api, token_env
        self.user = os_user(HOSTED)
        self.dir = Path(tempfile.mkdtemp(prefix="pgo-hosted-"))
        self.workspace = self.dir / "workspace"
        (self.workspace / "db" / "migrations").mkdir(parents=True)
        (self.dir / "temp").mkdir()
        for path in (self.dir, self.workspace, self.dir / "temp"):
            os.chown(path, self.user.pw_uid, self.user.pw_gid)

    def migration(self, name: str, sql: str) -> None:
        (self.workspace / "db" / "migrations" / name).write_text(sql)

    def start(
        self,
        action: str,
        number: int,
        head_sha: str,
        *,
        steps: int = 1,
        inputs: dict[str, str] | None = None,
    ) -> Running:
        """The job: a process standing for the runner's worker runs the Action's step
        (``steps`` times), then lives until its stdin is closed (the job's later steps run
        meanwhile)."""
        event = self.dir / f"event-{action}.json"
        event.write_text(json.dumps(pr_payload(action, number, head_sha)))
        for name in ("output", "summary", "log"):
            (self.dir / name).write_text("")
        subprocess.run(
            ["chown", "-R", f"{self.user.pw_uid}:{self.user.pw_gid}", self.dir], check=True
        )
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": self.user.pw_dir,
            "GITHUB_EVENT_PATH": os.fspath(event),
            "GITHUB_EVENT_NAME": "pull_request",
            "GITHUB_REPOSITORY": "acme/shop",
            "GITHUB_WORKSPACE": os.fspath(self.workspace),
            "GITHUB_OUTPUT": os.fspath(self.dir / "output"),
            "GITHUB_STEP_SUMMARY": os.fspath(self.dir / "summary"),
            "RUNNER_TEMP": os.fspath(self.dir / "temp"),
            "INPUT_SERVER": self.api.server,
            "INPUT_SERVER_CA": self.api.certs.ca_file.read_text(),
            "INPUT_BASE": self.api.base.name,
            "INPUT_MIGRATIONS": "db/migrations",
            "INPUT_MIGRATIONS_SELECT": "all",
            "INPUT_COMMENT": "false",
            "INPUT_DEPLOYMENT": "false",
            "PGO_TEST_STEPS": str(steps),
            **self.token_env,
            **{f"INPUT_{k.upper()}": v for k, v in (inputs or {}).items()},
        }
        log = open(self.dir / "log", "w")  # noqa: SIM115 - closed by Running.end
        worker = subprocess.Popen(
            [
                sys.executable,
                "-c",
                WORKER,
                sys.executable,
                "-P",
                "-m",
                "pgoverlay",
                "action",
                "run",
            ],
            env=env,
            user=self.user.pw_uid,
            group=self.user.pw_gid,
            extra_groups=[],
            cwd=self.workspace,
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        return Running(self, worker, log)

    def run(
        self, action: str, number: int, head_sha: str, **inputs: str
    ) -> tuple[int, str, dict[str, str]]:
        """A job of one step: its worker ends with it."""
        return self.start(action, number, head_sha, inputs=inputs).end()

    def log(self) -> str:
        return (self.dir / "log").read_text()

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _refused(dsn: str, ca: str) -> bool:
    try:
        psycopg.connect(dsn, sslrootcert=ca, connect_timeout=30).close()
    except psycopg.OperationalError as err:
        assert "password authentication failed" in str(err)
        return True
    return False


def _fresh_job_dsn(api: Api, dsn: str) -> str:
    """``dsn`` with a credential minted for a job now, as the next job's (the door admits no
    other, and the one in ``dsn`` ended with its job)."""
    info = conninfo_to_dict(dsn)
    made = grants.grant_job(api.pool, str(info["dbname"]), granted_by="job:acme/shop")
    return make_conninfo(dsn, user=made.grant.role, password=made.password)


def test_a_job_on_a_runner_without_a_pool_branches_migrates_and_closes_through_the_server(
    api: Api, pool: Pool
) -> None:
    claims = pull_request_job(
        repository="acme/shop",
        repository_id=SHOP_ID,
        number=41,
        head_ref="orders",
        runner_environment="github-hosted",
    )
    with TokenService(api.issuer, api.key) as tokens:
        job = Job(api, tokens.add_job(**claims).env())
        try:
            job.migration("001_orders.sql", "CREATE TABLE remote_orders (id int PRIMARY KEY);\n")
            code, log, out = job.run("opened", 41, "a" * 40)
            assert code == 0, log
            assert out["status"] == "ready" and out["branch"] == "shop-pr-41", log
            assert out["migrations-applied"] == "1"
            # The way in the server gave: its door, over verified TLS.
            assert (out["host"], out["port"]) == ("localhost", str(api.door_port))
            assert (
                "sslmode=verify-full" in out["dsn"] and "sslmode=verify-full" in out["database-url"]
            )
            stored = pool.registry.branch("shop-pr-41")
            assert stored is not None and stored.owner_repository_id == SHOP_ID
            assert stored.owner_uid != job.user.pw_uid  # made by the door, for the repository
            # The password and URLs are masked before they are written; no token is logged.
            assert f"::add-mask::{out['password']}" in log
            assert tokens.issued and "eyJ" not in log
            summary = (job.dir / "summary").read_text()
            assert "**Ready**" in summary and out["password"] not in summary
            ca = os.fspath(api.certs.ca_file)
            # The job's credential ended with the job (its hold given back): its dsn is refused.
            wait_for(
                lambda: _refused(out["dsn"], ca),
                timeout=30,
                what="the ended job's credential to be refused",
            )
            with psycopg.connect(_fresh_job_dsn(api, out["dsn"]), sslrootcert=ca) as db:
                assert db.execute("SELECT to_regclass('remote_orders')").fetchone() == (
                    "remote_orders",
                )

            job.migration("002_items.sql", "CREATE TABLE remote_items (id int);\n")
            code, log, out = job.run("synchronize", 41, "b" * 40)
            assert code == 0 and out["status"] == "ready", log
            # Minted once this job's hold is given back, as the next job's is (that job waits
            # for the hold): the hold's end revokes the job's credential, whenever minted.
            wait_for(
                lambda: _refused(out["dsn"], ca),
                timeout=30,
                what="the second job's credential to be refused",
            )
            with psycopg.connect(_fresh_job_dsn(api, out["dsn"]), sslrootcert=ca) as db:
                found = db.execute(
                    "SELECT to_regclass('remote_orders'), to_regclass('remote_items')"
                ).fetchone()
            assert found == ("remote_orders", "remote_items")

            code, log, out = job.run("closed", 41, "b" * 40)
            assert code == 0 and out["status"] == "destroyed", log
            assert pool.registry.branch("shop-pr-41") is None
        finally:
            job.close()


def test_a_second_job_of_the_pull_request_waits_until_the_first_job_ends(
    api: Api, pool: Pool
) -> None:
    """Two jobs of one pull request on two runners, without `concurrency:`: while the first
    job's later steps use the branch its dsn names, the second job waits, and says so; it
    resets the branch once the first job has ended."""
    claims = pull_request_job(
        repository="acme/shop",
        repository_id=SHOP_ID,
        number=45,
        head_ref="feature",
        runner_environment="github-hosted",
    )
    ca = os.fspath(api.certs.ca_file)
    with TokenService(api.issuer, api.key) as tokens:
        first = Job(api, tokens.add_job(**claims).env())
        second = Job(api, tokens.add_job(**claims).env())
        try:
            first.migration("001_first.sql", "CREATE TABLE first_job (id int);\n")
            running = first.start("opened", 45, "a" * 40)
            out = wait_for(running.step_done, timeout=300, what="the first job's step")
            assert out["status"] == "ready", first.log()
            second.migration("001_second.sql", "CREATE TABLE second_job (id int);\n")
            waiting = second.start("synchronize", 45, "b" * 40)
            wait_for(
                lambda: "waiting for it" in second.log() or waiting.step_done() is not None,
                timeout=300,
                what="the second job to wait, or its step to end",
            )
            assert "holds branch shop-pr-45 until it ends: waiting for it" in second.log(), (
                second.log()
            )
            # The first job's later step: its branch is still what its dsn says.
            with psycopg.connect(out["dsn"], sslrootcert=ca, autocommit=True) as db:
                db.execute("INSERT INTO first_job VALUES (1)")
                assert db.execute("SELECT count(*) FROM first_job").fetchone() == (1,)
            assert waiting.step_done() is None, second.log()
            code, log, _ = running.end()
            assert code == 0, log
            code, log, done = waiting.end()
            assert code == 0 and done["status"] == "ready", log
        finally:
            first.close()
            second.close()
            if pool.registry.branch("shop-pr-45") is not None:
                LocalEngine(pool).destroy("shop-pr-45")


def test_a_later_step_of_the_same_job_works_under_the_hold_its_job_keeps(
    api: Api, pool: Pool
) -> None:
    """The Action twice in one job: the second step finds the hold its own job keeps, and does
    not wait for its job to end."""
    claims = pull_request_job(
        repository="acme/shop",
        repository_id=SHOP_ID,
        number=46,
        head_ref="feature",
        runner_environment="github-hosted",
    )
    with TokenService(api.issuer, api.key) as tokens:
        job = Job(api, tokens.add_job(**claims).env())
        try:
            running = job.start("opened", 46, "c" * 40, steps=2)
            code, log, out = running.end()
            assert code == 0 and out["status"] == "ready", log
            assert "waiting for it" not in log
            assert "branch shop-pr-46 is already up to date" in log, log
        finally:
            job.close()
            if pool.registry.branch("shop-pr-46") is not None:
                LocalEngine(pool).destroy("shop-pr-46")


def test_a_job_whose_head_is_no_longer_the_pull_requests_changes_nothing(
    api: Api, pool: Pool
) -> None:
    """Two jobs of one pull request, the older head's running last: it makes no branch (nor a
    comment or a deployment), and says why; the current head's job goes on."""
    old, new = "d" * 40, "e" * 40
    claims = pull_request_job(
        repository="acme/shop",
        repository_id=SHOP_ID,
        number=44,
        head_ref="feature",
        runner_environment="github-hosted",
    )
    with TokenService(api.issuer, api.key) as tokens, FakeGitHub() as fake:
        fake.add_token("ghs_job_of_the_test", "github-actions[bot]", kind="installation")
        fake.add_pull("acme/shop", 44, new, "f" * 40)
        github = {"GITHUB_TOKEN": "ghs_job_of_the_test", "GITHUB_API_URL": fake.url}
        job = Job(api, {**tokens.add_job(**claims).env(), **github})
        try:
            code, log, out = job.run("synchronize", 44, old, comment="true")
            assert code == 0, log
            assert out["status"] == "skipped", log
            # (an annotation references no issue: a zero-width joiner follows its '#')
            said = log.replace("\u200d", "")
            assert "is no longer the head of pull request #44 (now eeeeeee)" in said
            assert pool.registry.branch("shop-pr-44") is None
            assert [c for c in fake.state.comments if c["repo"] == "acme/shop"] == []
            code, log, out = job.run("synchronize", 44, new)
            assert code == 0 and out["status"] == "ready", log
        finally:
            job.close()
            if pool.registry.branch("shop-pr-44") is not None:
                LocalEngine(pool).destroy("shop-pr-44")
        assert fake.violations == []


def test_a_job_without_an_oidc_token_is_told_to_ask_for_one(api: Api, pool: Pool) -> None:
    # A job without `id-token: write`: the runner sets neither variable.
    job = Job(api, {})
    try:
        code, log, out = job.run("opened", 43, "c" * 40)
    finally:
        job.close()
    assert code != 0 and "permissions: id-token: write" in log
    assert out["status"] == "failed"
    assert pool.registry.branch("shop-pr-43") is None


def test_a_runner_without_psql_that_may_not_install_one_is_told_what_to_install(
    api: Api,
) -> None:
    """With `server`, setup.sh needs psql as a client only, and installs it when the runner may:
    a runner that has none (here, a mount namespace hiding the host's Postgres installs) and
    no sudo is told which package to install, before anything is built."""
    user = os_user(HOSTED)
    tmp_path = Path(tempfile.mkdtemp(prefix="pgo-hosted-"))  # the runner's user reaches it
    tmp_path.chmod(0o755)
    output = tmp_path / "output"
    output.write_text("")
    os.chown(output, user.pw_uid, user.pw_gid)
    script = (
        "mount -t tmpfs none /usr/lib/postgresql && "
        f"exec setpriv --reuid={user.pw_uid} --regid={user.pw_gid} --clear-groups "
        f"{checkout.readable() / 'action' / 'setup.sh'}"
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": user.pw_dir,
            "ACTION_PATH": os.fspath(checkout.readable()),
            "INPUT_SERVER": api.server,
            "GITHUB_OUTPUT": os.fspath(output),
            "RUNNER_TOOL_CACHE": os.fspath(tmp_path / "cache"),
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    try:
        assert done.returncode == 1, done.stdout + done.stderr
        assert "this runner has no psql" in done.stdout and "postgresql-client" in done.stdout
        assert "status=failed" in output.read_text()
        assert not (tmp_path / "cache").exists()  # refused before anything was built
    finally:
        shutil.rmtree(tmp_path)
