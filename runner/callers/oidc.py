"""Who is calling the network API: a GitHub Actions OIDC token, verified, as an :class:`Identity`.

A job with ``permissions: id-token: write`` asks GitHub for a token whose audience is the
pool's URL, and sends it. GitHub signs it (RS256) with a key it publishes at its issuer
(``https://token.actions.githubusercontent.com``; a GitHub Enterprise Server's is
``https://HOST/_services/token``): the issuer's discovery document
(``{issuer}/.well-known/openid-configuration``) names the key set (``jwks_uri``), and the
token's header names its key (``kid``). :class:`Verifier` checks, in this order:

1. size: a token over 16 KiB is refused before it is parsed (GitHub's are about 1 KiB);
2. the header: ``alg`` must be RS256 (never ``none``, never an HMAC, whose "secret" an attacker
   would take from the public key), and ``kid`` one of the issuer's keys: an unknown key id
   fetches the key set again (GitHub rotates keys), at most once per minute, so a flood of
   made-up ids costs the issuer one request a minute, not one per token; a key whose own
   ``alg`` is another algorithm, or which is not an RSA signing key, is refused;
3. the signature, by PyJWT with that key (``jwt.PyJWK``), RS256 alone allowed;
4. the claims, from the signed payload only: ``iss`` equals the issuer, ``aud`` (a string or a
   list) holds the audience, and ``exp``, ``nbf`` and ``iat`` fit the clock with ``leeway``
   seconds either way. These are checked here rather than by PyJWT so that the clock is
   injectable and a refusal says by how much ("expired 75 s ago");
5. the claims pgoverlay reads (:class:`Identity`), each present and of its type.

Every refusal is a :class:`~pgoverlay.errors.TokenError` whose message says what is wrong and
never holds the token (nor any part of it but a key id of plain characters); a token never
reaches a log line. An issuer that cannot be reached, or answers something that is not OIDC, is
an :class:`~pgoverlay.errors.IssuerError` (a TokenError that may pass).

Blocking calls (the standard library's ``urllib``, a timeout on each, no redirect followed):
the network API runs :meth:`Verifier.verify` in a thread. It is thread-safe: one lock guards
the key cache, so simultaneous tokens with one unknown key make one fetch.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.client import HTTPResponse
from typing import Any
from urllib.parse import urlsplit

import jwt

from pgoverlay.errors import ConfigError, IssuerError, TokenError

log = logging.getLogger(__name__)

ALGORITHM = "RS256"  # what GitHub signs with, and the one algorithm accepted
MAX_TOKEN_BYTES = 16 * 1024
REFRESH_EVERY = 60.0  # seconds: at most one fetch of the key set per minute once keys are known
RETRY_EVERY = 5.0  # seconds between attempts while no key set was ever fetched
MAX_KEY_AGE = 3600.0  # seconds: a key set older than this is fetched again before use
_JSON_BYTES = 1 << 20  # the most read of one answer
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_PLAIN_KID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
# The claims an Identity needs, and their GitHub names; ids arrive as decimal strings.
_TEXT_CLAIMS = (
    "repository",
    "repository_owner",
    "event_name",
    "job_workflow_ref",
    "runner_environment",
    "actor",
    "sub",
)
_ID_CLAIMS = ("repository_id", "repository_owner_id")
_OPTIONAL_TEXT = ("ref", "head_ref", "base_ref", "repository_visibility")
_PULL_REF = re.compile(r"^refs/pull/([0-9]{1,10})/(?:merge|head)$")


@dataclass(frozen=True, kw_only=True)
class Identity:
    """What GitHub vouches for about the job that sent a verified token.

    The repository is the one the workflow runs in: for a pull request (``pull_request`` or
    ``pull_request_target``), the *base* repository, also when the pull request comes from a
    fork (no claim names the head repository). ``repository_id`` and ``repository_owner_id``
    stay the same through a rename and differ for a re-created repository of the same name:
    an owner of branches is told by them. ``ref``, ``head_ref`` and ``base_ref`` are empty
    where GitHub sends them empty (``head_ref`` and ``base_ref`` outside pull requests).
    """

    repository: str  # owner/name
    repository_id: int
    repository_owner: str
    repository_owner_id: int
    event_name: str
    ref: str
    head_ref: str
    base_ref: str
    job_workflow_ref: str  # owner/repo/.github/workflows/file.yml@ref
    runner_environment: str  # github-hosted or self-hosted
    repository_visibility: str  # public, private or internal; empty if the issuer sends none
    actor: str
    sub: str

    @property
    def pull_request(self) -> int | None:
        """The pull request's number, for a ``pull_request`` run (its ref is
        ``refs/pull/N/merge``); None otherwise (a ``pull_request_target`` run's ref is the base
        branch)."""
        found = _PULL_REF.match(self.ref)
        return int(found.group(1)) if found else None


def identity_of(claims: Mapping[str, Any]) -> Identity:
    """The identity in verified ``claims``; TokenError naming the first claim missing or not
    of its form."""
    text: dict[str, str] = {}
    for name in _TEXT_CLAIMS:
        value = claims.get(name)
        if not isinstance(value, str) or not value:
            raise TokenError(_missing(name, value))
        text[name] = value
    ids: dict[str, int] = {}
    for name in _ID_CLAIMS:
        value = claims.get(name)
        # GitHub sends ids as decimal strings; an integer is accepted too
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            ids[name] = value
        elif isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 20:
            ids[name] = int(value)
        else:
            raise TokenError(_missing(name, value, form="a positive integer"))
    optional: dict[str, str] = {}
    for name in _OPTIONAL_TEXT:
        value = claims.get(name, "")
        if value is None:
            value = ""
        if not isinstance(value, str):
            raise TokenError(f"the token's {name} claim is not text")
        optional[name] = value
    owner, slash, _ = text["repository"].partition("/")
    if not slash or owner.lower() != text["repository_owner"].lower():
        raise TokenError(
            f"the token's repository {_shown(text['repository'])} is not of its "
            f"repository_owner {_shown(text['repository_owner'])}: GitHub never sends that"
        )
    return Identity(
        repository=text["repository"],
        repository_id=ids["repository_id"],
        repository_owner=text["repository_owner"],
        repository_owner_id=ids["repository_owner_id"],
        event_name=text["event_name"],
        ref=optional["ref"],
        head_ref=optional["head_ref"],
        base_ref=optional["base_ref"],
        job_workflow_ref=text["job_workflow_ref"],
        runner_environment=text["runner_environment"],
        repository_visibility=optional["repository_visibility"],
        actor=text["actor"],
        sub=text["sub"],
    )


def _missing(name: str, value: object, *, form: str = "text") -> str:
    absent = value is None or value == ""
    problem = f"the token has no {name} claim" if absent else f"the token's {name} is not {form}"
    return (
        f"{problem}; a GitHub Actions OIDC token always carries it: is it a token of GitHub "
        "Actions (core.getIDToken), and the issuer GitHub's?"
    )


def _shown(value: object, *, limit: int = 100) -> str:
    """A claim's value for a message: signed by the issuer, but shortened and quoted."""
    text = value if isinstance(value, str) else json.dumps(value)
    return repr(text if len(text) <= limit else text[:limit] + "...")


