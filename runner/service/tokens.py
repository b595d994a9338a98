"""API tokens the admin issues: a credential of its own for a caller of the network API that is
not a GitHub Actions job (the webhook listener on another host), scoped to the owners and,
optionally, the repositories it may act for.

A token is ``pgo_`` and 32 random bytes (urlsafe base64, 43 characters): printed once by
``pgoverlay api token issue``, never stored. The store (``<home>/api/tokens.json``, root's,
mode 0600, in a folder root's alone) keeps its SHA-256, its name, its scope, when it was made
and when it expires. A lookup hashes what a caller sent and finds the entry of that digest: a
token of 256 random bits needs no slow hash, and nothing about a token is learnt by timing a
lookup of its digest.

Only the engine (root) reads the store: the front door is unprivileged and asks the engine
through its socket (``LocalEngine.check_api_token``) whether a token it was sent is good for
the repository a request names. Every issue, revoke and refused use is a line of the engine's
audit log (``audit.ENGINE_LOG``), naming the token by its name, never the token.

Writes (issue, revoke) are root's CLI's: read, changed and written to a new file renamed over
the store under an exclusive ``flock`` of ``tokens.lock``, so two writers never lose one
another's change and a reader sees the old store or the new one, whole.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from pgoverlay.errors import ConfigError, TokenError
from pgoverlay.github.grammar import REPOSITORY_RE, is_login
from pgoverlay.runner import audit, safefs

PREFIX = "pgo_"
STORE = Path("api") / "tokens.json"
_LOCK = Path("api") / "tokens.lock"
_RANDOM_BYTES = 32
_TOKEN_RE = re.compile(r"^pgo_[A-Za-z0-9_-]{43}$")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
MAX_STORE_BYTES = 4 << 20
DEFAULT_EXPIRY = 90 * 86400


@dataclass(frozen=True, kw_only=True)
class StoredToken:
    """One issued token as the store keeps it: never the token, its SHA-256 (``digest``)."""

    name: str
    digest: str
    owners: tuple[str, ...]
    repositories: tuple[str, ...]  # empty: every repository of the owners
    created_at: float
    expires_at: float

    def covers(self, repository: str) -> bool:
        """Whether ``repository`` (owner/name) is in the token's scope (names compare without
        regard to case, as GitHub's do)."""
        owner = repository.partition("/")[0].lower()
        if owner not in (o.lower() for o in self.owners):
            return False
        return not self.repositories or repository.lower() in (r.lower() for r in self.repositories)

    @property
    def scope(self) -> str:
        """The scope, as a person reads it."""
        if self.repositories:
            return ", ".join(self.repositories)
        return ", ".join(f"{o}/*" for o in self.owners)


