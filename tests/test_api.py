"""The engine's API on the network (`/api/v1` on the front door's HTTPS port), authenticated by
GitHub Actions OIDC tokens. Everything is real: the engine service (root), the front door
(`pgoverlay door`, as its own user, reaching the engine through its socket), TLS verified
against the test's CA, and an OIDC issuer on loopback (tests/oidckit.py) signing tokens with
the claims GitHub puts in them."""

from __future__ import annotations

import http.client
import json
import os
import sqlite3
import ssl
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apikit import Api, running_door

from helpers import as_user_call, os_user
from oidckit import AUDIENCE, Key, claims, sign
from pgoverlay.errors import (
    IssuerError,
    LimitReachedError,
    NotOwnerError,
    PolicyError,
    ServiceError,
    SettingError,
    TokenError,
)
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion, Registry
from pgoverlay.runner.service.client import RemoteEngine
from pgoverlay.runner.service.engine import LocalEngine
from pgoverlay.runner.service.models import CreateRequest
from pgoverlay.runner.service.vouch import headers
from pgoverlay.runner.settings import Settings
from pgoverlay.runner.web.api import status as api_status

POLICY = """
owners:
  - acme
repositories:
  - acme/*
  - {name: acme/tiny, branches: 1}
"""
SHOP_ID, WEB_ID, TINY_ID = 2002, 2003, 2004


@pytest.fixture(scope="module")
def api(
    pool: Pool, base: BaseVersion, service: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Api]:
    folder = tmp_path_factory.mktemp("api")
    try:
        with running_door(pool, base, folder, policy=POLICY) as door:
            yield door
    finally:
        engine = LocalEngine(pool)
        for b in pool.registry.branches():
            if b.name.startswith("api-"):
                engine.destroy(b.name)


def create(api: Api, token: str, name: str, **extra: object) -> tuple[int, Any]:
    status, body, _ = api.call(
        "POST", "/branches", token=token, body={"name": name, "base": api.base.name, **extra}
    )
    return status, body


def test_refused_tokens_are_told_why_and_create_nothing(api: Api) -> None:
    now = time.time()
    stranger = Key.make("key-of-nobody")
    refused = {
        "expired": (api.token(exp=int(now) - 600, iat=int(now) - 900, nbf=int(now) - 900), 401),
        "not yet valid": (api.token(nbf=int(now) + 600), 401),
        "wrong audience": (api.token(aud="https://another-pool.example.test"), 401),
        "wrong issuer": (api.token(iss="https://token.actions.githubusercontent.com"), 401),
        "unknown key": (sign(claims(api.issuer.url, now=now), stranger), 401),
        "refused owner": (
            api.token(
                repository="evil/shop",
                repository_owner="evil",
                job_workflow_ref="evil/shop/.github/workflows/db.yml@refs/heads/main",
            ),
            403,
        ),
    }
    said = {
        "expired": "the token expired",
        "not yet valid": "is not valid for another",
        "wrong audience": "audience is 'https://another-pool.example.test', expected",
        "wrong issuer": "the token's issuer is 'https://token.actions.githubusercontent.com'",
        "unknown key": "unknown key 'key-of-nobody'",
        "refused owner": "the owner evil is not one this pool serves",
    }
    for number, (what, (token, expected)) in enumerate(refused.items()):
        name = f"api-refused-{number}"
        status, body = create(api, token, name)
        assert status == expected, (what, body)
        assert said[what] in body["message"], (what, body)
        assert token not in body["message"] and token.split(".")[1] not in body["message"]
        assert api.pool.registry.branch(name) is None, what
    logged = api.log.read_text()
    assert "api POST /api/v1/branches for an unverified caller -> 401" in logged
    assert "for evil/shop (id 2002) -> 403" in logged
    for token, _ in refused.values():
        assert token.split(".")[1] not in logged and token.split(".")[2] not in logged
    for authorization, fragment in ((None, "no token"), ("Basic abc", "not `Bearer TOKEN`")):
        status, body, response = api.call(
            "POST",
            "/branches",
            token=None,
            authorization=authorization,
            body={"name": "api-refused-x", "base": api.base.name},
        )
        assert status == 401 and fragment in body["message"]
        assert response.getheader("www-authenticate", "").startswith("Bearer")
    assert api.pool.registry.branch("api-refused-x") is None


