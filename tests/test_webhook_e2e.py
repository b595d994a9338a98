"""The webhook listener as it runs in production: a real uvicorn process on loopback, signed
deliveries of real-shaped payloads sent as compact JSON, PyGithub talking to the fake GitHub
API, and real branches."""

from __future__ import annotations

import copy
import io
import json
import os
import pwd
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any, TypeVar

import checkout
import psycopg
import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from fakegithub import FakeGitHub
from helpers import SESSION_BASE, cli, require
from pgoverlay.action import record
from pgoverlay.runner import branch
from pgoverlay.runner.listener import SUBUID, ranges
from pgoverlay.runner.polling import wait_for
from pgoverlay.runner.pool import Pool, mounts
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.webhook.signature import sign

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "github" / "webhooks"
REPO = "acme/shop"
TOOLS = "acme/tools"  # a repository whose migrations are a command
LISTENER = "pgoverlay-test-listener"
MAINTAINER, TRIAGER = "maintainer", "triager"
LEFTOVER = "7654.25"  # what the migrate command leaves sleeping, detached
SECRET = "webhook-test-secret"
TOKEN = "ghp_webhookTestToken0123"
BASE_SHA = "b" * 40
T = TypeVar("T")


def eventually(probe: Callable[[], T | None], *, timeout: float = 60, what: str) -> T:
    """What ``probe`` returns once it is truthy (an empty list is not yet an answer)."""
    return wait_for(lambda: probe() or None, timeout=timeout, what=what, max_interval=0.1)


