"""X-Hub-Signature-256: GitHub's documented vector, and everything that must not verify."""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import pytest

from pgoverlay.webhook.signature import PREFIX, sign, verify

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "github"
SECRET = "correct horse battery staple"


def _vectors() -> list[dict[str, Any]]:
    data = json.loads((FIXTURES / "signature_vectors.json").read_text())
    vectors: list[dict[str, Any]] = data["vectors"]
    assert vectors, "the fixture file holds no vectors"
    return vectors


def _pull_request_body() -> bytes:
    """A real pull_request payload as GitHub sends it: compact JSON, no trailing newline."""
    payload = json.loads((FIXTURES / "webhooks/pull_request.opened.json").read_text())
    return json.dumps(payload, separators=(",", ":")).encode("utf-8")


@pytest.mark.parametrize("vector", _vectors(), ids=lambda v: str(v["id"]))
def test_githubs_documented_vector_signs_and_verifies(vector: dict[str, Any]) -> None:
    body = vector["payload"].encode("utf-8")
    assert sign(vector["secret"], body) == vector["x_hub_signature_256"]
    assert sign(vector["secret"], body) == PREFIX + vector["signature_hex"]
    assert verify(vector["secret"], body, vector["x_hub_signature_256"]) is vector["expected_valid"]


def test_documented_vector_fails_under_another_secret() -> None:
    vector = _vectors()[0]
    assert not verify("not the secret", vector["payload"].encode(), vector["x_hub_signature_256"])


def test_sign_matches_an_independent_hmac_of_a_real_payload() -> None:
    body = _pull_request_body()
    expected = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert sign(SECRET, body) == "sha256=" + expected
    assert verify(SECRET, body, sign(SECRET, body))


def test_reserialised_json_does_not_verify_only_the_exact_bytes_do() -> None:
    body = _pull_request_body()
    header = sign(SECRET, body)
    pretty = json.dumps(json.loads(body), indent=2).encode()
    assert json.loads(pretty) == json.loads(body)
    assert not verify(SECRET, pretty, header)
    assert not verify(SECRET, body + b"\n", header)


def test_non_ascii_secret_is_keyed_as_utf8() -> None:
    secret = "clé-secrète-🔑"
    body = b'{"action":"opened"}'
    assert (
        sign(secret, body)
        == "sha256=" + hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()
    )
    assert verify(secret, body, sign(secret, body))


def test_empty_body_is_signed_like_any_other() -> None:
    assert verify(SECRET, b"", sign(SECRET, b""))
    assert not verify(SECRET, b"", sign(SECRET, b" "))


@pytest.mark.parametrize("position", [0, 1, 500, -1])
def test_one_flipped_byte_in_the_body_fails(position: int) -> None:
    body = bytearray(_pull_request_body())
    header = sign(SECRET, bytes(body))
    body[position] ^= 0x01
    assert not verify(SECRET, bytes(body), header)


def test_one_flipped_hex_digit_in_the_header_fails() -> None:
    body = _pull_request_body()
    header = sign(SECRET, body)
    for i in (len(PREFIX), len(header) - 1):
        digit = "0" if header[i] != "0" else "1"
        assert not verify(SECRET, body, header[:i] + digit + header[i + 1 :])


def test_truncated_body_fails() -> None:
    body = _pull_request_body()
    header = sign(SECRET, body)
    assert not verify(SECRET, body[:-1], header)
    assert not verify(SECRET, body[: len(body) // 2], header)
    assert not verify(SECRET, b"", header)


def test_truncated_or_extended_header_fails() -> None:
    body = b"payload"
    header = sign(SECRET, body)
    assert not verify(SECRET, body, header[:-1])
    assert not verify(SECRET, body, header[:-2])
    assert not verify(SECRET, body, header + "0")
    assert not verify(SECRET, body, PREFIX)
    assert not verify(SECRET, body, "")


@pytest.mark.parametrize(
    "mangle",
    [
        lambda h: " " + h,
        lambda h: h + " ",
        lambda h: h + "\n",
        lambda h: h.replace("=", " = ", 1),
        lambda h: "\t" + h + "\r\n",
    ],
    ids=[
        "leading-space",
        "trailing-space",
        "trailing-newline",
        "spaces-around-equals",
        "tabs-crlf",
    ],
)
def test_extra_whitespace_is_refused(mangle: Any) -> None:
    body = b"payload"
    assert not verify(SECRET, body, mangle(sign(SECRET, body)))


def test_uppercase_hex_is_refused_because_github_sends_lowercase() -> None:
    body = b"payload"
    header = sign(SECRET, body)
    digest = header[len(PREFIX) :]
    assert digest == digest.lower() and digest != digest.upper()
    assert not verify(SECRET, body, PREFIX + digest.upper())
    assert not verify(SECRET, body, header.upper())


@pytest.mark.parametrize("prefix", ["SHA256=", "sha-256=", "sha512=", "", "sha256:", "sha256=="])
def test_wrong_prefix_is_refused(prefix: str) -> None:
    body = b"payload"
    digest = sign(SECRET, body)[len(PREFIX) :]
    assert not verify(SECRET, body, prefix + digest)


def test_legacy_sha1_header_is_refused_even_when_correct() -> None:
    body = _pull_request_body()
    sha1 = "sha1=" + hmac.new(SECRET.encode(), body, hashlib.sha1).hexdigest()
    assert not verify(SECRET, body, sha1)


def test_non_hex_digest_of_the_right_length_is_refused() -> None:
    body = b"payload"
    assert not verify(SECRET, body, PREFIX + "g" * 64)
    assert not verify(SECRET, body, PREFIX + "z" * 64)


def test_non_ascii_header_is_refused_without_raising() -> None:
    body = b"payload"
    header = sign(SECRET, body)
    assert not verify(SECRET, body, header[:-1] + "é")
    assert not verify(SECRET, body, "sha256=" + "٣" * 64)  # Arabic-Indic digit three


def test_missing_header_is_refused() -> None:
    assert not verify(SECRET, b"payload", None)


def test_empty_secret_verifies_nothing() -> None:
    body = b"payload"
    assert not verify("", body, sign("", body))
