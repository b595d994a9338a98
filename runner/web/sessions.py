"""The branch page's sign-ins and sessions, kept in the front door's memory. No I/O, no clock of
its own (``now`` is passed in, so tests need no sleeps).

Invariants:

- A browser holds only random identifiers, each signed with the page's secret (HMAC-SHA256,
  so a forged or altered cookie is refused before any lookup). What they stand for stays here:
  a reader's GitHub login, their access per repository, a CSRF token, and the GitHub token
  of their sign-in: the engine asks GitHub with it, itself, before it grants the reader a
  credential (the door's word is not proof to the engine). It never leaves the door but to
  the engine's socket, and is forgotten with its session.
- A sign-in's ``state`` is random, single use (taken out when its browser's callback comes,
  whatever happens next), bound to the browser that started it (a random value of that
  browser's cookie, kept with the state; several sign-ins of one browser, in several tabs, may
  be under way at once) and good for ``SIGN_IN_SECONDS``.
- A session lasts ``lifetime`` seconds from its sign-in, then the reader signs in again. A new
  sign-in makes a new session (a new identifier: one planted before sign-in is useless) and
  carries over the access already checked on other repositories, each for ``lifetime`` seconds
  from its own check: a reader's access is never older than a session.
- The store is bounded: at most ``MAX_PENDING`` sign-ins and ``MAX_SESSIONS`` sessions, expired
  ones dropped first, then the oldest.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

from pgoverlay.runner.callers.oauth import Access

SIGN_IN_SECONDS = 600.0  # GitHub's own codes last ten minutes
MAX_PENDING = 10_000
MAX_SESSIONS = 10_000


def _id() -> str:
    return secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Checked:
    """A reader's access to one repository (None: refused), and when GitHub was asked."""

    access: Access | None
    at: float


@dataclass
class Session:
    id: str
    login: str
    created: float
    csrf: str
    reader_token: str = field(repr=False)  # GitHub's token of this sign-in (see the module)
    repositories: dict[str, Checked] = field(default_factory=dict)  # "owner/name" lower-cased


@dataclass(frozen=True)
class SignIn:
    """A sign-in under way: where the reader goes after it, and when it began."""

    next: str
    started: float
    browser: str  # the value of the starting browser's sign-in cookie


class Sessions:
    def __init__(self, *, secret: bytes, lifetime: float) -> None:
        if len(secret) < 32:
            raise ValueError("the page's secret must be at least 32 random bytes")
        self._secret = secret
        self.lifetime = lifetime
        self._sessions: dict[str, Session] = {}
        self._pending: dict[str, SignIn] = {}

    # -- signed values ----------------------------------------------------------------------
    def sign(self, purpose: str, value: str) -> str:
        mac = hmac.new(self._secret, f"{purpose}\0{value}".encode(), hashlib.sha256)
        return f"{value}.{mac.hexdigest()}"

    def unsign(self, purpose: str, signed: str | None) -> str | None:
        """The value of ``signed`` if this page signed it for ``purpose``, else None."""
        if not signed or "." not in signed:
            return None
        value = signed.rsplit(".", 1)[0]
        return value if hmac.compare_digest(self.sign(purpose, value), signed) else None

    # -- sign-in ----------------------------------------------------------------------------
    @staticmethod
    def new_browser() -> str:
        """A value for a browser's sign-in cookie (kept while it signs in)."""
        return _id()

    def begin(self, next_path: str, *, browser: str, now: float) -> str:
        """A new sign-in's state, for GitHub's ``state``, begun by ``browser``."""
        self._prune(now)
        state = _id()
        self._pending[state] = SignIn(next=next_path, started=now, browser=browser)
        return state

    def finish(self, state: str, *, browser: str | None, now: float) -> SignIn | None:
        """The sign-in ``state`` began, once: None when it is unknown, used, expired, or
        another browser's (then it is left to its own browser)."""
        found = self._pending.get(state)
        if found is None or not browser or not hmac.compare_digest(found.browser, browser):
            return None
        del self._pending[state]
        return found if now - found.started <= SIGN_IN_SECONDS else None

    # -- sessions ---------------------------------------------------------------------------
    def open(
        self,
        login: str,
        *,
        reader_token: str,
        repository: str,
        access: Access | None,
        now: float,
        previous: str | None,
    ) -> Session:
        """A new session for ``login``, with its access to ``repository`` just checked, and
        the access of the browser's ``previous`` session if it was ``login``'s too."""
        self._prune(now)
        carried: dict[str, Checked] = {}
        old = self._sessions.pop(previous, None) if previous else None
        if old is not None and old.login == login:
            carried = {r: c for r, c in old.repositories.items() if self._fresh(c.at, now)}
        carried[repository.lower()] = Checked(access, now)
        session = Session(
            id=_id(),
            login=login,
            created=now,
            csrf=_id(),
            reader_token=reader_token,
            repositories=carried,
        )
        self._sessions[session.id] = session
        return session

    def get(self, session_id: str | None, *, now: float) -> Session | None:
        """The live session ``session_id`` (expired ones are forgotten)."""
        found = self._sessions.get(session_id or "")
        if found is None:
            return None
        if not self._fresh(found.created, now):
            del self._sessions[found.id]
            return None
        return found

    def checked(self, session: Session, repository: str, *, now: float) -> Checked | None:
        """The session's access to ``repository``, if checked within a session's lifetime."""
        found = session.repositories.get(repository.lower())
        return found if found is not None and self._fresh(found.at, now) else None

    def end(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def _fresh(self, since: float, now: float) -> bool:
        return now - since < self.lifetime

    def _prune(self, now: float) -> None:
        for state in [s for s, p in self._pending.items() if now - p.started > SIGN_IN_SECONDS]:
            del self._pending[state]
        for sid in [s for s, v in self._sessions.items() if not self._fresh(v.created, now)]:
            del self._sessions[sid]
        while len(self._pending) >= MAX_PENDING:  # dicts keep insertion order: oldest first
            del self._pending[next(iter(self._pending))]
        while len(self._sessions) >= MAX_SESSIONS:
            del self._sessions[next(iter(self._sessions))]
