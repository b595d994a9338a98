"""A GitHub Actions OIDC token verified against a real issuer (an HTTP server on 127.0.0.1 serving
discovery and a key set of RSA keys, tokens signed by PyJWT): what passes, each way one is
refused, and that no refusal or log line holds the token."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from cryptography.hazmat.primitives import serialization

from oidckit import AUDIENCE, Issuer, Key, claims, sign
from pgoverlay.errors import ConfigError, IssuerError, TokenError
from pgoverlay.runner.callers import oidc
from pgoverlay.runner.callers.oidc import Identity, Verifier

NOW = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def key() -> Key:
    return Key.make("key-1")


@pytest.fixture(scope="module")
def other_key() -> Key:
    return Key.make("key-2")


@pytest.fixture
def issuer(key: Key) -> Iterator[Issuer]:
    with Issuer([key]) as running:
        yield running


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def verifier(issuer: Issuer, clock: Clock) -> Verifier:
    return Verifier(issuer.url, AUDIENCE, clock=clock, leeway=60, http_timeout=5)


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def refused(verifier: Verifier, token: str, error: type[TokenError] = TokenError) -> str:
    with pytest.raises(error) as caught:
        verifier.verify(token)
    message = str(caught.value)
    assert token not in message
    for part in token.split("."):
        assert len(part) < 8 or part not in message
    return message


def test_a_valid_token_gives_the_identity_github_vouches_for(
    issuer: Issuer, verifier: Verifier, key: Key
) -> None:
    identity = verifier.verify(sign(claims(issuer.url, now=NOW), key))
    assert identity == Identity(
        repository="acme/shop",
        repository_id=2002,
        repository_owner="acme",
        repository_owner_id=1001,
        event_name="pull_request",
        ref="refs/pull/42/merge",
        head_ref="feature/loyalty",
        base_ref="main",
        job_workflow_ref="acme/shop/.github/workflows/db.yml@refs/pull/42/merge",
        runner_environment="github-hosted",
        repository_visibility="private",
        actor="octocat",
        sub="repo:acme/shop:pull_request",
    )
    assert identity.pull_request == 42
    # discovery, then the key set, once; a second token is checked with the cached keys
    verifier.verify(sign(claims(issuer.url, now=NOW, jti="second"), key))
    assert issuer.requests == ["/.well-known/openid-configuration", "/.well-known/jwks"]


def test_an_audience_list_holding_the_pool_passes(
    issuer: Issuer, verifier: Verifier, key: Key
) -> None:
    token = sign(claims(issuer.url, now=NOW, aud=["https://other", AUDIENCE]), key)
    assert verifier.verify(token).repository == "acme/shop"


def test_an_expired_token_is_refused_saying_how_long_ago(
    issuer: Issuer, verifier: Verifier, key: Key, clock: Clock
) -> None:
    token = sign(claims(issuer.url, now=NOW), key)
    clock.now = NOW + 300 + 59  # expired 59 s ago: within the leeway
    assert verifier.verify(token).repository_id == 2002
    clock.now = NOW + 300 + 75
    message = refused(verifier, token)
    assert message.startswith("the token expired 75 s ago")


def test_a_token_not_yet_valid_is_refused(issuer: Issuer, verifier: Verifier, key: Key) -> None:
    token = sign(claims(issuer.url, now=NOW, nbf=int(NOW) + 200), key)
    assert "not valid for another 200 s" in refused(verifier, token)
    within = sign(claims(issuer.url, now=NOW, nbf=int(NOW) + 50), key)
    assert verifier.verify(within).actor == "octocat"


def test_a_token_issued_in_the_future_beyond_the_leeway_is_refused(
    issuer: Issuer, verifier: Verifier, key: Key
) -> None:
    token = sign(claims(issuer.url, now=NOW, iat=int(NOW) + 120), key)
    assert "issued 120 s in the future" in refused(verifier, token)


def test_a_token_of_another_audience_is_refused_naming_both(
    issuer: Issuer, verifier: Verifier, key: Key
) -> None:
    token = sign(claims(issuer.url, now=NOW, aud="https://github.com/acme"), key)
    message = refused(verifier, token)
    assert message.startswith(
        f"the token's audience is 'https://github.com/acme', expected '{AUDIENCE}'"
    )


def test_a_token_of_another_issuer_is_refused_naming_both(
    issuer: Issuer, verifier: Verifier, key: Key
) -> None:
    token = sign(claims(issuer.url, now=NOW, iss="https://token.example.test"), key)
    message = refused(verifier, token)
    assert message.startswith(
        f"the token's issuer is 'https://token.example.test', expected '{issuer.url}'"
    )


def test_an_unknown_key_is_refused_then_a_rotated_key_is_picked_up_by_the_refresh(
    issuer: Issuer, verifier: Verifier, key: Key, other_key: Key, clock: Clock
) -> None:
    assert verifier.verify(sign(claims(issuer.url, now=NOW), key)).repository_id == 2002
    rotated = sign(claims(issuer.url, now=NOW + 30), other_key)
    clock.now = NOW + 30
    # not published yet, and the keys were fetched under a minute ago: refused without a fetch
    assert "signed by an unknown key 'key-2'" in refused(verifier, rotated)
    assert issuer.jwks_fetches() == 1
    issuer.keys = [other_key]  # the issuer rotates
    clock.now = NOW + 61
    assert verifier.verify(rotated).repository == "acme/shop"
    assert issuer.jwks_fetches() == 2
    # the old key is gone from the set now: a token it signs is refused
    old = sign(claims(issuer.url, now=NOW + 61), key)
    assert "signed by an unknown key 'key-1'" in refused(verifier, old)


def test_a_flood_of_bogus_key_ids_fetches_the_keys_at_most_once_a_minute(
    issuer: Issuer, verifier: Verifier, key: Key, clock: Clock
) -> None:
    payload = claims(issuer.url, now=NOW)
    for second in range(0, 180):
        clock.now = NOW + second
        for n in range(5):
            refused(verifier, sign(payload, key, kid=f"bogus-{second}-{n}"))
    # the first fetch at 0 s, then one at 60 s and one at 120 s
    assert issuer.jwks_fetches() == 3
    assert issuer.requests.count("/.well-known/openid-configuration") == 1


def test_a_key_set_older_than_an_hour_is_fetched_again_and_a_withdrawn_key_is_dropped(
    issuer: Issuer, verifier: Verifier, key: Key, other_key: Key, clock: Clock
) -> None:
    assert verifier.verify(sign(claims(issuer.url, now=NOW), key)).repository_id == 2002
    issuer.keys = [other_key]  # the issuer withdraws key-1
    clock.now = NOW + 1800  # the cached set is still used within the hour
    assert verifier.verify(sign(claims(issuer.url, now=clock.now), key)).repository_id == 2002
    assert issuer.jwks_fetches() == 1
    clock.now = NOW + oidc.MAX_KEY_AGE
    message = refused(verifier, sign(claims(issuer.url, now=clock.now), key))
    assert "signed by an unknown key 'key-1'" in message
    assert issuer.jwks_fetches() == 2


def test_keys_known_stay_in_use_when_a_refresh_cannot_reach_the_issuer(
    key: Key, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    with Issuer([key]) as issuer:
        verifier = Verifier(issuer.url, AUDIENCE, clock=clock, http_timeout=2)
        assert verifier.verify(sign(claims(issuer.url, now=NOW), key)).actor == "octocat"
    clock.now = NOW + oidc.MAX_KEY_AGE  # stale, and the issuer is gone
    token = sign(claims(issuer.url, now=clock.now), key)
    assert verifier.verify(token).actor == "octocat"
    assert any("cannot fetch the keys" in r.getMessage() for r in caplog.records)


def test_simultaneous_tokens_of_a_new_key_make_one_fetch(
    issuer: Issuer, verifier: Verifier, key: Key, other_key: Key, clock: Clock
) -> None:
    assert verifier.verify(sign(claims(issuer.url, now=NOW), key)).repository_id == 2002
    issuer.keys = [key, other_key]
    clock.now = NOW + 61
    token = sign(claims(issuer.url, now=clock.now), other_key)
    with ThreadPoolExecutor(max_workers=8) as workers:
        found = list(workers.map(lambda _: verifier.verify(token).repository_id, range(16)))
    assert found == [2002] * 16
    assert issuer.jwks_fetches() == 2


def test_alg_none_is_refused(issuer: Issuer, verifier: Verifier) -> None:
    header = b64(json.dumps({"alg": "none", "typ": "JWT", "kid": "key-1"}).encode())
    body = b64(json.dumps(claims(issuer.url, now=NOW)).encode())
    message = refused(verifier, f"{header}.{body}.")
    assert message.startswith("the token's header names 'none'; only RS256 is accepted")
    assert issuer.requests == []  # refused before any key is looked for


def test_hs256_signed_with_the_public_key_is_refused(
    issuer: Issuer, verifier: Verifier, key: Key
) -> None:
    """The classic confusion: a verifier that takes the header's algorithm would check an HMAC
    with the RSA public key (which anyone has) as its secret."""
    public = key.private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    header = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "key-1"}).encode())
    body = b64(json.dumps(claims(issuer.url, now=NOW)).encode())
    mac = hmac.new(public, f"{header}.{body}".encode(), hashlib.sha256).digest()
    message = refused(verifier, f"{header}.{body}.{b64(mac)}")
    assert message.startswith("the token's header names 'HS256'; only RS256 is accepted")


def test_a_key_whose_jwk_allows_another_algorithm_is_refused(
    issuer: Issuer, verifier: Verifier
) -> None:
    strict = Key.make("key-ps", alg="PS256")
    issuer.keys.append(strict)
    token = sign(claims(issuer.url, now=NOW), strict)
    message = refused(verifier, token)
    assert "names RS256 but its key 'key-ps' allows only 'PS256'" in message


def test_a_tampered_payload_is_refused(issuer: Issuer, verifier: Verifier, key: Key) -> None:
    header, _, signature = sign(claims(issuer.url, now=NOW), key).split(".")
    forged = b64(json.dumps(claims(issuer.url, now=NOW, repository="acme/bank")).encode())
    message = refused(verifier, f"{header}.{forged}.{signature}")
    assert message.startswith("the token's signature does not match its key 'key-1'")


def test_a_token_signed_by_another_key_under_a_published_kid_is_refused(
    issuer: Issuer, verifier: Verifier, other_key: Key
) -> None:
    token = sign(claims(issuer.url, now=NOW), other_key, kid="key-1")
    assert "signature does not match" in refused(verifier, token)


def test_an_oversized_token_is_refused_before_it_is_parsed(
    issuer: Issuer, verifier: Verifier, key: Key
) -> None:
    token = sign(claims(issuer.url, now=NOW, padding="x" * 17_000), key)
    message = refused(verifier, token)
    assert message.startswith(f"the token is {len(token)} bytes, over the 16384 accepted")
    assert issuer.requests == []


def test_text_that_is_not_a_jwt_is_refused(verifier: Verifier) -> None:
    assert refused(verifier, "Bearer abc").startswith("the token is not a JWT")


def test_a_missing_claim_is_refused_naming_it(issuer: Issuer, verifier: Verifier, key: Key) -> None:
    token = sign(claims(issuer.url, now=NOW, repository_id=None), key)
    assert refused(verifier, token).startswith("the token has no repository_id claim")
    token = sign(claims(issuer.url, now=NOW, repository_owner_id="12a"), key)
    assert refused(verifier, token).startswith(
        "the token's repository_owner_id is not a positive integer"
    )
    token = sign(claims(issuer.url, now=NOW, exp=None), key)
    assert refused(verifier, token).startswith("the token has no exp claim")


def test_an_unreachable_issuer_is_a_clear_issuer_error(key: Key, clock: Clock) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    verifier = Verifier(f"http://127.0.0.1:{port}", AUDIENCE, clock=clock, http_timeout=2)
    token = sign(claims(f"http://127.0.0.1:{port}", now=NOW), key)
    message = refused(verifier, token, IssuerError)
    assert message.startswith(f"cannot reach the OIDC issuer at 127.0.0.1:{port}")
    assert "check the issuer's address and this host's network" in message
    # within the retry pause, no new attempt: the same kind of error, saying so
    assert "could not be fetched" in refused(verifier, token, IssuerError)


def test_a_discovery_document_naming_another_issuer_is_refused(
    issuer: Issuer, verifier: Verifier, key: Key
) -> None:
    issuer.issuer_named = "https://token.actions.githubusercontent.com"
    message = refused(verifier, sign(claims(issuer.url, now=NOW), key), IssuerError)
    assert "discovery document names the issuer 'https://token.actions." in message


def test_a_discovery_document_naming_plain_http_keys_elsewhere_is_refused(
    issuer: Issuer, verifier: Verifier, key: Key
) -> None:
    issuer.jwks_uri_named = "http://keys.example.test/jwks"
    message = refused(verifier, sign(claims(issuer.url, now=NOW), key), IssuerError)
    assert "names keys at an address pgoverlay does not fetch" in message
    assert issuer.requests == ["/.well-known/openid-configuration"]


def test_the_issuer_must_be_https_except_on_this_host() -> None:
    with pytest.raises(ConfigError, match="is not an https:// address"):
        Verifier("http://token.example.test", AUDIENCE)
    assert Verifier("http://localhost:8080/", AUDIENCE).issuer == "http://localhost:8080"
    assert Verifier("https://token.actions.githubusercontent.com", AUDIENCE)


def test_no_refusal_and_no_log_line_holds_the_token(
    issuer: Issuer,
    verifier: Verifier,
    key: Key,
    other_key: Key,
    clock: Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    tokens: list[str] = [
        sign(claims(issuer.url, now=NOW - 3600), key),
        sign(claims(issuer.url, now=NOW, aud="x"), key),
        sign(claims(issuer.url, now=NOW, iss="https://x.test"), key),
        sign(claims(issuer.url, now=NOW), other_key),
        sign(claims(issuer.url, now=NOW, repository=None), key),
        sign(claims(issuer.url, now=NOW), key, kid="kid with spaces and \n a newline"),
    ]
    good = sign(claims(issuer.url, now=NOW), key)
    seen: list[str] = []
    for token in tokens:
        with pytest.raises(TokenError) as caught:
            verifier.verify(token)
        seen.append(str(caught.value))
    verifier.verify(good)
    clock.now = NOW + 120
    issuer.keys = []  # a refresh that finds no key: logged, not leaked
    with pytest.raises(TokenError):
        verifier.verify(sign(claims(issuer.url, now=NOW + 120), other_key))
    lines = [record.getMessage() for record in caplog.records] + seen
    assert any("fetched 1 signing keys" in line for line in lines)
    assert "(a key id of other characters)" in seen[-1]
    for token in [*tokens, good]:
        for part in token.split("."):
            assert all(part not in line for line in lines)


def test_identity_of_refuses_a_repository_outside_its_owner() -> None:
    bad = claims("https://x", now=NOW, repository="mallory/shop")
    with pytest.raises(TokenError, match="is not of its repository_owner 'acme'"):
        oidc.identity_of(bad)


def test_a_pull_request_target_run_names_no_pull_request_number() -> None:
    target = oidc.identity_of(
        claims("https://x", now=NOW, event_name="pull_request_target", ref="refs/heads/main")
    )
    assert target.pull_request is None
