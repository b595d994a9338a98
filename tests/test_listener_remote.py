"""The webhook listener on another host, with an API token the admin issued: the real engine
service (root), the real front door with the network API on (as its own user), a token issued
by `pgoverlay api token issue`, TLS verified against the test's CA, and the door listening on
the host's end of a network namespace (tests/netns.py), which stands for the listener's host."""

from __future__ import annotations

import http.client
import json
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from netns import Machine

from doorkit import DoorCA, make_ca
from helpers import cli, free_tcp_port, os_user, require, service_settings
from oidckit import AUDIENCE, Issuer, Key
from pgoverlay.runner import audit
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.service.engine import LocalEngine
from pgoverlay.runner.service.serve import settings_environ

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
    certs: DoorCA
    https_port: int
    door_port: int
    log: Path
    env: dict[str, str]

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
        context = ssl.create_default_context(cafile=os.fspath(self.certs.ca_file))
        conn = http.client.HTTPSConnection(
            self.machine.host, self.https_port, context=context, timeout=300
        )
        sent: dict[str, str] = {}
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        if repository is not None:
            sent["x-pgoverlay-repository"] = repository
            sent["x-pgoverlay-repository-id"] = str(repository_id)
            sent["x-pgoverlay-owner-id"] = str(owner_id)
        if fork is not None:
            sent["x-pgoverlay-fork"] = fork
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            sent["Content-Type"] = "application/json"
        try:
            conn.request(method, f"/api/v1{path}", body=payload, headers=sent)
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        return response.status, json.loads(raw) if raw else None

    def create(self, token: str, name: str, **headers: Any) -> tuple[int, Any]:
        return self.call(
            "POST", "/branches", token=token, body={"name": name, "base": self.base.name}, **headers
        )

    def audit(self) -> list[dict[str, object]]:
        return audit.read(self.pool.home / audit.ENGINE_LOG)


def _wait_port(host: str, port: int, door: subprocess.Popen[bytes]) -> None:
    import socket

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if door.poll() is not None:
            raise AssertionError(f"the front door exited with {door.returncode}")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"the front door did not answer on {host}:{port}")


@pytest.fixture(scope="module")
def door(
    pool: Pool, base: BaseVersion, service: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Door]:
    require(subprocess.run(["which", "ip"], capture_output=True).returncode == 0, "needs iproute2")
    folder = tmp_path_factory.mktemp("listener-remote")
    os.chmod(folder, 0o755)
    os_user("pgoverlay-door", groups=["pgoverlay"])
    policy = folder / "policy.yml"
    policy.write_text(POLICY)
    door_port, https_port = free_tcp_port(), free_tcp_port()
    with Machine() as machine, Issuer([Key.make("key-1")]) as issuer:
        certs = make_ca(folder, names=("localhost",), addresses=(machine.host,))
        env = {
            **settings_environ(service_settings(pool)),
            "PGOVERLAY_DOOR_HOST": machine.host,
            "PGOVERLAY_DOOR_ADDRESS": machine.host,
            "PGOVERLAY_DOOR_PORT": str(door_port),
            "PGOVERLAY_DOOR_HTTPS_PORT": str(https_port),
            "PGOVERLAY_DOOR_CERT_FILE": os.fspath(certs.cert_file),
            "PGOVERLAY_DOOR_KEY_FILE": os.fspath(certs.key_file),
            "PGOVERLAY_API_ISSUER": issuer.url,
            "PGOVERLAY_API_AUDIENCE": AUDIENCE,
            "PGOVERLAY_API_POLICY_FILE": os.fspath(policy),
        }
        log = open(folder / "door.log", "wb")  # noqa: SIM115 - closed below
        process = subprocess.Popen(
            [sys.executable, "-P", "-m", "pgoverlay", "door"],
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd="/",
        )
        try:
            _wait_port(machine.host, https_port, process)
            yield Door(pool, base, machine, certs, https_port, door_port, folder / "door.log", env)
        finally:
            process.terminate()
            process.wait(timeout=30)
            log.close()
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
