"""The connection strings pgoverlay prints, used exactly as printed, on another machine: the
CLI's `access grant`, the PR comment's URL (its placeholder login filled in), the branch page's
psql command and JDBC URL, and the Action's `database-url`. The door has its own self-signed
certificate (no admin certificate), the case where libpq, told `sslmode=verify-full` and no
`sslrootcert`, looks for `~/.postgresql/root.crt` and suggests `sslmode=disable`.

The reviewer's machine is a network namespace; it reaches the door at the host's end of its
pair, which is the name the door's certificate holds (an address: no DNS needed). What a reader
does besides pasting is what the strings say: save the door's certificate as
`pgoverlay-door.crt` (fetched here from the address `access grant` prints) in the folder where
the client runs.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from urllib.parse import quote

import pytest
from netns import Machine

import pagekit
from helpers import cli, free_tcp_port, masked_base, require, service_settings
from pgoverlay.action import main as action_main
from pgoverlay.action.wayin import YOUR_LOGIN, way_in
from pgoverlay.runner.door import dsn, tls
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.service.engine import LocalEngine
from pgoverlay.runner.service.models import CreateRequest, GrantRequest
from pgoverlay.runner.service.serve import settings_environ
from pgoverlay.runner.settings import Settings
from pgoverlay.runner.web import render

pytestmark = pytest.mark.slow

BRANCH = "strings-pr-5"
REPO = "acme/strings"
JDBC_JAR = Path("/usr/share/java/postgresql.jar")
CHECK_JAVA = """
import java.sql.*;
public class Check {
    public static void main(String[] args) throws Exception {
        try (Connection c = DriverManager.getConnection(args[0]);
             ResultSet r = c.createStatement().executeQuery("SELECT current_user")) {
            r.next();
            System.out.println(r.getString(1));
        }
    }
}
"""


@dataclass
class World:
    settings: Settings
    env: dict[str, str]
    machine: Machine
    folder: Path  # the reader's working folder on their machine
    psql: str
    engine: LocalEngine

    def psql_as_pasted(self, url: str, *, password: str | None = None) -> str:
        """psql with ``url`` as its one connection argument, run in the reader's folder."""
        env = ["env", f"PGPASSWORD={password}"] if password else []
        done = self.machine.run(
            [*env, self.psql, "-X", "-At", url, "-c", "SELECT current_user"],
            cwd=self.folder,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()


@pytest.fixture(scope="module")
def reviewed(
    pool: Pool, source: cluster.Running, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BaseVersion]:
    folder = tmp_path_factory.mktemp("strings-rules")
    with masked_base(
        pool, source, name="strings", database="stringsdb", rows=5, folder=folder
    ) as b:
        yield b


@pytest.fixture(scope="module")
def world(
    pool: Pool, reviewed: BaseVersion, service: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    """The door (`pgoverlay door`, asking the engine service), and an engine whose grants
    name the door as its clients reach it."""
    require(shutil.which("ip") is not None, "needs iproute2 (ip netns)")
    LocalEngine(pool).create(CreateRequest(name=BRANCH, base=reviewed.name, repository=REPO, pr=5))
    folder = tmp_path_factory.mktemp("reader")
    os.chmod(folder, 0o755)
    with Machine() as machine:
        settings = service_settings(pool).replace(
            door_host=machine.host,
            door_address=machine.host,
            door_port=free_tcp_port(),
            door_https_port=free_tcp_port(),
        )
        env = settings_environ(settings)
        seen_by_the_door = Pool(settings, pool.info)  # its registry is closed below
        engine = LocalEngine(seen_by_the_door)
        log = open(folder.parent / "door.log", "wb")  # noqa: SIM115 - closed below
        door = subprocess.Popen(
            [sys.executable, "-P", "-m", "pgoverlay", "door"],
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd="/",
        )
        try:
            _wait_answering(machine, settings.door.https_port, door)
            psql = os.fspath(pgbin.newest().tool("psql"))
            yield World(settings, env, machine, folder, psql, engine)
        finally:
            door.terminate()
            door.wait(timeout=30)
            log.close()
            seen_by_the_door.registry.close()
            LocalEngine(pool).destroy(BRANCH)


def _wait_answering(machine: Machine, port: int, door: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert door.poll() is None, f"the front door exited with {door.returncode}"
        probe = machine.run(["bash", "-c", f"exec 3<>/dev/tcp/{machine.host}/{port}"])
        if probe.returncode == 0:
            return
        time.sleep(0.2)
    raise AssertionError("the front door did not answer")


def test_access_grant_prints_a_string_that_works_as_pasted_and_says_where_the_cert_goes(
    world: World,
) -> None:
    done = cli(["access", "grant", BRANCH, "--github-login", "carol"], env=world.env)
    assert done.returncode == 0, done.stderr
    url = next(line for line in done.stdout.splitlines() if line.startswith("postgresql://"))
    assert "sslmode=verify-full" in url
    fetch = re.search(r"from (https://\S+/pgoverlay-door\.crt)", done.stdout)
    assert fetch is not None, done.stdout
    # The reader saves the certificate from where the command says (and checks its
    # fingerprint, as `pgoverlay doctor` shows it), then pastes the string.
    saved = world.machine.run(
        ["curl", "-sSfk", "-o", dsn.CERT_DOWNLOAD, fetch[1]], cwd=world.folder, timeout=30
    )
    assert saved.returncode == 0, saved.stderr
    door_cert = world.settings.home / "door" / tls.CERT_NAME
    assert (world.folder / dsn.CERT_DOWNLOAD).read_text() == door_cert.read_text()
    assert world.psql_as_pasted(url) == "carol"


def test_the_comments_url_works_as_pasted_with_the_readers_login(world: World) -> None:
    """The comment shows `way.url(YOUR_LOGIN)` and links the certificate; a reader puts their
    login in place of the placeholder, and psql asks for the password (PGPASSWORD here)."""
    way = way_in(world.settings, BRANCH)
    assert way.certificate == dsn.certificate_url(world.settings.page_origin)
    shown = way.url(YOUR_LOGIN)
    url = shown.replace(quote(YOUR_LOGIN, safe="<> "), "dora")
    assert url != shown and "sslmode=verify-full" in url
    granted = world.engine.grant(BRANCH, GrantRequest(login="dora"))
    assert world.psql_as_pasted(url, password=granted.password) == "dora"


def test_the_pages_psql_command_and_jdbc_url_work_as_pasted(world: World) -> None:
    require(JDBC_JAR.exists(), "needs libpostgresql-jdbc-java (scripts/test.sh installs it)")
    require(shutil.which("java") is not None, "needs a JDK (scripts/test.sh installs it)")
    granted = world.engine.grant(BRANCH, GrantRequest(login="erin"))
    assert granted.password is not None
    strings = render.connection_strings(
        render.Credential(
            branch=BRANCH,
            login="erin",
            role=granted.role,
            read_only=granted.read_only,
            expires_at=granted.expires_at,
            password=granted.password,
            host=granted.dsn_host,
            port=granted.dsn_port,
            database=granted.database,
        ),
        verify=False,  # the door's own certificate, as the page is told
    )
    shutil.copyfile(world.settings.home / "door" / tls.CERT_NAME, world.folder / dsn.CERT_DOWNLOAD)
    ran = world.machine.run(
        ["sh", "-c", strings["psql"] + " -XAt -c 'SELECT current_user'"],
        cwd=world.folder,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "erin"
    (world.folder / "Check.java").write_text(CHECK_JAVA)
    java = world.machine.run(
        ["java", "-cp", os.fspath(JDBC_JAR), "Check.java", strings["JDBC"]],
        cwd=world.folder,
        timeout=120,
    )
    assert java.returncode == 0, java.stderr
    assert java.stdout.strip() == "erin"


def test_database_url_verifies_the_door_and_works_as_pasted(world: World) -> None:
    out = StringIO()
    url = action_main.database_url(world.engine, world.settings, BRANCH, repository=REPO, out=out)
    assert url is not None, out.getvalue()
    assert "sslmode=verify-full" in url and "sslrootcert=" in url
    assert world.psql_as_pasted(url) == "app_pr_5"


def test_the_comment_links_the_doors_own_certificate_beside_its_url() -> None:
    from pgoverlay.action.comment import render_comment
    from pgoverlay.action.wayin import WayIn

    way = WayIn(
        page="https://db.acme.dev:8443/b/shop-pr-5",
        host="db.acme.dev",
        port=6543,
        database="shop-pr-5",
        sslmode="verify-full",
        sslrootcert=dsn.CERT_DOWNLOAD,
    )
    body = render_comment(dataclasses.replace(pagekit.report("shop-pr-5", REPO), way_in=way))
    assert (
        "`postgresql://<your GitHub login>@db.acme.dev:6543/shop-pr-5"
        "?sslmode=verify-full&sslrootcert=pgoverlay-door.crt`"
    ) in body
    assert (
        "| Certificate | save [the door's own](https://db.acme.dev:8443/pgoverlay-door.crt) as "
        "`pgoverlay-door.crt` where you run your client"
    ) in body
