"""GitHub App auth for the listener: installation tokens minted through PyGithub, one client
per installation, comments written as the app's bot."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from pydantic import ValidationError

from fakegithub import FakeGitHub
from pgoverlay.errors import PgoverlayError
from pgoverlay.webhook.clients import GitHubClients
from pgoverlay.webhook.settings import WebhookSettings


def private_key() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


@pytest.fixture()
def fake() -> Iterator[FakeGitHub]:
    with FakeGitHub() as github:
        github.add_app(4242, "pgoverlay")
        github.add_pull("acme/shop", 3, "a" * 40, "b" * 40)
        yield github
        assert github.violations == []


def test_an_installation_token_is_minted_once_and_comments_come_from_the_app(
    fake: FakeGitHub,
) -> None:
    settings = WebhookSettings(
        secret="s",
        app_id=4242,
        private_key=private_key(),
        api_url=fake.url,
        repositories={"acme/shop": {}},
    )
    clients = GitHubClients(settings)
    with pytest.raises(PgoverlayError, match="no GitHub App installation known"):
        clients.for_repo("acme/shop")
    clients.remember("acme/shop", 77)
    first = clients.for_repo("acme/shop")
    assert clients.for_repo("ACME/shop") is first
    first.upsert_comment("acme/shop", 3, "hello", lambda body: False)
    first.upsert_comment("acme/shop", 3, "again", lambda body: False)
    mints = [r for r in fake.requests if r["path"].endswith("/access_tokens")]
    assert len(mints) == 1 and mints[0]["path"] == "/app/installations/77/access_tokens"
    authors = {c["login"] for c in fake.state.comments}
    assert authors == {"pgoverlay[bot]"}
    clients.close()


def test_the_listener_refuses_to_start_without_a_secret_or_credentials() -> None:
    with pytest.raises(ValidationError, match="secret"):
        WebhookSettings(token="t")
    with pytest.raises(ValidationError, match="webhook secret is empty"):
        WebhookSettings(secret="", token="t")
    with pytest.raises(ValidationError, match="token"):
        WebhookSettings(secret="s")
    with pytest.raises(ValidationError, match="private_key"):
        WebhookSettings(secret="s", app_id=1)
    with pytest.raises(ValidationError, match="owner/name"):
        WebhookSettings(secret="s", token="t", repositories={"shop": {}})
