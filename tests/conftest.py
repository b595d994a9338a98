"""Fixtures that build real things: a pool on a real XFS image, a real source server, a base."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path

import checkout  # first: it says when the checkout's folder hides the installed package
import psycopg
import pytest

from fakegithub import FakeGitHub
from helpers import (
    DECOY_BASE,
    DOCKER_IMAGE,
    RUNTIMES,
    SESSION_BASE,
    SESSION_SERVICE,
    TEST_PORTS,
    Undo,
    dismantle,
    require,
    require_root,
    require_runtime,
    service_settings,
    source_dsn,
    start_service,
)
from pgoverlay.action.github import GitHub
from pgoverlay.errors import BaseMissingError
from pgoverlay.runner import branch, seed
from pgoverlay.runner import pool as poolmod
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.seed import bases
from pgoverlay.runner.settings import Settings

PORTS = TEST_PORTS  # see helpers.TEST_PORTS


def pytest_sessionstart(session: pytest.Session) -> None:
    """Stop at once when the users the tests start could not run the code under test."""
    if os.geteuid() == 0:
        found = checkout.problem(group="pgoverlay")
        if found is not None:
            pytest.exit(f"error: {found}", returncode=4)


@pytest.fixture(scope="session", autouse=True)
def _checkout_closed_to_other_users() -> Iterator[None]:
    """Every run behaves as a clone under /root does: the users the tests start read the
    installed copy (``checkout.readable()``), never the checkout (``checkout.closed_to_others``)."""
    with checkout.closed_to_others():
        yield


@pytest.fixture(autouse=True)
def _local_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Branches run locally unless a test asks for Docker (the `runtime` fixture): with a
    daemon up, `auto` would pick Docker for every Settings() a test makes. Set for each test,
    as some tests (of settings loaded under sudo) clear PGOVERLAY_* from the environment."""
    monkeypatch.setenv("PGOVERLAY_RUNTIME", "local")
    monkeypatch.setenv("PGOVERLAY_DOCKER_IMAGE", DOCKER_IMAGE)
    # A test that wants the engine service starts it (the `service` fixture): `pool init`
    # would otherwise leave one running for every pool a test makes.
    monkeypatch.setenv("PGOVERLAY_SERVICE_AUTOSTART", "false")


@pytest.fixture(scope="session")
def settings() -> Iterator[Settings]:
    # Not under pytest's tmp_path: its parents are 0700, and Postgres runs as another user.
    home = Path(tempfile.mkdtemp(prefix="pgoverlay-test-", dir="/var/tmp"))
    yield Settings(
        home=home,
        port_min=PORTS[0],
        port_max=PORTS[1],
        start_timeout=60,
        stop_timeout=30,
        runtime="local",  # tests of the Docker runtime ask for it (the `runtime` fixture)
        docker_image=DOCKER_IMAGE,
    )
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def env(settings: Settings) -> dict[str, str]:
    """The environment that points the `pgoverlay` command at the test pool."""
    return {
        "PGOVERLAY_HOME": os.fspath(settings.home),
        "PGOVERLAY_PORT_MIN": str(PORTS[0]),
        "PGOVERLAY_PORT_MAX": str(PORTS[1]),
        "PGOVERLAY_RUNTIME": "local",
        "PGOVERLAY_DOCKER_IMAGE": DOCKER_IMAGE,
    }


@pytest.fixture(scope="session")
def pool(settings: Settings) -> Iterator[Pool]:
    require_root()
    require(shutil.which("mkfs.xfs") is not None, "needs mkfs.xfs (xfsprogs)")
    p = poolmod.init(settings, size="6G")
    yield p
    dismantle(p)


