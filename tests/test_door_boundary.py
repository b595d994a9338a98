"""The import boundary, in the running process: the front door started as in production
(`pgoverlay door`: root prepares, then it runs as its own user) serves a Postgres login, a
branch page and a network API call, and has loaded no module of the root engine meanwhile.

What it loads is what the interpreter itself reports (``PYTHONPROFILEIMPORTTIME``: one line on
stderr, in the door's log, for each module the moment it is first imported, at start or later,
in a request); the classification is tests/importgraph.py's, which tests/test_layers.py checks
on the source."""

from __future__ import annotations

import http.client
import os
import re
import ssl
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from apikit import Api, running_door

import importgraph
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.service.engine import LocalEngine

POLICY = """
owners:
  - acme
repositories:
  - acme/*
"""
SHOP_ID = 3003
BRANCH = "boundary-shop"
IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \| ( *)(\S+)$")


@pytest.fixture(scope="module")
def door(
    pool: Pool, base: BaseVersion, service: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Api]:
    folder = tmp_path_factory.mktemp("boundary")
    secret = folder / "oauth-secret"
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"oauth-client-secret-of-the-test\n")
    os.close(fd)
    env = {
        "PYTHONPROFILEIMPORTTIME": "1",
        # the branch pages behind sign-in, as a pool that offers them has them
        "PGOVERLAY_OAUTH_CLIENT_ID": "Iv1.boundary",
        "PGOVERLAY_OAUTH_CLIENT_SECRET_FILE": os.fspath(secret),
    }
    try:
        with running_door(pool, base, folder, policy=POLICY, env=env) as running:
            yield running
    finally:
        engine = LocalEngine(pool)
        if pool.registry.branch(BRANCH) is not None:
            engine.destroy(BRANCH)


def loaded(log: Path) -> list[str]:
    """The modules the door's process imported, in order, as its interpreter reported them."""
    return [
        found.group(2)
        for line in log.read_text(errors="replace").splitlines()
        if (found := IMPORTED.match(line))
    ]


def test_the_door_serves_a_login_a_page_and_an_api_call_without_loading_the_engine(
    door: Api,
) -> None:
    token = door.of("acme/shop", SHOP_ID)
    status, made, _ = door.call(
        "POST", "/branches", token=token, body={"name": BRANCH, "base": door.base.name}
    )
    assert status == 201, made
    status, conn, _ = door.call("GET", f"/branches/{BRANCH}/connection", token=token)
    assert status == 200, conn
    dsn = {
        "host": conn["host"],
        "port": conn["port"],
        "user": conn["user"],
        "password": conn["password"],
        "dbname": conn["database"],
        "sslmode": "verify-full",
        "sslrootcert": os.fspath(door.certs.ca_file),
    }
    with psycopg.connect(**dsn, autocommit=True) as db:
        assert db.execute("SELECT 1").fetchone() == (1,)
    context = ssl.create_default_context(cafile=os.fspath(door.certs.ca_file))
    page = http.client.HTTPSConnection("localhost", door.port, context=context, timeout=60)
    try:
        page.request("GET", f"/b/{BRANCH}")
        answer = page.getresponse()
        answer.read()
    finally:
        page.close()
    # A reader not signed in is sent to sign in: the page application answered.
    assert answer.status in (302, 303, 307), answer.status
    assert "/signin" in (answer.getheader("Location") or "")

    modules = loaded(door.log)
    # The report is there to read, and names the door's own modules (else this proves nothing).
    assert {
        "pgoverlay.runner.door.router",
        "pgoverlay.runner.door.login",
        "pgoverlay.runner.web.page",
        "pgoverlay.runner.web.api",
    } <= set(modules), modules
    assert [m for m in modules if importgraph.zone(m) == "root"] == []
