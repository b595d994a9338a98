"""The webhook listener on another host, with an API token the admin issued: the real engine
service (root), the real front door with the network API on (as its own user), a token issued
by `pgoverlay api token issue`, TLS verified against the test's CA, and the door listening on
the host's end of a network namespace (tests/netns.py), which stands for the listener's host."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import checkout
import pytest
from apikit import Api, running_door
from netns import Machine
from test_webhook_e2e import (
    AS_LISTENER,
    BASE_SHA,
    LISTENER,
    MAINTAINER,
    SYSTEM_PYTHON,
    TOKEN,
    Listener,
    columns,
    comments,
    eventually,
    pr_payload,
    statuses,
    system_python_fits,
    tarball,
)

from doorkit import DoorCA
from fakegithub import FakeGitHub
from helpers import as_user_call, cli, os_user, require
from pgoverlay.runner import audit
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.service.engine import LocalEngine

POLICY = """
owners:
  - acme
repositories:
  - acme/*
"""
SHOP, SHOP_ID, ACME_ID = "acme/shop", 2002, 501


@dataclass
class Door:
    pool: Pool
    base: BaseVersion
    machine: Machine
    api: Api  # the door, on the host's end of the namespace

    @property
    def certs(self) -> DoorCA:
        return self.api.certs

    @property
    def https_port(self) -> int:
        return self.api.port

    @property
    def door_port(self) -> int:
        return self.api.door_port

    @property
    def log(self) -> Path:
        return self.api.log

    @property
    def env(self) -> dict[str, str]:
        return self.api.env

    def issue(self, name: str, *args: str) -> str:
        """A token issued by the CLI, as the admin does: the last line it prints."""
        done = cli(["api", "token", "issue", name, *args], env=self.env)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().splitlines()[-1]

    def call(
        self,
        method: str,
        path: str,
        *,
        token: str | None,
        repository: str | None = SHOP,
        repository_id: int = SHOP_ID,
        owner_id: int = ACME_ID,
        fork: str | None = "false",
        body: object = None,
    ) -> tuple[int, Any]:
        """A request to the API, as the listener makes it (from the host: the door's address
        is the host's end of the namespace)."""
        sent: dict[str, str] = {}
        if repository is not None:
            sent["x-pgoverlay-repository"] = repository
            sent["x-pgoverlay-repository-id"] = str(repository_id)
            sent["x-pgoverlay-owner-id"] = str(owner_id)
        if fork is not None:
            sent["x-pgoverlay-fork"] = fork
        status, answer, _ = self.api.call(method, path, token=token, body=body, headers=sent)
        return status, answer

    def create(self, token: str, name: str, **headers: Any) -> tuple[int, Any]:
        return self.call(
            "POST", "/branches", token=token, body={"name": name, "base": self.base.name}, **headers
        )

    def audit(self) -> list[dict[str, object]]:
        return audit.read(self.pool.home / audit.ENGINE_LOG)


@pytest.fixture(scope="module")
def door(
    pool: Pool, base: BaseVersion, service: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Door]:
    require(subprocess.run(["which", "ip"], capture_output=True).returncode == 0, "needs iproute2")
    folder = tmp_path_factory.mktemp("listener-remote")
    with Machine() as machine:
        try:
            with running_door(
                pool, base, folder, policy=POLICY, host=machine.host, address=machine.host
            ) as api:
                yield Door(pool, base, machine, api)
        finally:
            engine = LocalEngine(pool)
            for b in pool.registry.branches():
                if b.name.startswith(("remote-", "shop-pr-")):
                    engine.destroy(b.name)


# -- the door and the token ------------------------------------------------------------------


def test_a_token_makes_and_destroys_a_branch_owned_by_the_named_repositorys_id(door: Door) -> None:
    token = door.issue("listener-acme", "--owner", "acme")
    assert token.startswith("pgo_") and len(token) == 47
    status, made = door.create(token, "remote-made")
    assert status == 201, made
    stored = door.pool.registry.branch("remote-made")
    assert stored is not None and stored.owner_repository_id == SHOP_ID
    # Another repository id (a re-created acme/shop) is refused the branch, with the same token.
    status, refused = door.call(
        "POST", "/branches/remote-made/destroy", token=token, repository_id=9999, body={}
    )
    assert (status, refused["code"]) == (403, "not_owner"), refused
    status, gone = door.call("POST", "/branches/remote-made/destroy", token=token, body={})
    assert status == 200, gone
    assert door.pool.registry.branch("remote-made") is None


def test_a_token_scoped_to_another_owner_or_repository_is_refused_and_nothing_is_made(
    door: Door,
) -> None:
    other = door.issue("listener-octo", "--owner", "octo-org")
    status, body = door.create(other, "remote-octo")
    assert status == 401, body
    assert "may act for octo-org/*, not for acme/shop" in body["message"]
    narrow = door.issue("listener-web", "--owner", "acme", "--repository", "acme/web")
    status, body = door.create(narrow, "remote-web")
    assert status == 401 and "may act for acme/web, not for acme/shop" in body["message"]
    assert door.pool.registry.branch("remote-octo") is None
    assert door.pool.registry.branch("remote-web") is None
    refused = [e for e in door.audit() if e["event"] == "api_credential_refused"]
    assert {e["credential"] for e in refused} >= {"listener-octo", "listener-web"}


def test_revoked_expired_and_unknown_tokens_are_refused_401_and_do_nothing(door: Door) -> None:
    token = door.issue("listener-soon-revoked", "--owner", "acme")
    done = cli(["api", "token", "revoke", "listener-soon-revoked"], env=door.env)
    assert done.returncode == 0 and "revoked" in done.stdout, done.stderr
    status, body = door.create(token, "remote-revoked")
    assert status == 401 and "not one this pool issued, or it was revoked" in body["message"]
    expired = door.issue("listener-brief", "--owner", "acme", "--expires", "1s")
    time.sleep(1.5)  # the token's own lifetime, not a timing assertion
    status, body = door.create(expired, "remote-expired")
    assert status == 401 and "listener-brief expired at" in body["message"]
    made_up = "pgo_" + "A" * 43
    status, body = door.create(made_up, "remote-unknown")
    assert status == 401 and "not one this pool issued" in body["message"]
    for name in ("remote-revoked", "remote-expired", "remote-unknown"):
        assert door.pool.registry.branch(name) is None
    events = [e["event"] for e in door.audit()]
    assert "api_credential_revoked" in events


def test_a_token_request_must_name_its_repository_and_its_ids(door: Door) -> None:
    token = door.issue("listener-headers", "--owner", "acme")
    status, body = door.create(token, "remote-nameless", repository=None)
    assert status == 422 and "x-pgoverlay-repository is missing" in body["message"]
    status, body = door.create(token, "remote-forkless", fork=None)
    assert status == 422 and "x-pgoverlay-fork must be true or false" in body["message"]
    assert door.pool.registry.branch("remote-nameless") is None


def test_only_the_front_door_may_ask_whether_a_token_is_good(service: Path) -> None:
    """A member of the service's group cannot use the engine to try tokens: the question is the
    door's alone (the engine answers it; the door cannot read the store). It is refused
    before any token is looked at: a made-up one is refused as not the door's question."""
    os_user("pgo-runner", groups=["pgoverlay"])
    code = "\n".join(
        [
            "from pathlib import Path",
            "from pgoverlay.errors import NotOwnerError",
            "from pgoverlay.runner.service.client import RemoteEngine",
            "from pgoverlay.runner.service.models import CredentialCheck",
            f"engine = RemoteEngine(Path({os.fspath(service)!r}))",
            "try:",
            "    engine.check_credential(",
            "        CredentialCheck(secret='pgo_' + 'A' * 43, repository='acme/shop')",
            "    )",
            "except NotOwnerError as err:",
            "    print('refused:', err)",
        ]
    )
    done = as_user_call(
        "pgo-runner", ["pgoverlay"], code, preload=["pgoverlay.runner.service.models"]
    )
    assert done.returncode == 0, done.stderr
    assert (
        "refused: only the front door's identity asks whether an API token is good" in done.stdout
    )


def test_the_policy_holds_for_a_token_owner_pins_and_forks(door: Door) -> None:
    token = door.issue("listener-policy", "--owner", "acme", "--owner", "evil")
    # evil is in the token's scope but not the pool's policy: 403, naming the rule
    status, body = door.create(token, "remote-evil", repository="evil/shop")
    assert status == 403 and "(owners)" in body["message"], body
    # a fork's pull request gets no branch with forks: false
    status, body = door.create(token, "remote-fork", fork="true")
    assert status == 403 and "(forks)" in body["message"], body
    assert door.pool.registry.branch("remote-evil") is None
    assert door.pool.registry.branch("remote-fork") is None


def test_the_cli_lists_tokens_without_secrets_and_never_logs_or_audits_one(door: Door) -> None:
    token = door.issue("listener-listed", "--owner", "acme", "--repository", SHOP)
    door.create(token, "remote-listed")
    door.call("POST", "/branches/remote-listed/destroy", token=token, body={})
    listed = cli(["api", "token", "list", "--json"], env=door.env)
    assert listed.returncode == 0, listed.stderr
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert rows["listener-listed"]["repositories"] == [SHOP]
    assert token not in listed.stdout and "digest" not in listed.stdout
    store = (door.pool.home / "api" / "tokens.json").stat()
    assert (store.st_uid, store.st_mode & 0o777) == (0, 0o600)
    secret = token.removeprefix("pgo_")
    for path in (door.log, door.pool.home / audit.ENGINE_LOG, door.pool.home / "service.log"):
        if path.exists():
            assert secret not in path.read_text(errors="replace"), path


# -- the listener on another host --------------------------------------------------------------


class RemoteListener(Listener):
    """`pgoverlay webhook serve` in the network namespace, as its own user, with no pool on its
    host (its PGOVERLAY_HOME names a folder that does not exist): its jobs ask the door, with
    the API token in its server_token_file."""

    def __init__(self, door: Door, github: FakeGitHub, token: str) -> None:
        super().__init__(door.pool, github, door.pool.home / "no-socket-here")
        self.machine = door.machine
        self.url = f"http://{door.machine.peer}:{self.port}"
        self.token_file = self.top / "server-token"
        self.issued = token  # the listener's own token, issued by the admin
        self.give_token(token)
        # The jobs' psql verifies the door with it too: outside the folders a job gets its own
        # of (/tmp, /var/tmp), where the admin would put it.
        self.ca_dir = Path(tempfile.mkdtemp(prefix="pgoverlay-listener-ca-", dir="/var/lib"))
        self.ca_dir.chmod(0o755)
        ca = self.ca_dir / "server-ca.pem"
        ca.write_bytes(door.certs.ca_file.read_bytes())
        ca.chmod(0o644)
        self.env.update(
            {
                "PGOVERLAY_HOME": os.fspath(self.top / "no-pool"),
                # its own, as its unit gives it (libpq looks for a client certificate there)
                "HOME": os.fspath(self.top),
                "PGOVERLAY_WEBHOOK_SERVER": f"https://{door.machine.host}:{door.https_port}",
                "PGOVERLAY_WEBHOOK_SERVER_TOKEN_FILE": os.fspath(self.token_file),
                "PGOVERLAY_WEBHOOK_SERVER_CA": os.fspath(ca),
            }
        )

    def give_token(self, token: str) -> None:
        """The admin's token in the listener's file (its user's, 0600): read when it starts."""
        self.token_file.write_text(token + "\n")
        listener = pwd.getpwnam(LISTENER)
        os.chown(self.token_file, listener.pw_uid, listener.pw_gid)
        self.token_file.chmod(0o600)

    def start(self) -> None:
        self.process = self.machine.popen(
            [
                SYSTEM_PYTHON,
                "-c",
                AS_LISTENER,
                checkout.site_packages(),
                LISTENER,
                "webhook",
                "serve",
                "--host",
                "0.0.0.0",
                "--port",
                str(self.port),
            ],
            env=self.env,
            cwd="/",
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
        )
        eventually(self._healthy, timeout=60, what="the listener to answer /healthz")


@pytest.fixture()
def remote(door: Door) -> Iterator[tuple[RemoteListener, FakeGitHub]]:
    require(system_python_fits(), f"needs {SYSTEM_PYTHON} of this Python's version")
    token = door.issue(f"listener-e2e-{os.urandom(3).hex()}", "--owner", "acme")
    with FakeGitHub(host=door.machine.host) as github:
        github.add_token(TOKEN, "pgoverlay-bot")
        github.add_collaborator(SHOP, MAINTAINER, "maintain")
        github.add_tarball(
            SHOP, BASE_SHA, tarball(BASE_SHA, {"db/migrations/000_old.sql": "SELECT 1;\n"})
        )
        hook = RemoteListener(door, github, token)
        try:
            hook.start()
            yield hook, github
        finally:
            hook.stop()
            print(hook.log.read_text()[-6000:])  # shown when a test fails
            print(door.log.read_text()[-3000:])
            for comment in github.state.comments:  # a failed job's report says why
                print(str(comment.get("body", ""))[:3000])
            shutil.rmtree(hook.top, ignore_errors=True)
            shutil.rmtree(hook.ca_dir, ignore_errors=True)
        assert github.violations == []


def _pull(github: FakeGitHub, number: int, head: str) -> None:
    github.add_pull(SHOP, number, head, BASE_SHA)
    github.add_tarball(
        SHOP,
        head,
        tarball(
            head,
            {
                "db/migrations/000_old.sql": "SELECT 1;\n",
                "db/migrations/001_widgets.sql": "CREATE TABLE widgets (id int PRIMARY KEY);\n",
            },
        ),
    )


def _payload(github: FakeGitHub, action: str, head: str, **given: Any) -> dict[str, Any]:
    """A delivery of acme/shop's pull request whose repository and owner ids are those GitHub's
    API has (the fake's), as GitHub's deliveries and API agree."""
    payload = pr_payload(action, head, **given)
    with github.locked():
        repository_id = int(github.state.repos[SHOP]["id"])
        owner_id = github._user_id("acme")  # the id its API answers for acme
    for repo in (
        payload["repository"],
        payload["pull_request"]["base"]["repo"],
        payload["pull_request"]["head"]["repo"],
    ):
        repo["id"] = repository_id
        repo["owner"]["id"] = owner_id
    return payload


def _failed_jobs(hook: RemoteListener) -> list[str]:
    path = hook.state / "queue.db"
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        rows = db.execute("SELECT result FROM jobs WHERE state = 'failed' ORDER BY id").fetchall()
    return [str(result) for (result,) in rows]


def test_the_listener_elsewhere_makes_a_branch_through_the_door_and_close_destroys_it(
    remote: tuple[RemoteListener, FakeGitHub], door: Door
) -> None:
    hook, github = remote
    head = "3" * 40
    _pull(github, 31, head)
    payload = _payload(github, "opened", head, number=31)
    response = hook.send(payload)
    assert response.status_code == 202, response.text
    eventually(lambda: "success" in statuses(github, head), timeout=120, what="a success status")
    made = door.pool.registry.branch("shop-pr-31")
    # owned by the repository's id as the signed delivery has it
    assert made is not None and made.owner_repository_id == payload["repository"]["id"]
    assert columns(door.pool, "shop-pr-31") == "id"
    [comment] = comments(github, 31)
    assert "db/migrations/001_widgets.sql" in comment["body"]
    # the way in it gives is the pool's door, as its API says, not the listener's host
    [deployment] = github.deployments(SHOP)
    page = f"https://{door.machine.host}:{door.https_port}/b/shop-pr-31"
    assert deployment["statuses"][0]["environment_url"] == page

    with github.locked():
        github.pull(SHOP, 31).update(state="closed", merged=True)
    assert hook.send(_payload(github, "closed", head, number=31, merged=True)).status_code == 202
    eventually(lambda: door.pool.registry.branch("shop-pr-31") is None, what="the branch to go")
    eventually(lambda: "Destroyed" in comments(github, 31)[0]["body"], what="the final comment")
    _no_token_written(hook, door)


def test_the_listener_elsewhere_sweeps_a_branch_whose_close_it_missed(
    remote: tuple[RemoteListener, FakeGitHub], door: Door
) -> None:
    """Reconcile cannot list the pool's branches: it sweeps the pull requests whose last job in
    its queue is not a close that ran, and the close job destroys the branch through the door."""
    hook, github = remote
    head = "6" * 40
    _pull(github, 61, head)
    assert hook.send(_payload(github, "opened", head, number=61)).status_code == 202
    eventually(lambda: "success" in statuses(github, head), timeout=120, what="the branch")
    assert door.pool.registry.branch("shop-pr-61") is not None
    with github.locked():
        github.pull(SHOP, 61)["state"] = "closed"
    eventually(
        lambda: door.pool.registry.branch("shop-pr-61") is None,
        timeout=60,
        what="reconcile to destroy the branch",
    )


def test_the_listener_with_another_owners_token_or_a_revoked_one_makes_nothing(
    remote: tuple[RemoteListener, FakeGitHub], door: Door
) -> None:
    hook, github = remote
    # a token of another owner: refused, nothing made
    hook.stop()
    other = door.issue(f"listener-other-{os.urandom(3).hex()}", "--owner", "octo-org")
    hook.give_token(other)
    hook.start()
    head = "4" * 40
    _pull(github, 41, head)
    assert hook.send(_payload(github, "opened", head, number=41)).status_code == 202
    [why] = eventually(lambda: _failed_jobs(hook), what="the job to fail")
    assert "may act for octo-org/*, not for acme/shop" in why
    assert door.pool.registry.branch("shop-pr-41") is None
    # ... and the pull request is told, in its commit status and its comment
    said = [s for s in github.state.statuses if s.get("sha") == head]
    assert [s["state"] for s in said] == ["failure"], said
    assert "the pool refused this job" in str(said[0]["description"])
    assert any("the pool refused this job" in str(c["body"]) for c in github.state.comments)
    # the listener's own token, revoked: refused, nothing made
    hook.stop()
    hook.give_token(hook.issued)
    hook.start()
    name = next(
        str(e["credential"])
        for e in reversed(door.audit())
        if e["event"] == "api_credential_issued" and str(e["credential"]).startswith("listener-e2e")
    )
    done = cli(["api", "token", "revoke", name], env=door.env)
    assert done.returncode == 0, done.stderr
    head = "5" * 40
    _pull(github, 51, head)
    assert hook.send(_payload(github, "opened", head, number=51)).status_code == 202
    eventually(lambda: len(_failed_jobs(hook)) == 2 or None, what="the second job to fail")
    assert "not one this pool issued, or it was revoked" in _failed_jobs(hook)[1]
    assert door.pool.registry.branch("shop-pr-51") is None
    refused = [e for e in door.audit() if e["event"] == "api_credential_refused"]
    assert {e["credential"] for e in refused} >= {other_name(door, other), None}
    _no_token_written(hook, door, other)


def other_name(door: Door, token: str) -> str:
    """The name of a token, from the store's digest of it (the store has no token)."""
    from pgoverlay.runner.service import tokens

    digest = tokens.digest_of(token)
    return next(t.name for t in tokens.load(door.pool.home) if t.digest == digest)


def _no_token_written(hook: RemoteListener, door: Door, *more: str) -> None:
    """No token reaches a log line or the audit file: the listener's log, the door's, the
    engine service's, the engine's audit file."""
    written = [
        hook.log,
        door.log,
        door.pool.home / audit.ENGINE_LOG,
        door.pool.home / "service.log",
    ]
    for token in (hook.issued, *more):
        secret = token.removeprefix("pgo_")
        for path in written:
            if path.exists():
                assert secret not in path.read_text(errors="replace"), path


# -- the listener's settings, and what its requests name ----------------------------------------


def _settings(**given: object) -> Any:
    from pgoverlay.webhook.settings import WebhookSettings

    return WebhookSettings(secret="s", token="t", **given)  # type: ignore[arg-type]


def test_the_listeners_server_needs_its_token_file_and_a_ca_its_jobs_can_see(
    tmp_path: Path,
) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="server needs server_token_file"):
        _settings(server="https://pool.example.test:8443")
    with pytest.raises(ValidationError, match="for a pool on another host: set server"):
        _settings(server_token_file=tmp_path / "token")
    with pytest.raises(ValidationError, match="a job sees its own /var/tmp, not this one"):
        _settings(
            server="https://pool.example.test:8443",
            server_token_file=tmp_path / "token",
            server_ca=Path("/var/tmp/ca.pem"),
        )


def test_a_token_file_without_a_token_is_refused_without_quoting_it(tmp_path: Path) -> None:
    from pgoverlay.errors import ConfigError
    from pgoverlay.webhook.engines import read_token

    path = tmp_path / "token"
    path.write_text("ghp_notAnApiTokenButSecret\n")
    settings = _settings(server="https://pool.example.test:8443", server_token_file=path)
    with pytest.raises(ConfigError, match="does not hold an API token") as refused:
        read_token(settings)
    assert "notAnApiToken" not in str(refused.value)
    path.write_text("pgo_" + "x" * 43 + "\n")
    assert read_token(settings) == "pgo_" + "x" * 43


def test_what_the_listener_names_is_what_the_door_reads() -> None:
    from pgoverlay.errors import RequestError
    from pgoverlay.runner.service import acting

    named = acting.Acting(repository=SHOP, repository_id=SHOP_ID, owner_id=ACME_ID, from_fork=True)
    assert acting.parse(acting.headers(named), create=True) == named
    assert acting.parse(acting.headers(named), create=False).from_fork is None
    sent = acting.headers(named) | {acting.REPOSITORY_ID_HEADER: "-3"}
    with pytest.raises(RequestError, match="not a GitHub id"):
        acting.parse(sent, create=False)


def test_a_listeners_request_is_held_to_owners_and_pinned_ids_not_to_workflows() -> None:
    from pgoverlay.runner.callers.policy import Decision, parse

    rules = parse(
        b"owners:\n  - {name: acme, id: 501}\n"
        b"repositories:\n  - {name: acme/shop, id: 2002, branches: 3}\n"
        b"workflows:\n  - 'acme/*/.github/workflows/db.yml@*'\n",
        name="policy.yml",
    )

    def ask(
        *, repository_id: int = SHOP_ID, owner_id: int = ACME_ID, from_fork: bool | None = None
    ) -> Decision:
        return rules.admit_listener(
            repository=SHOP, repository_id=repository_id, owner_id=owner_id, from_fork=from_fork
        )

    admitted = ask(from_fork=False)
    # no workflow runs for the listener: the workflows rule does not refuse it
    assert admitted.allowed and admitted.branch_limit == 3
    impostor = ask(owner_id=999)
    assert (impostor.allowed, impostor.rule) == (False, "owners")
    recreated = ask(repository_id=3003)
    assert (recreated.allowed, recreated.rule) == (False, "repositories")
    fork = ask(from_fork=True)
    assert (fork.allowed, fork.rule) == (False, "forks")
    # not a create: the forks rule asks nothing, so a fork's branch can still be destroyed
    assert ask(from_fork=None).allowed


def test_a_damaged_token_store_refuses_every_token_and_says_so_in_the_engines_log(
    door: Door,
) -> None:
    token = door.issue("listener-before-damage", "--owner", "acme")
    store = door.pool.home / "api" / "tokens.json"
    kept = store.read_bytes()
    try:
        store.write_text("{not json")
        status, body = door.create(token, "remote-damaged")
        assert status == 503 and "cannot check API tokens now" in body["message"], body
        assert "tokens.json" not in body["message"]
    finally:
        store.write_bytes(kept)
    assert door.pool.registry.branch("remote-damaged") is None
    status, _ = door.create(token, "remote-mended")
    assert status == 201
    door.call("POST", "/branches/remote-mended/destroy", token=token, body={})
