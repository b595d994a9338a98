"""Refused tokens on the network API, counted per source address and claim, sans I/O.

Runners behind one NAT share one address: counted per address alone, one misconfigured
workflow (a wrong audience, a repository the policy refuses) would lock every other
repository's valid tokens out of the pool for the whole window. So a refused token counts
against its address *and* the repository it claims (an OIDC token's unverified ``repository``
claim; the repository an API token's request names): after ``failed_logins`` refusals in the
window, that pair is refused (429) before its next token is looked at, and the others behind
the address go on. A source that varies its claim to get more tries meets a ceiling of its own,
``CLAIMS_PER_SOURCE`` times as many refusals per address, after which the address is refused
whatever it claims. Guessing a token goes no faster than guessing a password: an API token has
256 random bits and an OIDC token is signed, so what the counts stop is a flood of refused
tokens (and of the engine's audit lines for them).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping

from pgoverlay.github.grammar import REPOSITORY_RE
from pgoverlay.runner.door.guard import Guard
from pgoverlay.runner.service import acting, tokens

CLAIMS_PER_SOURCE = 8  # claims of one address with a full budget each, before the address is
_MAX_PAYLOAD = 16 * 1024  # characters of a token's payload read for its claim


def claim_of(token: str, headers: Mapping[str, str]) -> str:
    """The repository a request claims to act for, unverified (it only picks the count it
    goes in): an API token's request names it in a header; an OIDC token holds it in its
    payload. '' when there is none, or it is not OWNER/NAME."""
    if tokens.looks_like(token):
        named = headers.get(acting.REPOSITORY_HEADER, "")
    else:
        named = _payload_claim(token)
    return named.lower() if REPOSITORY_RE.match(named) else ""


def _payload_claim(token: str) -> str:
    parts = token.split(".")
    if len(parts) != 3 or len(parts[1]) > _MAX_PAYLOAD:
        return ""
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError):
        return ""
    claim = payload.get("repository") if isinstance(payload, dict) else None
    return claim if isinstance(claim, str) else ""


class Refusals:
    """The network API's counts of refused tokens: per address and claim, and per address."""

    def __init__(
        self, *, failed_logins: int, failed_window: float, clock: Callable[[], float]
    ) -> None:
        self.per_claim = Guard(
            failed_logins=failed_logins, failed_window=failed_window, clock=clock
        )
        self.per_source = Guard(
            failed_logins=failed_logins * CLAIMS_PER_SOURCE,
            failed_window=failed_window,
            clock=clock,
        )

    def refused(self, source: str, claim: str) -> str | None:
        """Why a request from ``source`` claiming ``claim`` is refused before its token is
        looked at; None when it is not."""
        if self.per_source.banned(source):
            return "too many refused tokens from this address: try again later"
        if self.per_claim.banned(_key(source, claim)):
            what = f"for {claim} " if claim else "without a repository "
            return (
                f"too many refused tokens {what}from this address: try again later, once the "
                "token is fixed (its audience, its repository in the pool's policy)"
            )
        return None

    def failed(self, source: str, claim: str) -> None:
        self.per_claim.failed(_key(source, claim))
        self.per_source.failed(source)


def _key(source: str, claim: str) -> str:
    return f"{source} {claim}"  # a space is in no address and no repository name
