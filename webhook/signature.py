"""GitHub's ``X-Hub-Signature-256`` header: sign and verify, pure functions on bytes.

GitHub sends ``sha256=`` followed by the lowercase hex HMAC-SHA256 of the exact request body,
keyed with the webhook secret as UTF-8. Verification is strict: the header must be exactly what
:func:`sign` would produce. Uppercase hex, surrounding whitespace, the legacy ``sha1=`` header,
a truncated digest or a missing header all fail, and an empty secret verifies nothing (an empty
key would let anyone sign). Call :func:`verify` on the raw bytes before parsing any JSON.
"""

from __future__ import annotations

import hashlib
import hmac

HEADER = "X-Hub-Signature-256"
PREFIX = "sha256="


def sign(secret: str, body: bytes) -> str:
    """The header value GitHub would send for ``body``: ``"sha256=<64 lowercase hex>"``."""
    digest = hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()
    return PREFIX + digest


def verify(secret: str, body: bytes, header: str | None) -> bool:
    """True only if ``header`` is exactly ``sign(secret, body)``; compared in constant time."""
    if not secret or header is None or not header.isascii():
        return False
    expected = sign(secret, body).encode("ascii")
    # compare_digest's running time depends on the lengths only, which are public.
    return hmac.compare_digest(header.encode("ascii"), expected)