def metric_samples(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Every sample of the listener's /metrics, by sample name and labels."""
    response = requests.get(f"{url}/metrics", timeout=10)
    assert response.status_code == 200, response.text
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def tarball(sha: str, files: dict[str, str]) -> bytes:
    """A GitHub-style tarball: one top-level folder holding the repository at ``sha``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"acme-shop-{sha[:7]}/{name}")
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


# The listener as production runs it: an interpreter every user can read (this one may live
# in root's home), with this checkout's packages; it becomes its user before importing anything.
SYSTEM_PYTHON = "/usr/bin/python3"
AS_LISTENER = """
import grp, os, pwd, site, sys
user = pwd.getpwnam(sys.argv[2])
os.setgroups([user.pw_gid, grp.getgrnam("pgoverlay").gr_gid])
os.setgid(user.pw_gid)
os.setuid(user.pw_uid)
site.addsitedir(sys.argv[1])
import pgoverlay.cli
raise SystemExit(pgoverlay.cli.main(sys.argv[3:]))
"""


def system_python_fits() -> bool:
    """The system interpreter is this one's version, so this checkout's packages load in it."""
    done = subprocess.run(
        [SYSTEM_PYTHON, "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() == str(sys.version_info[:2])


def job_command(socket: Path) -> str:
    """A migrate command that records, in the branch, who it ran as and whether it could reach
    the engine service's socket, then leaves a detached process behind."""
    reach = "import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])"
    return (
        f'if {SYSTEM_PYTHON} -c "{reach}" {socket} 2>/dev/null; then reach=yes; else reach=no; fi; '
        'psql -v ON_ERROR_STOP=1 -c "CREATE TABLE ran_as AS SELECT '
        "$(id -u) AS uid, '$reach'::text AS reached_service\"; "
        f"setsid sleep {LEFTOVER} </dev/null >/dev/null 2>&1 &"
    )


def leftovers() -> list[int]:
    marker = f"sleep\x00{LEFTOVER}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def move_head(github: FakeGitHub, repo: str, pr: int, sha: str) -> None:
    """A push to the pull request, as the API then tells it."""
    with github.locked():
        github.pull(repo, pr)["head_sha"] = sha


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Listener:
    """`pgoverlay webhook serve` in its own process, as the listener's own unprivileged user
    (made by `pgoverlay webhook setup`), asking the engine service (root) for branches; and the
    means to talk to it."""

    def __init__(self, pool: Pool, github: FakeGitHub, socket: Path) -> None:
        self.pool = pool
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # Not under pytest's tmp_path: the listener's user must be able to reach it.
        self.top = Path(tempfile.mkdtemp(prefix="pgoverlay-listener-", dir="/var/tmp"))
        self.top.chmod(0o755)
        self.state = self.top / "state"
        done = cli(["webhook", "setup", "--user", LISTENER, "--state-dir", str(self.state)], env={})
        assert done.returncode == 0, done.stderr
        self.config = config = self.top / "webhook.yml"
        config.write_text(
            yaml.safe_dump(
                {
                    "repositories": {
                        REPO: {
                            "base": SESSION_BASE,
                            "migrations": "db/migrations",
                            "fork_label": "db-ok",
                        },
                        TOOLS: {"base": SESSION_BASE, "migrate_command": job_command(socket)},
                    },
                }
            )
        )
        config.chmod(0o644)
        self.env = {
            **os.environ,
            "PGOVERLAY_HOME": os.fspath(pool.home),
            "PGOVERLAY_PORT_MIN": str(pool.settings.port_min),
            "PGOVERLAY_PORT_MAX": str(pool.settings.port_max),
            "PGOVERLAY_WEBHOOK_SECRET": SECRET,
            "PGOVERLAY_WEBHOOK_TOKEN": TOKEN,
            "PGOVERLAY_WEBHOOK_API_URL": github.url,
            "PGOVERLAY_WEBHOOK_CONFIG": os.fspath(config),
            "PGOVERLAY_WEBHOOK_STATE_DIR": os.fspath(self.state),
            "PGOVERLAY_WEBHOOK_LEASE_SECONDS": "4",
            "PGOVERLAY_WEBHOOK_RECONCILE_INTERVAL": "2",
        }
        self.log = self.top / "listener.log"
        self.process: subprocess.Popen[bytes] | None = None

    def configure(self, repository: str, **changes: str) -> None:
        """Change ``repository``'s settings in the configuration (read when it next starts)."""
        config = yaml.safe_load(self.config.read_text())
        config["repositories"][repository].update(changes)
        self.config.write_text(yaml.safe_dump(config))

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                SYSTEM_PYTHON,
                "-c",
                AS_LISTENER,
                checkout.site_packages(),
                LISTENER,
                "webhook",
                "serve",
                "--port",
                str(self.port),
            ],
            env=self.env,
            cwd="/",
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
        )
        eventually(self._healthy, timeout=60, what="the listener to answer /healthz")

    def _healthy(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"the listener exited: {self.log.read_text()[-3000:]}")
        try:
            return requests.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except requests.ConnectionError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=90)

    def send(
        self,
        payload: dict[str, Any],
        *,
        event: str = "pull_request",
        delivery: str | None = None,
        secret: str = SECRET,
    ) -> requests.Response:
        body = json.dumps(payload, separators=(",", ":")).encode()
        headers = {
            "X-GitHub-Event": event,
            "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
            "X-Hub-Signature-256": sign(secret, body),
            "Content-Type": "application/json",
            "User-Agent": "GitHub-Hookshot/test",
        }
        return requests.post(f"{self.url}/webhook", data=body, headers=headers, timeout=10)


def pr_payload(
    action: str,
    head_sha: str,
    *,
    number: int = 9,
    fork: bool = False,
    labels: tuple[str, ...] = (),
    merged: bool = False,
    repo: str = REPO,
    sender: str = MAINTAINER,
) -> dict[str, Any]:
    name = {"reopened": "opened"}.get(action, action)
    name = name if (FIXTURES / f"pull_request.{name}.json").exists() else "opened"
    payload: dict[str, Any] = json.loads((FIXTURES / f"pull_request.{name}.json").read_text())
    payload["action"] = action
    payload["number"] = number
    payload.pop("installation", None)
    pull = payload["pull_request"]
    pull.update(
        number=number,
        merged=merged,
        draft=False,
        state="closed" if action == "closed" else "open",
        labels=[{"name": label} for label in labels],
    )
    for side, sha in (("head", head_sha), ("base", BASE_SHA)):
        pull[side]["sha"] = sha
        pull[side]["repo"]["full_name"] = repo
    if fork:
        pull["head"]["repo"]["full_name"] = "stranger/shop"
    payload["repository"]["full_name"] = repo
    payload["sender"]["login"] = sender
    if action == "labeled":
        payload["label"] = {"name": labels[-1] if labels else "other"}
    return payload


