"""A reviewer on another machine gets into a PR's branch, as themselves, and nobody else does.

Everything is real: the engine service (root), the front door (`pgoverlay door`, started as
root, serving as its own user), two branches of the test pool, the fake GitHub (OAuth web flow
and REST, checked against GitHub's OpenAPI description), and the reviewer's machine, a network
namespace joined to the host by a veth pair. In that namespace run Chromium (driven through
ChromeDriver, which listens on the namespace's own address for the host's WebDriver client)
and psql, which connects with ``sslmode=verify-full`` against the test's CA: the door's
certificate names ``pool.test``, which the reviewer's machine reaches at the host's end of the
pair (``hostaddr``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from netns import Machine
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from doorkit import DoorCA, make_ca
from fakegithub import FakeGitHub
from helpers import cli, free_tcp_port, masked_base, require, service_settings, service_with
from pgoverlay.runner import audit
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.postgres import binaries as pgbin
from pgoverlay.runner.postgres import cluster
from pgoverlay.runner.service.engine import LocalEngine
from pgoverlay.runner.service.models import CreateRequest

pytestmark = pytest.mark.slow

DOOR_HOST = "pool.test"
REPO = "acme/shop"
BASE = "review"
CLIENT_ID = "Iv1.reviewer-e2e"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
DRIVER_PORT = 9515  # inside the reviewer's namespace: its own port space


def _quoted(value: str) -> str:
    """A value of a libpq connection string, quoted as libpq reads it."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass
class World:
    pool: Pool
    machine: Machine
    fake: FakeGitHub
    certs: DoorCA
    env: dict[str, str]
    door_port: int
    https_port: int
    branches: tuple[str, str]
    psql: str
    driver: webdriver.Remote

    @property
    def page(self) -> str:
        return f"https://{DOOR_HOST}:{self.https_port}"

    def connect(
        self, branch: str, user: str, password: str, sql: str, *, sslmode: str = "verify-full"
    ) -> subprocess.CompletedProcess[str]:
        """psql on the reviewer's machine: the password in its environment, never an argument."""
        dsn = (
            f"host={DOOR_HOST} hostaddr={self.machine.host} port={self.door_port} "
            f"dbname={_quoted(branch)} user={user} sslmode={sslmode} "
            f"sslrootcert={self.certs.ca_file} "
            "connect_timeout=10"
        )
        return self.machine.run(
            [
                "env",
                f"PGPASSWORD={password}",
                self.psql,
                "-X",
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                dsn,
                "-c",
                sql,
            ],
            timeout=60,
        )

    def sign_in_and_get_credential(self, login: str, branch: str) -> dict[str, str]:
        """The reviewer's browser: the branch page, GitHub's sign-in, the credential page."""
        self.driver.delete_all_cookies()
        self.fake.sign_in(login)
        self.driver.get(f"{self.page}/b/{branch}")
        WebDriverWait(self.driver, 30).until(EC.url_to_be(f"{self.page}/b/{branch}"))
        self.driver.find_element(By.ID, "get-credential").click()
        WebDriverWait(self.driver, 30).until(EC.presence_of_element_located((By.ID, "expires")))
        fields = {
            str(f.get_attribute("id")): f.get_attribute("value") or ""
            for f in self.driver.find_elements(By.CSS_SELECTOR, "input.secret")
        }
        found = re.match(r"postgresql://([^:]+):([^@]+)@", fields["url"])
        assert found is not None, fields
        return {"user": found[1], "password": found[2], **fields}


