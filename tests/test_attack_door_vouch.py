"""Attacks by a front door that was taken: code running as the door's uid, on the engine's
socket, sending the headers the door sends. The engine takes no repository, limit or person on
the door's word: it verifies the credential the door forwards (a job's OIDC token, a listener's
API token, a reader's GitHub token) itself. Everything is real: the engine service (root), the
door (`pgoverlay door`, its own user), a local OIDC issuer and the fake GitHub (checked against
GitHub's OpenAPI description); the attacker is a child process with the door's uid."""

from __future__ import annotations

import json
import os
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apikit import Api, running_door

from fakegithub import FakeGitHub
from helpers import as_user_call
from oidckit import Key, claims, sign
from pgoverlay.runner import branch
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.service.engine import LocalEngine

DOOR = "pgoverlay-door"  # Settings.door.user's default
POLICY = """
owners:
  - acme
repositories:
  - acme/*
"""
SHOP_ID, WEB_ID = 3002, 3003
# What the door sent on main: a repository and its id, on its word alone.
STALE = "x-pgoverlay-vouched-repository", "x-pgoverlay-vouched-repository-id"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeGitHub]:
    with FakeGitHub() as made:
        made.add_repo("acme/shop", private=True)
        made.add_collaborator("acme/shop", "alice", "write")
        made.add_collaborator("acme/shop", "bob", "read")
        for login in ("alice", "bob", "mallory"):
            made.add_token(f"gho_{login}_token_of_the_test", login)
        yield made
        assert made.violations == []


@pytest.fixture(scope="module")
def api(
    pool: Pool,
    base: BaseVersion,
    service: Path,
    fake: FakeGitHub,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Api]:
    folder = tmp_path_factory.mktemp("attack-door")
    # The base is unmasked: people's credentials in it are allowed here, so that what refuses
    # them below is the door's lack of proof.
    github = {"github_api_url": fake.url, "github_web_url": fake.url, "access_unmasked": True}
    try:
        with running_door(pool, base, folder, policy=POLICY, engine=github) as door:
            yield door
    finally:
        for b in pool.registry.branches():
            if b.name.startswith("atk-door-"):
                LocalEngine(pool).destroy(b.name)


def as_door(service: Path, headers: dict[str, str], call: str) -> Any:
    """Run ``call`` (an expression on ``engine``) as the door's uid, with ``headers`` on each of
    its requests: its JSON answer, or {"error": class name, "message": ...}."""
    code = textwrap.dedent(
        f"""
        import json
        from pathlib import Path
        from pgoverlay.errors import PgoverlayError
        from pgoverlay.runner.service.client import RemoteEngine
        from pgoverlay.runner.service.models import CreateRequest, GrantRequest
        from pgoverlay.runner.service.shape import as_dict
        engine = RemoteEngine(Path({os.fspath(service)!r}), headers={headers!r})
        try:
            result = as_dict({call})
        except PgoverlayError as err:
            result = {{"error": type(err).__name__, "message": str(err)}}
        print(json.dumps(result))
        """
    )
    done = as_user_call(DOOR, ["pgoverlay"], code, preload=["pgoverlay.runner.service.models"])
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def forged(api: Api, repository: str, repository_id: int) -> str:
    """A token that says what a job of ``repository`` would, signed by a key the issuer does not
    publish (the door holds no key of GitHub's)."""
    owner = repository.partition("/")[0]
    payload = claims(
        api.issuer.url,
        now=time.time(),
        aud=api.audience,
        repository=repository,
        repository_owner=owner,
        repository_id=str(repository_id),
        job_workflow_ref=f"{repository}/.github/workflows/db.yml@refs/pull/42/merge",
    )
    return sign(payload, Key.make("key-1"))  # the kid of the issuer's key, not its key