def test_a_valid_token_creates_reads_resets_and_destroys_its_own_branch(api: Api) -> None:
    token = api.of("acme/shop", SHOP_ID)
    # The repository the caller names is not the owner: the token's is.
    status, made = create(api, token, "api-shop", repository="acme/web", pr=42)
    assert status == 201, made
    assert made["repository"] == "acme/shop" and made["pr"] == 42
    stored = api.pool.registry.branch("api-shop")
    assert stored is not None and stored.owner_repository_id == SHOP_ID
    assert stored.repository == "acme/shop"
    status, seen, _ = api.call("GET", "/branches/api-shop", token=token)
    assert status == 200 and seen["name"] == "api-shop" and seen["state"] == "ready"
    status, conn, _ = api.call("GET", "/branches/api-shop/connection", token=token)
    assert status == 200 and conn["password"]
    # Through the front door's Postgres port, over verified TLS, by the branch's name.
    door = ("localhost", api.door_port, "api-shop")
    assert (conn["host"], conn["port"], conn["database"]) == door
    dsn = {
        "host": conn["host"],
        "port": conn["port"],
        "user": conn["user"],
        "password": conn["password"],
        "dbname": conn["database"],
        "sslmode": "verify-full",
        "sslrootcert": os.fspath(api.certs.ca_file),
    }
    with psycopg.connect(**dsn, autocommit=True) as db:
        db.execute("CREATE TABLE made_by_migration (id int)")
    record = json.dumps({"migrations": ["0001"]})
    status, _, _ = api.call("PUT", "/branches/api-shop/record", token=token, body={"data": record})
    assert status == 204
    status, kept, _ = api.call("GET", "/branches/api-shop/record", token=token)
    assert status == 200 and kept["data"] == record
    status, reset, _ = api.call("POST", "/branches/api-shop/reset", token=token, body={})
    assert status == 200, reset
    with psycopg.connect(**dsn) as db:
        found = db.execute("SELECT to_regclass('made_by_migration')").fetchone()
    assert found == (None,)
    status, gone, _ = api.call("POST", "/branches/api-shop/destroy", token=token, body={})
    assert status == 200 and gone["destroyed"] is True
    assert gone["record"]["data"] == record
    assert api.pool.registry.branch("api-shop") is None


def test_one_repository_cannot_read_reset_destroy_or_record_on_anothers_branch(api: Api) -> None:
    shop = api.of("acme/shop", SHOP_ID)
    status, made = create(api, shop, "api-owned")
    assert status == 201, made
    others = {
        "another repository": api.of("acme/web", WEB_ID),
        # acme/shop deleted and made again: the same name, another id
        "a re-created repository": api.of("acme/shop", 9999),
    }
    calls: list[tuple[str, str, object]] = [
        ("GET", "/branches/api-owned", None),
        ("GET", "/branches/api-owned/connection", None),
        ("GET", "/branches/api-owned/record", None),
        ("PUT", "/branches/api-owned/record", {"data": "{}"}),
        ("POST", "/branches/api-owned/reset", {"repository": "acme/shop"}),
        ("POST", "/branches/api-owned/trace", {"repository": "acme/shop"}),
        ("POST", "/branches/api-owned/destroy", {"repository": "acme/shop"}),
    ]
    for who, token in others.items():
        for method, path, body in calls:
            status, answer, _ = api.call(method, path, token=token, body=body)
            assert status == 403, (who, method, path, answer)
            assert answer["code"] == "not_owner", (who, path, answer)
            assert "acts for its own repository" in answer["message"]
            assert "password" not in answer
    assert "another repository of that name" in answer["message"]
    stored = api.pool.registry.branch("api-owned")
    assert stored is not None and stored.state == "ready" and stored.owner_repository_id == SHOP_ID
    assert api.pool.registry.record("api-owned") is None
    status, gone, _ = api.call("POST", "/branches/api-owned/destroy", token=shop, body={})
    assert status == 200 and gone["destroyed"] is True


def test_a_branch_made_on_the_socket_is_not_the_networks_and_the_policys_limit_holds(
    api: Api,
) -> None:
    request = CreateRequest(name="api-local", base=api.base.name, repository="acme/shop")
    LocalEngine(api.pool).create(request)
    shop = api.of("acme/shop", SHOP_ID)
    status, answer, _ = api.call("POST", "/branches/api-local/destroy", token=shop, body={})
    assert status == 403 and "not through the network API" in answer["message"]
    assert api.pool.registry.branch("api-local") is not None
    tiny = api.of("acme/tiny", TINY_ID)
    status, made = create(api, tiny, "api-tiny-1")
    assert status == 201, made
    status, refused = create(api, tiny, "api-tiny-2")
    assert status == 429 and "policy" in refused["message"], refused
    assert api.pool.registry.branch("api-tiny-2") is None
    # A repository is counted by its id: acme/tiny deleted and made again starts its own count.
    status, made = create(api, api.of("acme/tiny", TINY_ID + 9000), "api-tiny-3")
    assert status == 201, made


def test_only_the_front_doors_uid_may_vouch_for_a_repository(api: Api, service: Path) -> None:
    """A member of the service's group that sends the door's headers itself is refused."""
    os_user("pgo-runner", groups=["pgoverlay"])
    sent = headers(token=api.of("acme/shop", SHOP_ID))
    code = "\n".join(
        [
            "from pathlib import Path",
            "from pgoverlay.errors import NotOwnerError",
            "from pgoverlay.runner.service.client import RemoteEngine",
            "from pgoverlay.runner.service.models import CreateRequest",
            f"engine = RemoteEngine(Path({os.fspath(service)!r}), headers={sent!r})",
            "try:",
            f"    engine.create(CreateRequest(name='api-forged', base={api.base.name!r}, "
            "repository='acme/shop'))",
            "except NotOwnerError as err:",
            "    print('refused:', err)",
        ]
    )
    done = as_user_call("pgo-runner", ["pgoverlay"], code)
    assert done.returncode == 0, done.stderr
    assert "refused: only the front door's identity may vouch" in done.stdout
    assert api.pool.registry.branch("api-forged") is None
    # root, too, is not the door: its vouching is refused rather than taken
    with pytest.raises(NotOwnerError):
        RemoteEngine(service, headers=sent).reset("api-local", repository=None)


