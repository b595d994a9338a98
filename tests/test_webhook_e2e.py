"""The webhook listener as it runs in production: a real uvicorn process on loopback, signed
deliveries of real-shaped payloads sent as compact JSON, PyGithub talking to the fake GitHub
API, and real branches."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
import requests
import yaml

from fakegithub import FakeGitHub
from pgoverlay.runner import branch, mounts
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.registry import BaseVersion
from pgoverlay.webhook.signature import sign

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "github" / "webhooks"
REPO = "acme/shop"
SECRET = "webhook-test-secret"
TOKEN = "ghp_webhookTestToken0123"
BASE_SHA = "b" * 40
T = TypeVar("T")


def eventually(probe: Callable[[], T | None], *, timeout: float = 60, what: str) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Listener:
    """`pgoverlay webhook serve` in its own process, and the means to talk to it."""

    def __init__(self, pool: Pool, github: FakeGitHub, tmp: Path) -> None:
        self.pool = pool
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = tmp / "webhook.yml"
        config.write_text(
            yaml.safe_dump(
                {
                    "repositories": {REPO: {"migrations": "db/migrations", "fork_label": "db-ok"}},
                }
            )
        )
        self.env = {
            **os.environ,
            "PGOVERLAY_HOME": os.fspath(pool.home),
            "PGOVERLAY_PORT_MIN": str(pool.settings.port_min),
            "PGOVERLAY_PORT_MAX": str(pool.settings.port_max),
            "PGOVERLAY_WEBHOOK_SECRET": SECRET,
            "PGOVERLAY_WEBHOOK_TOKEN": TOKEN,
            "PGOVERLAY_WEBHOOK_API_URL": github.url,
            "PGOVERLAY_WEBHOOK_CONFIG": os.fspath(config),
            "PGOVERLAY_WEBHOOK_QUEUE_PATH": os.fspath(tmp / "queue.db"),
            "PGOVERLAY_WEBHOOK_STATE_DIR": os.fspath(tmp / "state"),
            "PGOVERLAY_WEBHOOK_LEASE_SECONDS": "4",
            "PGOVERLAY_WEBHOOK_RECONCILE_INTERVAL": "2",
        }
        self.log = tmp / "listener.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pgoverlay", "webhook", "serve", "--port", str(self.port)],
            env=self.env,
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
        pull[side]["repo"]["full_name"] = REPO
    if fork:
        pull["head"]["repo"]["full_name"] = "stranger/shop"
    payload["repository"]["full_name"] = REPO
    if action == "labeled":
        payload["label"] = {"name": labels[-1] if labels else "other"}
    return payload


@pytest.fixture()
def listener(
    pool: Pool, base: BaseVersion, service: Path, tmp_path: Path
) -> Iterator[tuple[Listener, FakeGitHub]]:
    with FakeGitHub() as github:
        github.add_token(TOKEN, "pgoverlay-bot")
        github.add_tarball(
            REPO, BASE_SHA, tarball(BASE_SHA, {"db/migrations/000_old.sql": "SELECT 1;\n"})
        )
        service = Listener(pool, github, tmp_path)
        service.start()
        try:
            yield service, github
        finally:
            service.stop()
            for b in pool.registry.branches():
                if b.name.startswith("shop-pr-"):
                    branch.destroy(pool, b.name)
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
    with psycopg.connect(**branch.connect_kwargs(pool, b)) as conn:
        row = conn.execute(
            "SELECT string_agg(column_name, ',' ORDER BY column_name) FROM "
            "information_schema.columns WHERE table_name = 'widgets'"
        ).fetchone()
    return str(row[0]) if row else ""


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
    assert service.send(pr_payload("synchronize", head2)).status_code == 202
    eventually(lambda: "success" in statuses(github, head2), what="the second head's status")
    assert columns(pool, "shop-pr-9") == "id,name"
    [updated] = comments(github, 9)
    assert updated["id"] == first["id"] and head2[:7] in updated["body"]

    assert service.send(pr_payload("closed", head2, merged=True)).status_code == 202
    eventually(lambda: pool.registry.branch("shop-pr-9") is None, what="the branch to go")
    eventually(lambda: "Destroyed" in comments(github, 9)[0]["body"], what="the final comment")
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
    time.sleep(1)
    assert service.pool.registry.branch("shop-pr-11") is None
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
    for pull in github.state.pulls:
        if pull.get("number") == 14:
            pull["state"] = "closed"
    eventually(
        lambda: service.pool.registry.branch("shop-pr-14") is None,
        timeout=60,
        what="reconcile to destroy the branch",
    )
