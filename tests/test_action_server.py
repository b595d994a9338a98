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

from helpers import os_user, read_outputs
from oidckit import TokenService, pull_request_job
from pgoverlay.errors import ConfigError, LockBusyError, NotOwnerError, ServiceError
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
    with psycopg.connect(**c.connect_kwargs(), autocommit=True) as db:
        db.execute("CREATE TABLE over_the_network (id int)")
        assert db.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()
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

    def run(
        self, action: str, number: int, head_sha: str, **inputs: str
    ) -> tuple[int, str, dict[str, str]]:
        event = self.dir / f"event-{action}.json"
        event.write_text(json.dumps(pr_payload(action, number, head_sha)))
        for name in ("output", "summary"):
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
            **self.token_env,
            **{f"INPUT_{k.upper()}": v for k, v in inputs.items()},
        }
        done = subprocess.run(
            [sys.executable, "-P", "-m", "pgoverlay", "action", "run"],
            env=env,
            user=self.user.pw_uid,
            group=self.user.pw_gid,
            extra_groups=[],
            cwd=self.workspace,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        log = done.stdout + done.stderr
        return done.returncode, log, read_outputs(self.dir / "output")

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


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
            with psycopg.connect(out["dsn"], sslrootcert=ca) as db:
                assert db.execute("SELECT to_regclass('remote_orders')").fetchone() == (
                    "remote_orders",
                )

            job.migration("002_items.sql", "CREATE TABLE remote_items (id int);\n")
            code, log, out = job.run("synchronize", 41, "b" * 40)
            assert code == 0 and out["status"] == "ready", log
            with psycopg.connect(out["dsn"], sslrootcert=ca) as db:
                found = db.execute(
                    "SELECT to_regclass('remote_orders'), to_regclass('remote_items')"
                ).fetchone()
            assert found == ("remote_orders", "remote_items")

            code, log, out = job.run("closed", 41, "b" * 40)
            assert code == 0 and out["status"] == "destroyed", log
            assert pool.registry.branch("shop-pr-41") is None
        finally:
            job.close()


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