@pytest.fixture(scope="session")
def source(pool: Pool) -> Iterator[cluster.Running]:
    """A live source server with an `app` database, reachable on a private socket."""
    install = pgbin.newest()
    work = pool.home / "source"
    work.mkdir()
    os.chown(work, pool.owner.uid, pool.owner.gid)
    datadir = work / "data"
    cluster.initdb(install, datadir, owner=pool.owner)
    with cluster.running(
        install,
        datadir,
        owner=pool.owner,
        scratch=pool.tmp,
        options={"wal_level": "replica", "fsync": "off"},
    ) as srv:
        with psycopg.connect(**srv.conninfo(user="postgres"), autocommit=True) as conn:
            conn.execute("CREATE ROLE app_owner")
            conn.execute("CREATE DATABASE app OWNER app_owner")
            conn.execute("CREATE ROLE norepl LOGIN")
        with psycopg.connect(
            **srv.conninfo(user="postgres", dbname="app"), autocommit=True
        ) as conn:
            conn.execute("SET ROLE app_owner")
            conn.execute(
                "CREATE TABLE accounts (id int PRIMARY KEY, owner text NOT NULL, "
                "balance numeric NOT NULL)"
            )
            conn.execute(
                "INSERT INTO accounts SELECT g, 'owner ' || g, g * 10 "
                "FROM generate_series(1, 200000) g"
            )
            conn.execute("CREATE INDEX accounts_owner ON accounts (owner)")
            conn.execute("RESET ROLE")
            conn.execute("CHECKPOINT")
        yield srv
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def base(pool: Pool, source: cluster.Running) -> BaseVersion:
    made = seed.seed(pool, SESSION_BASE, source_dsn=source_dsn(source))
    if os.environ.get("PGOVERLAY_TEST_DECOY_BASE") == "1":
        # A second base for the whole session (`PGOVERLAY_TEST_DECOY_BASE=1`): a test that
        # relies on the session pool holding one base fails (`several bases exist`).
        seed.seed(pool, DECOY_BASE, source_dsn=source_dsn(source))
    return made


@pytest.fixture
def undo(pool: Pool) -> Iterator[Undo]:
    made = Undo(pool)
    yield made
    made.run()


@pytest.fixture(autouse=True)
def _no_base_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """A base a test seeded in the session pool goes when the test ends, passed or failed,
    with its branches: one left behind would make every later command that names no base fail
    (`several bases exist`). Bases of the session's and a module's fixtures are made before
    this runs, and stay. A test that passed yet left one is an error: it must remove its own."""
    if "pool" not in request.fixturenames:
        yield
        return
    pool: Pool = request.getfixturevalue("pool")
    before = {(b.name, b.version) for b in pool.registry.bases()}
    yield
    left = [b for b in pool.registry.bases() if (b.name, b.version) not in before]
    for b in left:
        with contextlib.suppress(BaseMissingError):
            bases.remove(pool, b.name, version=b.version, destroy_branches=True)
    report = getattr(request.node, "rep_call", None)
    if left and report is not None and report.passed:
        listed = ", ".join(f"{b.name} v{b.version}" for b in left)
        pytest.fail(f"the test left bases behind (removed now): {listed}", pytrace=False)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Each phase's report on the test's node (``rep_setup``, ``rep_call``), for fixtures
    that clean up after it to tell whether it passed."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture(scope="module", params=RUNTIMES)
def runtime(request: pytest.FixtureRequest, pool: Pool, base: BaseVersion) -> Iterator[str]:
    """Run a module's branch tests once per runtime: new branches use ``request.param``."""
    name = str(request.param)
    require_runtime(name, base.pg_major or 0)
    previous = pool.settings.runtime
    pool.settings.runtime = name
    try:
        yield name
    finally:
        pool.settings.runtime = previous
        for b in pool.registry.branches():
            branch.destroy(pool, b.name)


@pytest.fixture
def runtime_env(env: dict[str, str], runtime: str) -> dict[str, str]:
    """``env`` for `pgoverlay` commands that should use the runtime under test."""
    return {**env, "PGOVERLAY_RUNTIME": runtime}


@pytest.fixture(scope="session")
def service(pool: Pool) -> Iterator[Path]:
    """The engine service of the test pool, started as `pool init` starts it where there is no
    systemd (a detached root process); its socket's path."""
    from pgoverlay.runner.service import client, serve

    settings = service_settings(pool)
    SESSION_SERVICE[:] = [settings]
    start_service(settings)
    yield client.socket_path(settings)
    serve.stop(settings)


@pytest.fixture()
def github() -> Iterator[tuple[FakeGitHub, GitHub]]:
    """The fake GitHub with pull request acme/shop#5 and a job's token, and a client of it;
    every request it saw must have kept to GitHub's OpenAPI description."""
    with FakeGitHub() as fake:
        fake.add_token("ghs_job", "github-actions[bot]", kind="installation")
        fake.add_pull("acme/shop", 5, "a" * 40, "b" * 40)
        client = GitHub("ghs_job", api_url=fake.url, backoff=0.01)
        yield fake, client
        client.close()
        assert fake.violations == []