def digest_of(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def looks_like(token: str) -> bool:
    """Whether a bearer token is one of these (not a GitHub OIDC token): by its prefix."""
    return token.startswith(PREFIX)


def check_scope(*, name: str, owners: Sequence[str], repositories: Sequence[str]) -> None:
    """ConfigError saying what is wrong with a token's name or scope, and how to write it."""
    if not NAME_RE.match(name):
        raise ConfigError(
            f"{name!r} cannot name a token: use lower-case letters, digits, '.', '_' and '-' "
            "(at most 63, starting with a letter or digit), e.g. listener-ci"
        )
    if not owners:
        raise ConfigError("a token needs at least one --owner: the accounts it may act for")
    for owner in owners:
        if not is_login(owner):
            raise ConfigError(f"--owner {owner!r} is not a GitHub account name")
    listed = {o.lower() for o in owners}
    for repository in repositories:
        if not REPOSITORY_RE.match(repository):
            raise ConfigError(f"--repository {repository!r} is not OWNER/NAME (e.g. acme/shop)")
        if repository.partition("/")[0].lower() not in listed:
            raise ConfigError(
                f"--repository {repository} is not of an --owner given: add --owner "
                f"{repository.partition('/')[0]}"
            )


# -- the store --------------------------------------------------------------------------------


def _folder(home: Path) -> Path:
    return home / STORE.parent


def load(home: Path) -> list[StoredToken]:
    """Every token in the store (none when there is no store yet)."""
    path = home / STORE
    try:
        fd = safefs.open_regular(path, os.O_RDONLY, uid=0)
    except FileNotFoundError:
        return []
    try:
        raw = os.read(fd, MAX_STORE_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_STORE_BYTES:
        raise ConfigError(f"{path} is larger than {MAX_STORE_BYTES} bytes: it is not the store")
    try:
        rows = json.loads(raw)["tokens"]
        return [
            StoredToken(
                name=str(r["name"]),
                digest=str(r["digest"]),
                owners=tuple(r["owners"]),
                repositories=tuple(r["repositories"]),
                created_at=float(r["created_at"]),
                expires_at=float(r["expires_at"]),
            )
            for r in rows
        ]
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(
            f"the API token store {path} cannot be read ({type(err).__name__}: {err}): restore "
            "it from a backup, or remove it and issue the tokens again"
        ) from None


def _save(home: Path, found: list[StoredToken]) -> None:
    path = home / STORE
    text = json.dumps({"tokens": [asdict(t) for t in found]}, indent=1) + "\n"
    fresh = path.with_name(path.name + ".new")
    safefs.write_new(fresh, text, uid=0, gid=0, mode=0o600)
    os.rename(fresh, path)


@contextlib.contextmanager
def _writing(home: Path) -> Iterator[list[StoredToken]]:
    """The store's tokens, to change in place: written back when the block ends."""
    safefs.make_dir(_folder(home), uid=0, gid=0, mode=0o700, exist_ok=True)
    fd = os.open(home / _LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        found = load(home)
        yield found
        _save(home, found)
    finally:
        os.close(fd)


def issue(
    home: Path,
    *,
    name: str,
    owners: Sequence[str],
    repositories: Sequence[str] = (),
    ttl: float = DEFAULT_EXPIRY,
    by: str,
    now: float | None = None,
) -> tuple[str, StoredToken]:
    """A new token and what the store keeps of it; ConfigError when its name is taken or its
    scope is not well written. The token itself is returned once, here, and stored nowhere."""
    check_scope(name=name, owners=owners, repositories=repositories)
    at = time.time() if now is None else now
    token = PREFIX + base64.urlsafe_b64encode(secrets.token_bytes(_RANDOM_BYTES)).decode()
    token = token.rstrip("=")
    stored = StoredToken(
        name=name,
        digest=digest_of(token),
        owners=tuple(owners),
        repositories=tuple(repositories),
        created_at=at,
        expires_at=at + ttl,
    )
    with _writing(home) as found:
        if any(t.name == name for t in found):
            raise ConfigError(
                f"a token named {name} exists: revoke it first (`pgoverlay api token revoke "
                f"{name}`), or choose another name"
            )
        found.append(stored)
    audit.engine_line(
        home,
        "api_credential_issued",
        credential=name,
        owners=list(owners),
        repositories=list(repositories),
        expires_at=_iso(stored.expires_at),
        by=by,
    )
    return token, stored


def revoke(home: Path, name: str, *, by: str) -> bool:
    """Remove the token ``name`` from the store; False when there is none of that name."""
    with _writing(home) as found:
        kept = [t for t in found if t.name != name]
        gone = len(kept) != len(found)
        found[:] = kept
    if gone:
        audit.engine_line(home, "api_credential_revoked", credential=name, by=by)
    return gone


def check(home: Path, token: str, *, repository: str, now: float | None = None) -> StoredToken:
    """The stored token ``token`` is, if it is good for acting for ``repository``; TokenError
    saying why not (never holding the token), and an audit line, otherwise."""
    at = time.time() if now is None else now
    found: StoredToken | None = None
    if _TOKEN_RE.match(token):
        wanted = digest_of(token)
        found = next((t for t in load(home) if secrets.compare_digest(t.digest, wanted)), None)
    if found is None:
        reason = (
            "the API token is not one this pool issued, or it was revoked: ask the pool's admin "
            "for a new one (`pgoverlay api token issue`)"
        )
    elif found.expires_at <= at:
        reason = (
            f"the API token {found.name} expired at {_iso(found.expires_at)}: ask the pool's "
            "admin for a new one"
        )
    elif not found.covers(repository):
        reason = (
            f"the API token {found.name} may act for {found.scope}, not for {repository}: ask "
            "the pool's admin for a token whose scope holds it"
        )
    else:
        return found
    audit.engine_line(
        home,
        "api_credential_refused",
        credential=found.name if found is not None else None,
        repository=repository,
        reason=reason,
    )
    raise TokenError(reason)


def _iso(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