def check_issuer_url(url: str, *, what: str = "the OIDC issuer") -> str:
    """``url`` without a trailing slash, if it is https (or http on this host, for tests)."""
    parts = urlsplit(url)
    loopback = parts.scheme == "http" and parts.hostname in _LOOPBACK
    if not (parts.scheme == "https" or loopback) or not parts.netloc or parts.query:
        raise ConfigError(
            f"{what} {url!r} is not an https:// address (http:// only on 127.0.0.1 or "
            "localhost): GitHub's is https://token.actions.githubusercontent.com, a GitHub "
            "Enterprise Server's https://HOST/_services/token"
        )
    return url.rstrip("/")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are answers, not followed: the keys come from the address the issuer names."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


@dataclass(frozen=True)
class _Keys:
    """The issuer's RSA signing keys by key id, and when they were fetched."""

    by_kid: Mapping[str, jwt.PyJWK]
    refused: Mapping[str, str]  # key id -> why the key cannot verify RS256
    fetched_at: float


class Verifier:
    """Verifies GitHub Actions OIDC tokens of one issuer, for one audience."""

    def __init__(
        self,
        issuer: str,
        audience: str,
        *,
        clock: Callable[[], float] = time.time,
        leeway: float = 60,
        http_timeout: float = 5,
    ) -> None:
        self.issuer = check_issuer_url(issuer)
        if not audience:
            raise ConfigError("the OIDC audience is empty: set it to the pool's URL")
        self.audience = audience
        self.clock = clock
        self.leeway = leeway
        self.http_timeout = http_timeout
        self._lock = threading.Lock()
        self._keys: _Keys | None = None
        self._jwks_uri: str | None = None
        self._last_attempt: float | None = None

    def __repr__(self) -> str:
        return f"Verifier(issuer={self.issuer!r}, audience={self.audience!r})"

    def fetch_keys(self) -> tuple[int, int]:
        """Fetch the issuer's discovery document and key set now (``doctor``): how many keys
        can verify tokens and how many cannot; IssuerError saying what is wrong."""
        with self._lock:
            keys = self._fetch(self.clock())
        return len(keys.by_kid), len(keys.refused)

    # -- the token --------------------------------------------------------------------------

    def verify(self, token: str) -> Identity:
        """The identity in ``token``, or a TokenError saying why it is refused."""
        size = len(token.encode("utf-8", "replace"))
        if size > MAX_TOKEN_BYTES:
            raise TokenError(
                f"the token is {size} bytes, over the {MAX_TOKEN_BYTES} accepted (a GitHub "
                "Actions OIDC token is about 1 KiB): send the token alone"
            )
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise TokenError(
                "the token is not a JWT (three base64url parts, the first a JSON header): "
                "send the value core.getIDToken returns, without a prefix"
            ) from None
        alg = header.get("alg")
        if alg != ALGORITHM:
            named = _shown(alg, limit=20) if isinstance(alg, str) else "no algorithm"
            raise TokenError(
                f"the token's header names {named}; only {ALGORITHM} is accepted, which is "
                "what GitHub signs with"
            )
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise TokenError("the token's header names no key (kid): GitHub's always does")
        key = self._key(kid)
        try:
            claims = jwt.decode(
                token,
                key=key,
                algorithms=[ALGORITHM],
                options={
                    "verify_signature": True,
                    "verify_exp": False,
                    "verify_nbf": False,
                    "verify_iat": False,
                    "verify_aud": False,
                    "verify_iss": False,
                    "verify_sub": False,
                    "verify_jti": False,
                    "enforce_minimum_key_length": True,
                },
            )
        except jwt.InvalidSignatureError:
            raise TokenError(
                f"the token's signature does not match its key {_kid(kid)}: it was altered "
                "after signing, or signed by someone else"
            ) from None
        except jwt.PyJWTError as err:  # never PyJWT's message: it may quote the input
            raise TokenError(
                f"the token cannot be verified with its key {_kid(kid)} "
                f"({type(err).__name__}): it is not a JWT as GitHub signs it"
            ) from None
        self._check_claims(claims)
        return identity_of(claims)

    def _check_claims(self, claims: Mapping[str, Any]) -> None:
        iss = claims.get("iss")
        if iss != self.issuer:
            raise TokenError(
                f"the token's issuer is {_shown(iss)}, expected {self.issuer!r}: it was issued "
                "for another GitHub (or none)"
            )
        aud = claims.get("aud")
        audiences = aud if isinstance(aud, list) else [aud]
        if self.audience not in audiences:
            raise TokenError(
                f"the token's audience is {_shown(aud)}, expected {self.audience!r}: ask for "
                "it with core.getIDToken(audience) set to the pool's URL"
            )
        now = self.clock()
        times: dict[str, float] = {}
        for name in ("exp", "iat", "nbf"):
            value = claims.get(name)
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise TokenError(f"the token has no {name} claim as a number of seconds")
            times[name] = float(value)
        late = now - times["exp"]
        if late >= self.leeway:
            raise TokenError(
                f"the token expired {late:.0f} s ago (allowed: {self.leeway:.0f} s of clock "
                "skew): get a new one just before the call; check this host's clock"
            )
        early = times["nbf"] - now
        if early > self.leeway:
            raise TokenError(
                f"the token is not valid for another {early:.0f} s (not before), beyond the "
                f"{self.leeway:.0f} s of clock skew allowed: check this host's clock"
            )
        ahead = times["iat"] - now
        if ahead > self.leeway:
            raise TokenError(
                f"the token was issued {ahead:.0f} s in the future, beyond the "
                f"{self.leeway:.0f} s of clock skew allowed: check this host's clock"
            )

    # -- the issuer's keys ------------------------------------------------------------------

    def _key(self, kid: str) -> jwt.PyJWK:
        """The issuer's key ``kid``, fetching the key set when it is unknown, stale or never
        fetched, within the refresh limits."""
        with self._lock:
            keys = self._keys
            now = self.clock()
            stale = keys is None or now - keys.fetched_at >= MAX_KEY_AGE
            unknown = keys is None or (kid not in keys.by_kid and kid not in keys.refused)
            if (stale or unknown) and self._may_fetch(now):
                try:
                    keys = self._fetch(now)
                except IssuerError:
                    if keys is None:
                        raise
                    # stale or unknown-kid refresh failed: the keys known stay in use
                    log.warning("cannot fetch the keys of %s again", self.issuer, exc_info=True)
            if keys is None:
                raise IssuerError(
                    f"the keys of the OIDC issuer {self.issuer} could not be fetched (the last "
                    f"attempt, under {RETRY_EVERY:.0f} s ago, failed): retry shortly; check "
                    "the issuer's address and this host's network"
                )
        if kid in keys.refused:
            raise TokenError(
                f"the token's header names {ALGORITHM} but its key {_kid(kid)} "
                f"{keys.refused[kid]}: refused"
            )
        found = keys.by_kid.get(kid)
        if found is None:
            raise TokenError(
                f"the token is signed by an unknown key {_kid(kid)}: {self.issuer} does not "
                "publish it (keys are fetched again at most once a minute); is the token "
                "GitHub's?"
            )
        return found

    def _may_fetch(self, now: float) -> bool:
        if self._last_attempt is None:
            return True
        wait = RETRY_EVERY if self._keys is None else REFRESH_EVERY
        return now - self._last_attempt >= wait

    def _fetch(self, now: float) -> _Keys:
        """Discovery (once it succeeded, kept), then the key set; the attempt counts against
        the refresh limit whether it succeeds or not."""
        self._last_attempt = now
        if self._jwks_uri is None:
            discovery = self._get_json(f"{self.issuer}/.well-known/openid-configuration")
            named = discovery.get("issuer")
            if named != self.issuer:
                raise IssuerError(
                    f"the OIDC issuer {self.issuer}'s discovery document names the issuer "
                    f"{_shown(named)}: the address is not that issuer's; set the issuer to "
                    "the address its discovery document names"
                )
            uri = discovery.get("jwks_uri")
            if not isinstance(uri, str):
                raise IssuerError(
                    f"the OIDC issuer {self.issuer}'s discovery document has no jwks_uri"
                )
            try:
                self._jwks_uri = check_issuer_url(uri, what="its jwks_uri")
            except ConfigError as err:
                raise IssuerError(
                    f"the OIDC issuer {self.issuer}'s discovery document names keys at an "
                    f"address pgoverlay does not fetch: {err}"
                ) from None
        keys = self._parse_keys(self._get_json(self._jwks_uri), fetched_at=now)
        log.info(
            "fetched %d signing keys of %s (%d unusable)",
            len(keys.by_kid),
            self.issuer,
            len(keys.refused),
        )
        self._keys = keys
        return keys

    def _parse_keys(self, jwks: Mapping[str, Any], *, fetched_at: float) -> _Keys:
        entries = jwks.get("keys")
        if not isinstance(entries, list):
            raise IssuerError(f"the key set of {self.issuer} ({self._jwks_uri}) has no keys list")
        by_kid: dict[str, jwt.PyJWK] = {}
        refused: dict[str, str] = {}
        for entry in entries:
            if not isinstance(entry, dict) or not isinstance(entry.get("kid"), str):
                continue  # a key no token can name
            kid = entry["kid"]
            why = _unfit(entry)
            if why:
                refused[kid] = why
                continue
            try:
                by_kid[kid] = jwt.PyJWK(entry, algorithm=ALGORITHM)
            except jwt.PyJWTError:
                refused[kid] = "is not a valid RSA key"
        return _Keys(by_kid=by_kid, refused=refused, fetched_at=fetched_at)

    def _get_json(self, url: str) -> dict[str, Any]:
        # the address was checked to be https (or loopback http) by check_issuer_url (S310)
        request = urllib.request.Request(url, method="GET")  # noqa: S310
        request.add_header("Accept", "application/json")
        request.add_header("User-Agent", "pgoverlay")
        try:
            response: HTTPResponse = _OPENER.open(request, timeout=self.http_timeout)
        except urllib.error.HTTPError as err:
            err.close()
            raise IssuerError(
                f"the OIDC issuer answered {err.code} for {url}: check the issuer's address "
                "(GitHub's is https://token.actions.githubusercontent.com)"
            ) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise IssuerError(
                f"cannot reach the OIDC issuer at {urlsplit(url).netloc} ({reason}) to fetch "
                f"{url}: check the issuer's address and this host's network"
            ) from None
        with response:
            if not 200 <= response.status < 300:
                raise IssuerError(
                    f"the OIDC issuer answered {response.status} for {url} (a redirect is not "
                    "followed): set the issuer to the address that answers"
                )
            raw = response.read(_JSON_BYTES + 1)
        if len(raw) > _JSON_BYTES:
            raise IssuerError(f"the OIDC issuer's answer for {url} is over {_JSON_BYTES} bytes")
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise IssuerError(f"the OIDC issuer's answer for {url} is not a JSON object")
        return body


def _unfit(jwk: Mapping[str, Any]) -> str:
    """Why the JWK ``jwk`` cannot verify an RS256 signature ('' if it can)."""
    if jwk.get("kty") != "RSA":
        return f"is of type {_shown(jwk.get('kty'), limit=10)}, not an RSA key"
    if "alg" in jwk and jwk["alg"] != ALGORITHM:
        return f"allows only {_shown(jwk['alg'], limit=10)}"
    if "use" in jwk and jwk["use"] != "sig":
        return f"is for {_shown(jwk['use'], limit=10)}, not for signatures"
    ops = jwk.get("key_ops")
    if isinstance(ops, list) and "verify" not in ops:
        return "does not allow verify among its key_ops"
    return ""


def _kid(kid: str) -> str:
    """A key id for a message: shown when it is plain characters (GitHub's are), else not
    (it is the caller's text)."""
    return repr(kid) if _PLAIN_KID.match(kid) else "(a key id of other characters)"