def test_a_taken_door_cannot_read_the_password_of_a_branch_made_through_the_api(
    api: Api, service: Path
) -> None:
    shop = api.of("acme/shop", SHOP_ID)
    status, made, _ = api.call(
        "POST", "/branches", token=shop, body={"name": "atk-door-pw", "base": api.base.name}
    )
    assert status == 201, made
    attempts = {
        "the repository on its word": {STALE[0]: "acme/shop", STALE[1]: str(SHOP_ID)},
        "a token it signed itself": {
            "x-pgoverlay-vouched-token": forged(api, "acme/shop", SHOP_ID)
        },
        "another repository's real token": {
            "x-pgoverlay-vouched-token": api.of("acme/web", WEB_ID)
        },
        "a made-up API token": {
            "x-pgoverlay-vouched-token": "pgo_" + "A" * 43,
            "x-pgoverlay-repository": "acme/shop",
            "x-pgoverlay-repository-id": str(SHOP_ID),
            "x-pgoverlay-owner-id": "1",
        },
        "nothing": {},
    }
    for what, headers in attempts.items():
        answer = as_door(service, headers, 'engine.connection("atk-door-pw")')
        assert "password" not in answer, (what, answer)
        assert answer["error"] in (
            "NotOwnerError",
            "DoorForbiddenError",
            "TokenError",
        ), (what, answer)
    # The job's own token, forwarded, is what opens it: the refusals above are not blanket.
    answer = as_door(
        service, {"x-pgoverlay-vouched-token": shop}, 'engine.connection("atk-door-pw")'
    )
    assert answer.get("password"), answer


def test_a_taken_door_cannot_create_a_branch_for_a_repository_of_its_choice(
    api: Api, service: Path
) -> None:
    request = f'engine.create(CreateRequest(name="atk-door-made", base={api.base.name!r}, pr=1))'
    attempts = {
        "the repository on its word": {STALE[0]: "acme/chosen", STALE[1]: "4242"},
        "a limit on its word": {
            STALE[0]: "acme/chosen",
            STALE[1]: "4242",
            "x-pgoverlay-vouched-branch-limit": "1000",
        },
        "a token it signed itself": {"x-pgoverlay-vouched-token": forged(api, "acme/chosen", 4242)},
        "a made-up API token": {
            "x-pgoverlay-vouched-token": "pgo_" + "B" * 43,
            "x-pgoverlay-repository": "acme/chosen",
            "x-pgoverlay-repository-id": "4242",
            "x-pgoverlay-owner-id": "1",
            "x-pgoverlay-fork": "false",
        },
        "nothing": {},
    }
    for what, headers in attempts.items():
        answer = as_door(service, headers, request)
        assert "error" in answer, (what, answer)
        assert api.pool.registry.branch("atk-door-made") is None, what
    # A job's real token of a pull request makes a branch for that pull request alone.
    token = api.of("acme/shop", SHOP_ID, ref="refs/pull/7/merge")
    other_pr = f'engine.create(CreateRequest(name="atk-door-made", base={api.base.name!r}, pr=8))'
    answer = as_door(service, {"x-pgoverlay-vouched-token": token}, other_pr)
    assert answer.get("error") == "NotOwnerError" and "pull request #7" in answer["message"]
    assert api.pool.registry.branch("atk-door-made") is None


def test_a_taken_door_cannot_grant_a_person_of_its_choice(
    api: Api, service: Path, fake: FakeGitHub
) -> None:
    branch.create(api.pool, "atk-door-grant", base_name=api.base.name, repository="acme/shop", pr=3)

    def grant(login: str, *, reader: str | None, read_only: bool = True) -> Any:
        request = (
            f'GrantRequest(login="{login}", read_only={read_only}, vouched_by="github:{login}")'
        )
        headers = {} if reader is None else {"x-pgoverlay-vouched-reader-token": reader}
        return as_door(service, headers, f'engine.grant("atk-door-grant", {request})')

    refused = {
        "no sign-in at all": grant("mallory", reader=None),
        "another reader's sign-in": grant("mallory", reader="gho_alice_token_of_the_test"),
        "a reader without access": grant("mallory", reader="gho_mallory_token_of_the_test"),
        "a token GitHub never gave": grant("mallory", reader="gho_made_up_by_the_door"),
        "more than GitHub gives": grant("bob", reader="gho_bob_token_of_the_test", read_only=False),
    }
    for what, answer in refused.items():
        assert "password" not in answer, (what, answer)
        assert answer.get("error") in ("DoorForbiddenError", "NotOwnerError"), (what, answer)
    roles = [g.role for g in LocalEngine(api.pool).grants("atk-door-grant")]
    assert roles == [], roles
    # A reader GitHub signed in gets what GitHub gives them, through the same door.
    answer = grant("bob", reader="gho_bob_token_of_the_test")
    assert answer.get("password") and answer["read_only"] is True, answer
    answer = grant("alice", reader="gho_alice_token_of_the_test", read_only=False)
    assert answer.get("password") and answer["read_only"] is False, answer
    for token in ("gho_bob_token_of_the_test", "gho_alice_token_of_the_test"):
        assert token not in (api.pool.home / "service.log").read_text()
