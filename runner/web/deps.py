"""What the web application's routes share, as FastAPI dependencies: the branch pages' state
and the signed-in reader (``Pages``, ``Reader``), and the network API caller's engine, for the
repository its verified and admitted credential names (``Engine``).

The apps (``page.create_page``, ``api.create_api``) put what a route needs in ``app.state``
when they are made; a route asks for it by its annotation, as the FastAPI template's
``deps.py`` does, and holds no closure of its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Protocol
from urllib.parse import parse_qsl, quote

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from starlette.concurrency import run_in_threadpool

from pgoverlay import errors
from pgoverlay.runner.callers import oauth
from pgoverlay.runner.callers.oidc import Identity, Verifier
from pgoverlay.runner.callers.policy import Policy
from pgoverlay.runner.door.guard import client_of
from pgoverlay.runner.door.refusals import Refusals, claim_of
from pgoverlay.runner.names import NAME_RE
from pgoverlay.runner.service import acting, models, tokens, vouch
from pgoverlay.runner.service.client import RemoteEngine
from pgoverlay.runner.service.models import CredentialCheck
from pgoverlay.runner.service.views import BaseView, BranchView
from pgoverlay.runner.service.vouch import Vouched
from pgoverlay.runner.settings import Settings
from pgoverlay.runner.web import render
from pgoverlay.runner.web.sessions import Session, Sessions

SESSION_COOKIE = "__Host-pgoverlay"
STATE_COOKIE = "__Host-pgoverlay-signin"

# -- the branch pages ---------------------------------------------------------------------------


class GrantAnswer(Protocol):
    """What the page reads of the engine's answer to a grant (``GrantView``)."""

    @property
    def login(self) -> str | None: ...
    @property
    def role(self) -> str: ...
    @property
    def read_only(self) -> bool: ...
    @property
    def expires_at(self) -> float: ...
    @property
    def password(self) -> str | None: ...
    @property
    def dsn_host(self) -> str: ...
    @property
    def dsn_port(self) -> int: ...
    @property
    def database(self) -> str: ...


class PageEngine(Protocol):
    """The engine as the page uses it (blocking calls; ``Engine`` and its client have them)."""

    def branch(self, name: str, *, layer: bool = False) -> BranchView | None: ...
    def bases(self) -> list[BaseView]: ...
    def grant(
        self, name: str, request: models.GrantRequest, *, reader: str | None = None
    ) -> GrantAnswer: ...


@dataclass(frozen=True, kw_only=True)
class PageState:
    """What the branch pages' routes share, made once by ``page.create_page``."""

    settings: Settings
    engine: PageEngine
    github: oauth.GitHubSignIn
    sessions: Sessions
    origin: str  # https://HOST[:PORT], where readers reach the page
    fingerprint: str | None  # the door's own certificate's, when self-signed
    certificate: str | None  # that certificate (PEM), offered for download
    clock: Callable[[], float] = time.time
    audit: Callable[..., None] | None = None

    @property
    def callback(self) -> str:
        return f"{self.origin}/oauth/callback"

    @property
    def lifetime(self) -> int:
        return int(self.settings.page.session_seconds)

    def session_of(self, request: Request) -> Session | None:
        sid = self.sessions.unsign("session", request.cookies.get(SESSION_COOKIE))
        return self.sessions.get(sid, now=self.clock())

    def audited(self, request: Request, event: str, **fields: object) -> None:
        if self.audit is not None:
            source = request.client.host if request.client else ""
            self.audit(event, source=source, **fields)

    async def readable(
        self, name: str, session: Session, *, layer: bool = False
    ) -> tuple[BranchView | None, oauth.Access | None, bool]:
        """The branch, the reader's access to it, and whether that access must be checked
        again (a sign-in) first. With ``layer``, its writable layer measured too, once the
        reader is known to have access: the engine walks the layer as root, which a reader
        without access must not be able to make it do."""
        if not NAME_RE.fullmatch(name):
            return None, None, False
        view = await run_in_threadpool(self.engine.branch, name)
        key = view.repository if view is not None and view.repository else unknown_key(name)
        checked = self.sessions.checked(session, key, now=self.clock())
        if checked is None:
            return view, None, True
        if layer and view is not None and checked.access is not None:
            view = await run_in_threadpool(self.engine.branch, name, layer=True)
        return view, checked.access, False


def _pages(request: Request) -> PageState:
    state: PageState = request.app.state.pages
    return state


def _reader(request: Request) -> Session | None:
    return _pages(request).session_of(request)


Pages = Annotated[PageState, Depends(_pages)]
Reader = Annotated[Session | None, Depends(_reader)]  # None: not signed in


def unknown_key(name: str) -> str:
    """What a session records for a branch that did not exist when its reader signed in: a
    refusal, so that the next visit is a 404 as a refused reader's is, not another sign-in
    (which would tell a branch that exists from one that does not). No repository name has a
    colon."""
    return f"branch:{name}"


def branch_path(name: str) -> str:
    return f"/b/{quote(name)}"


def to_sign_in(name: str) -> RedirectResponse:
    return RedirectResponse(f"/signin?next={quote(branch_path(name), safe='')}", 303)


def message(request: Request, title: str, text: str, status: int, **kw: Any) -> HTMLResponse:
    """A page that says ``text`` (with the response's nonce), answered with ``status``."""
    body = render.message_page(title, text, nonce=request.state.nonce, **kw)
    return HTMLResponse(body, status_code=status)