def _start_driver(
    machine: Machine, certs: DoorCA, profile: Path
) -> tuple[subprocess.Popen[bytes], webdriver.Remote]:
    process = machine.popen(
        [CHROMEDRIVER, f"--port={DRIVER_PORT}", f"--allowed-ips={machine.host}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://{machine.peer}:{DRIVER_PORT}"
    deadline = time.monotonic() + 30
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",  # root inside the namespace
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        f"--user-data-dir={profile}",
        f"--host-resolver-rules=MAP {DOOR_HOST} {machine.host}",
        f"--ignore-certificate-errors-spki-list={certs.spki_sha256}",
    ):
        options.add_argument(flag)
    while True:
        try:
            return process, webdriver.Remote(command_executor=url, options=options)
        except Exception:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                raise
            time.sleep(0.3)


@pytest.fixture(scope="module")
def reviewed(
    pool: Pool, source: cluster.Running, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BaseVersion]:
    """A masked base (people's emails faked): what reviewers get by default."""
    folder = tmp_path_factory.mktemp("review-rules")
    with masked_base(pool, source, name=BASE, database="reviewdb", rows=20, folder=folder) as made:
        yield made


@pytest.fixture(scope="module")
def world(
    pool: Pool, reviewed: BaseVersion, service: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    require(shutil.which("ip") is not None, "needs iproute2 (ip netns)")
    require(Path(CHROMEDRIVER).exists(), "needs chromium-driver (scripts/test.sh installs it)")
    folder = tmp_path_factory.mktemp("reviewer")
    os.chmod(folder, 0o755)
    engine = LocalEngine(pool)
    names = ("shop-pr-71", "shop-pr-72")
    for number, name in zip((71, 72), names, strict=True):
        engine.create(CreateRequest(name=name, base=BASE, repository=REPO, pr=number))
    door_port, https_port = free_tcp_port(), free_tcp_port()
    with (
        Machine() as machine,
        FakeGitHub(host=machine.host) as fake,
        # The engine asks GitHub itself who a reader is before it grants them a credential.
        service_with(pool, github_web_url=fake.url, github_api_url=fake.url),
    ):
        certs = make_ca(folder, names=(DOOR_HOST,), addresses=(machine.host,))
        secret_file = folder / "oauth-secret"
        fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"oauth-client-secret-of-the-test\n")
        os.close(fd)
        fake.add_oauth_app(
            CLIENT_ID,
            "oauth-client-secret-of-the-test",
            callback=f"https://{DOOR_HOST}:{https_port}/oauth/callback",
        )
        fake.add_repo(REPO, private=True)  # mallory, no collaborator, cannot see it
        fake.add_collaborator(REPO, "alice", "write")
        fake.add_collaborator(REPO, "bob", "read")
        env = {
            **{k: v for k, v in service_environment(pool).items()},
            "PGOVERLAY_DOOR_HOST": DOOR_HOST,
            "PGOVERLAY_DOOR_ADDRESS": machine.host,
            "PGOVERLAY_DOOR_PORT": str(door_port),
            "PGOVERLAY_DOOR_HTTPS_PORT": str(https_port),
            "PGOVERLAY_DOOR_CERT_FILE": os.fspath(certs.cert_file),
            "PGOVERLAY_DOOR_KEY_FILE": os.fspath(certs.key_file),
            "PGOVERLAY_OAUTH_CLIENT_ID": CLIENT_ID,
            "PGOVERLAY_OAUTH_CLIENT_SECRET_FILE": os.fspath(secret_file),
            "PGOVERLAY_GITHUB_WEB_URL": fake.url,
            "PGOVERLAY_GITHUB_API_URL": fake.url,
        }
        log = open(folder / "door.log", "wb")  # noqa: SIM115 - closed below
        door = subprocess.Popen(
            [sys.executable, "-P", "-m", "pgoverlay", "door"],
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd="/",
        )
        profile = folder / "chromium"
        profile.mkdir()
        driver_process = None
        try:
            _wait_port(machine.host, door_port, door)
            driver_process, driver = _start_driver(machine, certs, profile)
            psql = os.fspath(pgbin.newest().tool("psql"))
            yield World(pool, machine, fake, certs, env, door_port, https_port, names, psql, driver)
            driver.quit()
        finally:
            door.terminate()
            door.wait(timeout=30)
            log.close()
            if driver_process is not None:
                driver_process.kill()
                driver_process.wait()
            for name in names:
                if engine.branch(name) is not None:
                    engine.destroy(name)


def service_environment(pool: Pool) -> dict[str, str]:
    """The PGOVERLAY_* variables of the test service's settings (the door must share them)."""
    from pgoverlay.runner.service.serve import settings_environ

    return settings_environ(service_settings(pool))


def _wait_port(host: str, port: int, process: subprocess.Popen[bytes]) -> None:
    import socket

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the front door exited with {process.returncode}")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"the front door did not answer on {host}:{port}")


def test_the_door_runs_as_its_own_user_not_root(world: World) -> None:
    found = subprocess.run(
        ["ss", "-ltnpH", f"sport = :{world.door_port}"], capture_output=True, text=True, check=True
    )
    pids = {int(p) for p in re.findall(r"pid=(\d+)", found.stdout)}
    assert pids, found.stdout
    for pid in pids:
        status = Path(f"/proc/{pid}/status").read_text()
        uids = re.search(r"^Uid:\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)", status, re.M)
        assert uids is not None
        assert set(uids.groups()) != {"0"} and "0" not in uids.groups(), status
        assert re.search(r"^NoNewPrivs:\s+1", status, re.M), status


def test_a_writer_signs_in_from_another_machine_and_reads_and_writes_over_verify_full(
    world: World,
) -> None:
    branch = world.branches[0]
    got = world.sign_in_and_get_credential("alice", branch)
    assert got["user"] == "alice"
    assert "sslmode=verify-full" in got["url"]
    read = world.connect(
        branch,
        "alice",
        got["password"],
        "SELECT current_user, count(*), count(*) FILTER (WHERE email LIKE 'person%') FROM people",
    )
    assert read.returncode == 0, read.stderr
    assert read.stdout.strip() == "alice|20|0"  # the masked copy: no real address left
    wrote = world.connect(
        branch,
        "alice",
        got["password"],
        "CREATE TABLE reviewed (id int); INSERT INTO reviewed VALUES (1)",
    )
    assert wrote.returncode == 0, wrote.stderr
    lines = audit.read(world.pool.home / audit.DOOR_LOG)
    mine = [line for line in lines if line.get("user") == "alice" and line.get("branch") == branch]
    assert mine, lines[-5:]
    assert all(got["password"] not in str(line) for line in lines)


def test_a_read_only_reviewer_reads_but_cannot_write(world: World) -> None:
    branch = world.branches[0]
    got = world.sign_in_and_get_credential("bob", branch)
    read = world.connect(branch, "bob", got["password"], "SELECT count(*) FROM people")
    assert read.returncode == 0, read.stderr
    assert read.stdout.strip() == "20"
    for sql in ("CREATE TABLE bobs (id int)", "DELETE FROM people"):
        wrote = world.connect(branch, "bob", got["password"], sql)
        assert wrote.returncode != 0
        assert "read-only transaction" in wrote.stderr


def test_a_reader_without_access_gets_nothing(world: World) -> None:
    world.driver.delete_all_cookies()
    world.fake.sign_in("mallory")
    world.driver.get(f"{world.page}/b/{world.branches[0]}")
    body = world.driver.find_element(By.TAG_NAME, "body").text
    assert "Get my credential" not in body
    assert not world.driver.find_elements(By.CSS_SELECTOR, "input.secret")


def test_one_branchs_credential_does_not_open_another(world: World) -> None:
    first, second = world.branches
    got = world.sign_in_and_get_credential("alice", first)
    other = world.connect(second, "alice", got["password"], "SELECT 1")
    assert other.returncode != 0
    assert "password authentication failed" in other.stderr


def test_after_expiry_revoke_or_destroy_the_login_fails(world: World) -> None:
    first, second = world.branches
    short = cli(["access", "grant", first, "--github-login", "carol", "--ttl", "3s"], env=world.env)
    assert short.returncode == 0, short.stderr
    password = re.search(r"postgresql://carol:([^@]+)@", short.stdout)
    assert password is not None, short.stdout
    works = world.connect(first, "carol", password[1], "SELECT 1")
    assert works.returncode == 0, works.stderr
    time.sleep(4)
    expired = world.connect(first, "carol", password[1], "SELECT 1")
    assert expired.returncode != 0
    assert "password authentication failed" in expired.stderr

    got = world.sign_in_and_get_credential("alice", second)
    assert world.connect(second, "alice", got["password"], "SELECT 1").returncode == 0
    revoked = cli(["access", "revoke", second, "alice"], env=world.env)
    assert revoked.returncode == 0, revoked.stderr
    after = world.connect(second, "alice", got["password"], "SELECT 1")
    assert after.returncode != 0
    assert "password authentication failed" in after.stderr

    got = world.sign_in_and_get_credential("alice", second)
    assert world.connect(second, "alice", got["password"], "SELECT 1").returncode == 0
    destroyed = cli(["branch", "destroy", second], env=world.env)
    assert destroyed.returncode == 0, destroyed.stderr
    gone = world.connect(second, "alice", got["password"], "SELECT 1")
    assert gone.returncode != 0
    assert "password authentication failed" in gone.stderr


def test_an_anonymous_client_learns_nothing_about_which_branches_exist(world: World) -> None:
    real, _ = world.branches
    wrong = world.connect(real, "alice", "not-the-password", "SELECT 1")
    unknown = world.connect("shop-pr-9999", "alice", "not-the-password", "SELECT 1")
    invalid = world.connect("no such branch!", "alice", "not-the-password", "SELECT 1")
    assert wrong.returncode == unknown.returncode == invalid.returncode != 0
    for answer in (wrong, unknown, invalid):
        assert 'password authentication failed for user "alice"' in answer.stderr
    assert wrong.stderr.replace(real, "X") == unknown.stderr.replace("shop-pr-9999", "X")
    plain = world.connect(real, "alice", "x", "SELECT 1", sslmode="disable")
    assert plain.returncode != 0
    assert "sslmode" in plain.stderr  # refused before any branch is looked at
    # The page: an anonymous reader is sent to sign in whether the branch exists or not.
    world.driver.delete_all_cookies()
    world.fake.sign_in(None)
    for name in (real, "shop-pr-9999"):
        world.driver.get(f"{world.page}/b/{name}")
        assert "/login/oauth/authorize" in world.driver.current_url