@pytest.fixture()
def listener(pool: Pool, base: BaseVersion, service: Path) -> Iterator[tuple[Listener, FakeGitHub]]:
    require(system_python_fits(), f"needs {SYSTEM_PYTHON} of this Python's version")
    with FakeGitHub() as github:
        github.add_token(TOKEN, "pgoverlay-bot")
        github.add_collaborator(REPO, MAINTAINER, "maintain")
        github.add_collaborator(REPO, TRIAGER, "triage")
        for repo in (REPO, TOOLS):
            github.add_tarball(
                repo, BASE_SHA, tarball(BASE_SHA, {"db/migrations/000_old.sql": "SELECT 1;\n"})
            )
        hook = Listener(pool, github, service)
        try:
            hook.start()
            yield hook, github
        finally:
            hook.stop()
            print(hook.log.read_text()[-6000:])  # shown when a test fails
            engine_log = pool.home / "service.log"
            if engine_log.is_file():
                print(engine_log.read_text()[-6000:])
            for b in pool.registry.branches():
                if b.name.startswith(("shop-pr-", "tools-pr-")):
                    branch.destroy(pool, b.name)
            shutil.rmtree(hook.top, ignore_errors=True)
        assert github.violations == []


def comments(github: FakeGitHub, pr: int) -> list[dict[str, Any]]:
    return [
        dict(c)
        for c in github.state.comments
        if c.get("issue") == pr and str(c.get("body", "")).startswith("<!-- pgoverlay")
    ]


def statuses(github: FakeGitHub, sha: str) -> list[str]:
    return [str(s["state"]) for s in github.state.statuses if s.get("sha") == sha]


def columns(pool: Pool, name: str) -> str:
    b = branch.get(pool, name)
    with psycopg.connect(**branch.connection(pool, b).connect_kwargs()) as conn:
        row = conn.execute(
            "SELECT string_agg(column_name, ',' ORDER BY column_name) FROM "
            "information_schema.columns WHERE table_name = 'widgets'"
        ).fetchone()
    return str(row[0]) if row else ""


def stored_reports(service: Listener) -> list[dict[str, Any]]:
    """The reports the listener's finished jobs kept, read from its queue without writing."""
    path = service.state / "queue.db"
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        rows = db.execute("SELECT report FROM jobs WHERE report != '' ORDER BY id").fetchall()
    return [json.loads(text) for (text,) in rows]


