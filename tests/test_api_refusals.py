"""Refused tokens on the network API are counted per address and the repository they claim:
runners behind one NAT share an address, and one misconfigured workflow must not lock the
other repositories' valid tokens out for the whole window. The real door, its real API, the
local OIDC issuer (apikit, oidckit)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from apikit import running_door

from oidckit import Key, claims, sign
from pgoverlay.runner.door import refusals
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion

POLICY = "owners:\n  - acme\nrepositories:\n  - acme/*\n"
SHOP_ID, WEB_ID = 2002, 2003


def test_one_misconfigured_workflow_behind_a_nat_locks_out_only_its_own_repository(
    pool: Pool, base: BaseVersion, service: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = tmp_path_factory.mktemp("api-nat")
    with running_door(
        pool, base, folder, policy=POLICY, env={"PGOVERLAY_DOOR_FAILED_LOGINS": "3"}
    ) as door:
        # acme/web's workflow asks for the wrong audience, again and again
        wrong = door.of("acme/web", WEB_ID, aud="https://not-the-pool.example")
        for _ in range(3):
            status, body, _ = door.call("GET", "/bases", token=wrong)
            assert status == 401, body
        status, body, _ = door.call("GET", "/bases", token=door.of("acme/web", WEB_ID))
        assert status == 429 and "for acme/web" in body["message"], body
        # acme/shop's job on a runner behind the same address is not locked out
        status, body, _ = door.call("GET", "/bases", token=door.of("acme/shop", SHOP_ID))
        assert status == 200, body


def test_a_source_that_varies_its_claim_meets_a_ceiling_for_its_address(
    pool: Pool, base: BaseVersion, service: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = tmp_path_factory.mktemp("api-claims")
    with running_door(
        pool, base, folder, policy=POLICY, env={"PGOVERLAY_DOOR_FAILED_LOGINS": "2"}
    ) as door:
        nobody = Key.make("key-of-nobody")
        ceiling = 2 * refusals.CLAIMS_PER_SOURCE
        for n in range(ceiling):
            forged = sign(
                claims(door.issuer.url, now=time.time(), repository=f"acme/r{n // 2}"), nobody
            )
            status, body, _ = door.call("GET", "/bases", token=forged)
            assert status == 401, (n, body)
        fetched = door.issuer.jwks_fetches
        status, body, _ = door.call("GET", "/bases", token=door.of("acme/shop", SHOP_ID))
        assert status == 429 and "from this address" in body["message"], body
        assert door.issuer.jwks_fetches == fetched  # nothing was verified for it


def test_the_claim_counted_is_the_requests_repository_whatever_the_token() -> None:
    token = sign(claims("https://issuer.example", now=time.time()), Key.make("k"))
    assert refusals.claim_of(token, {}) == "acme/shop"
    assert (
        refusals.claim_of("pgo_" + "a" * 43, {"x-pgoverlay-repository": "Acme/Web"}) == "acme/web"
    )
    for nonsense in ("", "a.b.c", "x" * 100, "a." + "!" * 20 + ".c"):
        assert refusals.claim_of(nonsense, {}) == ""