def test_the_branch_pages_still_answer_beside_the_api(api: Api) -> None:
    context = ssl.create_default_context(cafile=os.fspath(api.certs.ca_file))
    conn = http.client.HTTPSConnection("localhost", api.port, context=context, timeout=60)
    try:
        conn.request("GET", "/b/api-nothing")
        response = conn.getresponse()
        page = response.read().decode()
    finally:
        conn.close()
    # This door has no OAuth client: its pages say sign-in is not set up, as without the API.
    assert response.status == 503 and "Sign-in is not set up" in page
    status, body, _ = api.call("GET", "/no-such-route", token=None)
    assert status == 404 and "docs/api.md" in body["message"]


def test_an_audience_without_a_policy_file_is_refused_when_settings_are_read() -> None:
    with pytest.raises(SettingError, match="PGOVERLAY_API_POLICY_FILE: is required with"):
        Settings(api_audience=AUDIENCE)


def test_refusals_map_to_their_statuses() -> None:
    """A refused token is the caller's to fix (401); an unreachable issuer or engine may pass
    (503); the policy's refusal and another's branch are forbidden (403)."""
    assert api_status(TokenError("expired")) == 401
    assert api_status(IssuerError("down")) == 503
    assert api_status(ServiceError("down")) == 503
    assert api_status(PolicyError("no")) == 403
    assert api_status(NotOwnerError("not yours")) == 403
    assert api_status(LimitReachedError("full")) == 429


def test_a_registry_of_an_earlier_release_gains_the_owner_repository_column(
    tmp_path: Path,
) -> None:
    path = tmp_path / "registry.db"
    Registry(path).close()
    with closing(sqlite3.connect(path)) as db:  # as a release before the network API left it
        db.execute("ALTER TABLE branches DROP COLUMN owner_repository_id")
        db.commit()
    reopened = Registry(path)
    try:
        columns = {row[1] for row in reopened._read("PRAGMA table_info(branches)")}
        assert "owner_repository_id" in columns
        assert reopened.branches() == []
    finally:
        reopened.close()


def test_a_source_whose_tokens_are_refused_too_often_is_refused_before_any_is_looked_at(
    pool: Pool, base: BaseVersion, service: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Guessing tokens (or filling the engine's audit log with refused API tokens) goes no
    faster than guessing passwords on the Postgres port: after `door_failed_logins` refused
    tokens, the source gets 429 without its token being verified, a good one included."""
    folder = tmp_path_factory.mktemp("api-ban")
    env = {"PGOVERLAY_DOOR_FAILED_LOGINS": "3"}
    with running_door(pool, base, folder, policy=POLICY, env=env) as door:
        forged = sign(claims(door.issuer.url, now=time.time()), Key.make("key-of-nobody"))
        for _ in range(3):
            status, body, _ = door.call("GET", "/bases", token=forged)
            assert status == 401, body
        fetched = door.issuer.jwks_fetches
        status, body, _ = door.call("GET", "/bases", token=door.of("acme/shop", SHOP_ID))
        assert status == 429 and "too many refused tokens" in body["message"]
        assert door.issuer.jwks_fetches == fetched  # nothing was verified for it


def test_a_job_that_may_be_a_forks_is_refused_with_forks_off_and_nothing_is_created(
    pool: Pool, base: BaseVersion, service: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A private repository whose owner lets forks' runs have tokens: a `pull_request` run's
    token cannot say whether its pull request is a fork's, nor can a `pull_request_target`
    run's; with forks off, both are refused (403, the `forks` rule) and nothing is made."""
    folder = tmp_path_factory.mktemp("api-forks")
    strict = "owners: [acme]\nforks: false\nfork_write_tokens: true\n"
    with running_door(pool, base, folder, policy=strict) as door:
        runs = {
            "pull_request": door.of("acme/shop", SHOP_ID, repository_visibility="private"),
            "pull_request_target": door.of(
                "acme/shop",
                SHOP_ID,
                repository_visibility="private",
                event_name="pull_request_target",
                ref="refs/heads/main",
            ),
        }
        for number, (event, token) in enumerate(runs.items()):
            name = f"api-fork-{number}"
            status, body = create(door, token, name)
            assert status == 403 and body["code"] == "policy", (event, body)
            assert "(forks)" in body["message"] and "fork" in body["message"], body
            assert pool.registry.branch(name) is None
        # A push of the same repository is no pull request: admitted.
        push = door.of("acme/shop", SHOP_ID, event_name="push", ref="refs/heads/main")
        status, made = create(door, push, "api-fork-push")
        try:
            assert status == 201, made
        finally:
            LocalEngine(pool).destroy("api-fork-push")