def test_deliveries_create_update_and_destroy_a_branch_once_each(
    listener: tuple[Listener, FakeGitHub],
) -> None:
    service, github = listener
    pool = service.pool
    head1 = "1" * 40
    github.add_pull(REPO, 9, head1, BASE_SHA)
    github.add_tarball(
        REPO,
        head1,
        tarball(
            head1,
            {
                "db/migrations/000_old.sql": "SELECT 1;\n",
                "db/migrations/001_widgets.sql": "CREATE TABLE widgets (id int PRIMARY KEY);\n",
            },
        ),
    )
    delivery = str(uuid.uuid4())
    response = service.send(pr_payload("opened", head1), delivery=delivery)
    assert response.status_code == 202, response.text
    eventually(lambda: "success" in statuses(github, head1), what="a success status")
    assert statuses(github, head1)[0] == "pending"
    assert columns(pool, "shop-pr-9") == "id"
    [first] = comments(github, 9)
    assert "db/migrations/001_widgets.sql" in first["body"] and "000_old" not in first["body"]
    # The job keeps its report (the Action's JSON report) in the queue.
    eventually(lambda: stored_reports(service), what="the job's report in the queue")
    [stored] = stored_reports(service)
    assert stored["schema_version"] == 2 and stored["status"] == "ready"
    changes = stored["schema_diff"]["changes"]
    assert [(c["kind"], c["name"], c["change"]) for c in changes] == [
        ("table", "public.widgets", "added")
    ]
    assert [m["name"] for m in stored["migrations"]] == ["db/migrations/001_widgets.sql"]
    # The PR's GitHub Deployment, for the head the job ran: no front door answers on this
    # host, so no branch page to link
    [deployment] = github.deployments(REPO)
    assert (deployment["environment"], deployment["sha"]) == ("pgoverlay/shop-pr-9", head1)
    assert [s["state"] for s in deployment["statuses"]] == ["success"]
    assert not deployment["statuses"][0].get("environment_url")

    again = service.send(pr_payload("opened", head1), delivery=delivery)
    assert again.status_code == 200 and "already received" in again.text

    head2 = "2" * 40
    github.add_tarball(
        REPO,
        head2,
        tarball(
            head2,
            {
                "db/migrations/000_old.sql": "SELECT 1;\n",
                "db/migrations/001_widgets.sql": (
                    "CREATE TABLE widgets (id int PRIMARY KEY, name text);\n"
                ),
            },
        ),
    )
    move_head(github, REPO, 9, head2)
    assert service.send(pr_payload("synchronize", head2)).status_code == 202
    eventually(lambda: "success" in statuses(github, head2), what="the second head's status")
    assert columns(pool, "shop-pr-9") == "id,name"
    [updated] = comments(github, 9)
    assert updated["id"] == first["id"] and head2[:7] in updated["body"]
    # the new head's deployment retires the first one
    assert {d["sha"]: d["statuses"][-1]["state"] for d in github.deployments(REPO)} == {
        head1: "inactive",
        head2: "success",
    }

    with github.locked():
        github.pull(REPO, 9).update(state="closed", merged=True)
    assert service.send(pr_payload("closed", head2, merged=True)).status_code == 202
    eventually(lambda: pool.registry.branch("shop-pr-9") is None, what="the branch to go")
    eventually(lambda: "Destroyed" in comments(github, 9)[0]["body"], what="the final comment")
    eventually(
        lambda: all(d["statuses"][-1]["state"] == "inactive" for d in github.deployments(REPO)),
        what="every deployment inactive",
    )
    assert statuses(github, head1).count("success") == 1, "the redelivery ran nothing"
    done = 'pgoverlay_webhook_deliveries_total{event="pull_request",outcome="done"} 3.0'
    # The job ends (and its delivery's outcome is written) just after its last comment.
    eventually(
        lambda: done in requests.get(f"{service.url}/metrics", timeout=5).text,
        what="three deliveries done in /metrics",
    )


def test_bad_deliveries_are_refused_and_leave_no_job(
    listener: tuple[Listener, FakeGitHub],
) -> None:
    service, github = listener
    payload = pr_payload("opened", "3" * 40, number=11)
    assert service.send(payload, secret="wrong").status_code == 401
    body = json.dumps(payload).encode()
    unsigned = requests.post(
        f"{service.url}/webhook",
        data=body,
        timeout=10,
        headers={"X-GitHub-Event": "pull_request", "X-GitHub-Delivery": str(uuid.uuid4())},
    )
    assert unsigned.status_code == 401
    truncated = requests.post(
        f"{service.url}/webhook",
        data=body[:-10],
        timeout=10,
        headers={
            "X-GitHub-Event": "pull_request",
            "X-GitHub-Delivery": str(uuid.uuid4()),
            "X-Hub-Signature-256": sign(SECRET, body),
        },
    )
    assert truncated.status_code == 401
    big = b"{" + b" " * (25 * 1024 * 1024 + 10) + b"}"
    oversized = requests.post(
        f"{service.url}/webhook",
        data=big,
        timeout=30,
        headers={
            "X-GitHub-Event": "pull_request",
            "X-GitHub-Delivery": str(uuid.uuid4()),
            "X-Hub-Signature-256": sign(SECRET, big),
        },
    )
    assert oversized.status_code == 413
    assert service.send({"zen": "hi", "hook_id": 1}, event="ping").status_code == 200
    assert service.send(pr_payload("edited", "3" * 40, number=11)).status_code == 204
    # The 204 came after the delivery was recorded as ignored, with no job queued: nothing runs.
    samples = metric_samples(service.url)
    assert samples["pgoverlay_webhook_deliveries_total"] == {
        (("event", "pull_request"), ("outcome", "ignored")): 1
    }
    assert sum(samples["pgoverlay_webhook_queue_jobs"].values()) == 0
    assert github.state.statuses == [] and github.state.comments == []