def not_found(request: Request) -> HTMLResponse:
    """The one answer for a branch that does not exist and one the reader may not see (with
    who is signed in, and a way out: the same for both)."""
    session = _reader(request)
    answer = message(
        request,
        "Not found",
        "There is no branch by this name that you can see. If you expected one, check the "
        "link, or ask for access to its repository on GitHub"
        + (" (or sign out, and in as another GitHub user)." if session else "."),
        404,
        who=(session.login, session.csrf) if session else None,
    )
    if session is not None:  # its sign-out form's POST must carry an Origin
        answer.headers["Referrer-Policy"] = "same-origin"
    return answer


# -- the network API ----------------------------------------------------------------------------

# The engine, reached with the caller's credential (an OIDC token, or an API token and the
# repository its listener names), which the engine verifies itself: a RemoteEngine on the socket.
EngineFor = Callable[[str, "acting.Acting | None"], RemoteEngine]


def bearer(header: str | None) -> str:
    """The token in an ``Authorization`` header's value; TokenError saying what is wrong."""
    if header is None:
        raise errors.TokenError(
            "no token: send the job's GitHub Actions OIDC token as `Authorization: Bearer "
            "TOKEN` (permissions: id-token: write; its audience the pool's URL), or the API "
            "token the pool's admin issued (pgo_...)"
        )
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise errors.TokenError(
            "the Authorization header is not `Bearer TOKEN`: send the token that way"
        )
    return token.strip()


def vouched_for(identity: Identity, policy: Policy) -> Vouched:
    """What the door vouches for ``identity``'s job if the policy admits it; PolicyError
    naming the rule and the fix otherwise (the engine asks the same of the token again)."""
    return vouch.admitted(
        identity.repository,
        identity.repository_id,
        policy.admit(identity),
        who="job",
        pull_request=identity.pull_request,
    )


def _listener_vouched(request: Request, token: str) -> tuple[Vouched, acting.Acting]:
    """What the door vouches for a request with an API token, and the repository it names, if
    the engine says the token is good for it and the policy admits it. The forks rule is asked
    on a create alone: it refuses a fork its new branch, never the end of one."""
    create = getattr(request.scope.get("route"), "name", None) == "create"
    named = acting.parse(request.headers, create=create)
    door: RemoteEngine = request.app.state.door
    checked = door.check_credential(CredentialCheck(secret=token, repository=named.repository))
    request.state.repository = (
        f"{named.repository} (id {named.repository_id}) with the API token {checked.name}"
    )
    policy: Policy = request.app.state.policy
    decision = policy.admit_listener(
        repository=named.repository,
        repository_id=named.repository_id,
        owner_id=named.owner_id,
        from_fork=named.from_fork,
    )
    vouched = vouch.admitted(
        named.repository,
        named.repository_id,
        decision,
        who="the listener's request",
        listener=True,
        from_fork=named.from_fork,
    )
    return vouched, named


async def _caller(request: Request) -> RemoteEngine:
    """The engine, for the repository of the request's verified and admitted token. A source
    whose tokens claiming one repository were refused ``door_failed_logins`` times within
    ``door_failed_window`` is refused (429) for that repository before its next token is looked
    at, as the Postgres port refuses one that failed as many logins; other repositories' jobs
    behind the same address (one NAT) go on (``refusals``)."""
    counts: Refusals = request.app.state.refusals
    source = client_of(
        request.client.host if request.client else "unknown",
        ipv6_prefix=request.app.state.ipv6_prefix,
    )
    sent = request.headers.get("authorization", "").partition(" ")[2].strip()
    claim = claim_of(sent, request.headers)
    why = counts.refused(source, claim)
    if why is not None:
        raise errors.LimitReachedError(why)
    try:
        return await _verified(request)
    except errors.TokenError:
        counts.failed(source, claim)
        raise


async def _verified(request: Request) -> RemoteEngine:
    token = bearer(request.headers.get("authorization"))
    engine_for: EngineFor = request.app.state.engine_for
    if tokens.looks_like(token):
        vouched, named = await asyncio.to_thread(_listener_vouched, request, token)
        request.state.vouched = vouched
        # The engine is sent the token and the repository it names, and checks both itself.
        return engine_for(token, named)
    verifier: Verifier = request.app.state.verifier
    identity = await asyncio.to_thread(verifier.verify, token)
    request.state.repository = f"{identity.repository} (id {identity.repository_id})"
    request.state.vouched = vouched_for(identity, request.app.state.policy)
    # The engine is sent the token itself, and verifies it again: the door's word is not proof.
    return engine_for(token, None)


def _vouched(request: Request, _: Annotated[RemoteEngine, Depends(_caller)]) -> Vouched:
    found: Vouched = request.state.vouched
    return found


Engine = Annotated[RemoteEngine, Depends(_caller)]
# What the door vouched for the caller (its engine is asked for first, once a request).
Admitted = Annotated[Vouched, Depends(_vouched)]


FORM_BYTES = 4096  # the most a page's form's body may hold


async def form_of(request: Request) -> dict[str, str] | None:
    """A small urlencoded form's fields (None: not one)."""
    if request.headers.get("content-type", "").split(";")[0].strip() != (
        "application/x-www-form-urlencoded"
    ):
        return None
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_BYTES:
            return None
    try:
        return dict(parse_qsl(body.decode("ascii"), keep_blank_values=True))
    except (UnicodeDecodeError, ValueError):
        return None


@dataclass(frozen=True, kw_only=True)
class WayIn:
    """The front door's Postgres address (a branch's connection is answered through it) and
    how a workflow's report tells people and programs the way in (``GET /pool``)."""

    host: str
    port: int
    https_port: int = 443
    app_sslmode: str = "verify-full"


def _way_in(request: Request) -> WayIn:
    found: WayIn = request.app.state.way_in
    return found


Door = Annotated[WayIn, Depends(_way_in)]