def test_a_fork_gets_no_branch_until_a_maintainer_labels_it(
    listener: tuple[Listener, FakeGitHub],
) -> None:
    service, github = listener
    head = "4" * 40
    github.add_pull(REPO, 12, head, BASE_SHA, head_repo="stranger/shop")
    github.add_tarball(
        REPO,
        head,
        tarball(head, {"db/migrations/001_widgets.sql": "CREATE TABLE widgets (id int);\n"}),
    )
    assert service.send(pr_payload("opened", head, number=12, fork=True)).status_code == 202
    eventually(lambda: comments(github, 12), what="the fork comment")
    assert "`db-ok`" in comments(github, 12)[0]["body"]
    assert service.pool.registry.branch("shop-pr-12") is None
    with github.locked():
        github.pull(REPO, 12)["labels"].append("db-ok")
    labelled = pr_payload("labeled", head, number=12, fork=True, labels=("db-ok",))
    assert service.send(labelled).status_code == 202
    eventually(lambda: service.pool.registry.branch("shop-pr-12"), what="the approved branch")
    eventually(lambda: "**Ready**" in comments(github, 12)[0]["body"], what="the ready comment")


def test_a_killed_listener_finishes_its_job_once_after_a_restart(
    listener: tuple[Listener, FakeGitHub],
) -> None:
    service, github = listener
    head = "5" * 40
    github.add_pull(REPO, 13, head, BASE_SHA)
    github.add_tarball(
        REPO,
        head,
        tarball(
            head,
            {"db/migrations/001_slow.sql": "SELECT pg_sleep(3);\nCREATE TABLE widgets (id int);\n"},
        ),
    )
    assert service.send(pr_payload("opened", head, number=13)).status_code == 202
    eventually(lambda: service.pool.registry.branch("shop-pr-13"), what="the job to start")
    service.stop(signal.SIGKILL)
    service.start()
    eventually(lambda: "success" in statuses(github, head), timeout=90, what="the job to finish")
    assert columns(service.pool, "shop-pr-13") == "id"
    assert len(comments(github, 13)) == 1
    assert [b.name for b in service.pool.registry.branches()].count("shop-pr-13") == 1
    leaked = [
        m
        for m in mounts.mounts_under(service.pool.root / "branches")
        if "/shop-pr-13/" not in m + "/"
    ]
    assert leaked == []


def test_reconcile_destroys_a_branch_whose_close_was_missed(
    listener: tuple[Listener, FakeGitHub],
) -> None:
    service, github = listener
    head = "6" * 40
    github.add_pull(REPO, 14, head, BASE_SHA)
    github.add_tarball(REPO, head, tarball(head, {"db/migrations/001.sql": "SELECT 1;\n"}))
    assert service.send(pr_payload("opened", head, number=14)).status_code == 202
    eventually(lambda: "success" in statuses(github, head), what="the branch")
    with github.locked():
        github.pull(REPO, 14)["state"] = "closed"
    eventually(
        lambda: service.pool.registry.branch("shop-pr-14") is None,
        timeout=60,
        what="reconcile to destroy the branch",
    )


def test_each_jobs_code_runs_as_its_own_uid_away_from_the_service_and_its_leftovers_die(
    listener: tuple[Listener, FakeGitHub],
) -> None:
    hook, github = listener
    head = "7" * 40
    github.add_pull(TOOLS, 21, head, BASE_SHA)
    github.add_tarball(TOOLS, head, tarball(head, {"README.md": "tools\n"}))
    assert hook.send(pr_payload("opened", head, number=21, repo=TOOLS)).status_code == 202
    eventually(lambda: "success" in statuses(github, head), what="the migrate command's branch")
    assert leftovers() == [], "the command's detached process outlived its job"
    b = branch.get(hook.pool, "tools-pr-21")
    with psycopg.connect(**branch.connection(hook.pool, b).connect_kwargs()) as conn:
        row = conn.execute("SELECT uid, reached_service FROM ran_as").fetchone()
    assert row is not None
    inner, reached = row
    [(_, first, _)] = [r for r in ranges(SUBUID.read_text()) if r[0] == LISTENER]
    host_uid = first + int(inner) - 1
    assert host_uid not in (0, pwd.getpwnam(LISTENER).pw_uid) and int(inner) >= 1000
    assert reached == "no", "the job's code reached the engine service"
    assert [p.name for p in hook.state.glob("pgoverlay-pr-*")] == [], "scratch left behind"
    private = {p.name: p.stat().st_mode & 0o777 for p in hook.state.glob("queue.db*")}
    assert "queue.db" in private and set(private.values()) == {0o600}, private


def test_a_replayed_old_synchronize_does_not_move_the_branch_off_the_current_head(
    listener: tuple[Listener, FakeGitHub],
) -> None:
    hook, github = listener
    head1, head2 = "8" * 40, "9" * 40
    github.add_pull(REPO, 22, head1, BASE_SHA)
    for sha, columns_sql in ((head1, "id int"), (head2, "id int, name text")):
        github.add_tarball(
            REPO,
            sha,
            tarball(
                sha, {"db/migrations/001_widgets.sql": f"CREATE TABLE widgets ({columns_sql});\n"}
            ),
        )
    old_sync = pr_payload("synchronize", head1, number=22)
    assert hook.send(old_sync).status_code == 202
    eventually(lambda: "success" in statuses(github, head1), what="the first head's branch")
    move_head(github, REPO, 22, head2)
    assert hook.send(pr_payload("synchronize", head2, number=22)).status_code == 202
    eventually(lambda: "success" in statuses(github, head2), what="the second head's branch")
    assert columns(hook.pool, "shop-pr-22") == "id,name"

    replay = copy.deepcopy(old_sync)
    replay["pull_request"]["updated_at"] = "2030-01-01T00:00:00Z"  # a new body, as if edited
    assert hook.send(replay).status_code == 202  # under a new delivery id
    eventually(
        lambda: f"already done at {head2[:7]}" in hook.log.read_text(),
        what="the replay's job to end",
    )
    assert columns(hook.pool, "shop-pr-22") == "id,name"
    assert statuses(github, head1) == ["pending", "success"], "the old head ran again"
    assert statuses(github, head2) == ["pending", "success"], "the current head ran again"
    kept = hook.pool.registry.record("shop-pr-22")
    assert kept is not None and record.loads(kept.data).head_sha == head2
    # A `closed` for a pull request the API says is open destroys nothing.
    assert hook.send(pr_payload("closed", head2, number=22)).status_code == 202
    eventually(
        lambda: "the pull request is open: nothing to destroy" in hook.log.read_text(),
        what="the close job to end",
    )
    assert columns(hook.pool, "shop-pr-22") == "id,name"


def test_a_head_already_done_runs_again_once_the_repositorys_settings_change(
    listener: tuple[Listener, FakeGitHub],
) -> None:
    service, github = listener
    head = "5" * 40
    github.add_pull(REPO, 12, head, BASE_SHA)
    files = {
        "db/migrations/000_old.sql": "SELECT 1;\n",
        "db/migrations/001_widgets.sql": "CREATE TABLE widgets (id int PRIMARY KEY);\n",
    }
    github.add_tarball(REPO, head, tarball(head, files))
    assert service.send(pr_payload("opened", head, number=12)).status_code == 202
    eventually(lambda: "success" in statuses(github, head), what="a success status")
    [first] = comments(github, 12)
    assert "001_widgets.sql" in first["body"] and "000_old" not in first["body"]
    assert service.send(pr_payload("reopened", head, number=12)).status_code == 202
    eventually(
        lambda: f"already done at {head[:7]}" in service.log.read_text(),
        what="the same head with the same settings to be left as it is",
    )

    service.stop()
    service.configure(REPO, migrations_select="all")
    service.start()
    assert service.send(pr_payload("synchronize", head, number=12)).status_code == 202
    eventually(lambda: statuses(github, head).count("success") == 2, what="the head to run again")
    [again] = comments(github, 12)
    assert again["id"] == first["id"] and "db/migrations/000_old.sql" in again["body"]
    assert service.log.read_text().count(f"already done at {head[:7]}") == 1


def test_a_fork_approved_at_one_head_runs_nothing_at_the_next_nor_on_a_replayed_label(
    listener: tuple[Listener, FakeGitHub],
) -> None:
    hook, github = listener
    head_a, head_b = "a" * 40, "c" * 40
    github.add_pull(REPO, 23, head_a, BASE_SHA, head_repo="stranger/shop")
    for sha, columns_sql in ((head_a, "id int"), (head_b, "id int, evil text")):
        github.add_tarball(
            REPO,
            sha,
            tarball(
                sha, {"db/migrations/001_widgets.sql": f"CREATE TABLE widgets ({columns_sql});\n"}
            ),
        )
    with github.locked():
        github.pull(REPO, 23)["labels"].append("db-ok")
    approval = pr_payload("labeled", head_a, number=23, fork=True, labels=("db-ok",))
    assert hook.send(approval).status_code == 202
    eventually(lambda: "success" in statuses(github, head_a), what="the approved head's branch")
    assert columns(hook.pool, "shop-pr-23") == "id"

    move_head(github, REPO, 23, head_b)
    assert hook.send(pr_payload("synchronize", head_b, number=23, fork=True)).status_code == 202
    eventually(lambda: statuses(github, head_b), what="the push's refusal")
    assert statuses(github, head_b) == ["failure"]
    assert "db-ok" not in github.pull(REPO, 23)["labels"], "the label was left on"
    # the login is named, and not pinged: a comment's prose mentions nobody (markdown.inert)
    assert "new commits since @\u200dmaintainer approved" in comments(github, 23)[0]["body"]
    assert columns(hook.pool, "shop-pr-23") == "id", "the unapproved head ran"

    # Someone puts the label back, and the maintainer's old `labeled` is replayed.
    with github.locked():
        github.pull(REPO, 23)["labels"].append("db-ok")
    replay = copy.deepcopy(approval)
    replay["pull_request"]["updated_at"] = "2030-01-01T00:00:00Z"
    assert hook.send(replay).status_code == 202
    eventually(
        lambda: "db-ok" not in github.pull(REPO, 23)["labels"], what="the replay's label removal"
    )
    eventually(
        lambda: f"is now {head_b[:7]}" in comments(github, 23)[0]["body"], what="why, on the PR"
    )
    eventually(
        lambda: statuses(github, head_b) == ["failure", "failure"], what="the replay's status"
    )
    assert columns(hook.pool, "shop-pr-23") == "id"


def test_a_label_added_by_someone_without_write_permission_runs_nothing(
    listener: tuple[Listener, FakeGitHub],
) -> None:
    hook, github = listener
    head = "d" * 40
    github.add_pull(REPO, 24, head, BASE_SHA, head_repo="stranger/shop")
    github.add_tarball(REPO, head, tarball(head, {"db/migrations/001.sql": "SELECT 1;\n"}))
    with github.locked():
        github.pull(REPO, 24)["labels"].append("db-ok")
    labelled = pr_payload("labeled", head, number=24, fork=True, labels=("db-ok",), sender=TRIAGER)
    assert hook.send(labelled).status_code == 202
    eventually(lambda: statuses(github, head), what="the refusal")
    assert "@\u200dtriager, who cannot write" in comments(github, 24)[0]["body"]
    assert "db-ok" not in github.pull(REPO, 24)["labels"]
    assert statuses(github, head) == ["failure"]
    assert hook.pool.registry.branch("shop-pr-24") is None


def test_a_token_without_deployments_write_is_logged_once_and_the_jobs_go_on(
    listener: tuple[Listener, FakeGitHub],
) -> None:
    hook, github = listener
    head1, head2 = "d" * 40, "e" * 40
    github.add_pull(REPO, 31, head1, BASE_SHA)
    for sha in (head1, head2):
        github.add_tarball(REPO, sha, tarball(sha, {"db/migrations/001_a.sql": "SELECT 1;\n"}))
    refused = {"message": "Resource not accessible by integration"}
    github.fail_next("POST", r"/deployments$", 403, times=10, body=refused)
    assert hook.send(pr_payload("opened", head1, number=31)).status_code == 202
    eventually(lambda: "success" in statuses(github, head1), what="the first head's status")
    move_head(github, REPO, 31, head2)
    assert hook.send(pr_payload("synchronize", head2, number=31)).status_code == 202
    eventually(lambda: "success" in statuses(github, head2), what="the second head's status")
    [comment] = comments(github, 31)
    assert head2[:7] in comment["body"], "the comment goes on alone"
    said = "the GitHub Deployment was not written"
    eventually(lambda: said in hook.log.read_text(), what="the warning in the listener's log")
    warned = [line for line in hook.log.read_text().splitlines() if said in line and "WARN" in line]
    assert len(warned) == 1 and "deployments: write" in warned[0], "once, not once a job"
    assert github.deployments(REPO) == []
