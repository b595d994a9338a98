"""The branch page, ``https://HOST/b/BRANCH``: a reader signs in with GitHub, sees the branch and
its migration report, and gets a personal credential. An ASGI app (FastAPI) served by the
unprivileged front door over TLS; it reaches the engine only through the ``PageEngine`` it is
given, and calls it in a thread (the engine's calls block).

What a request may learn:

- Nothing before sign-in: every ``/b/...`` sends an anonymous reader to GitHub, whether the
  branch exists or not.
- After sign-in, a reader whose role on the branch's repository counts (``oauth.access``: on a
  public repository, read is anyone's and does not) gets the page (read-only below
  ``access_write_permission``, read-write at or above it). A branch that does not exist
  and a repository the reader may not see get the same 404 page, byte for byte.
- A credential only from a POST carrying the session's CSRF token (a synchronizer token) from
  this page's own origin (``Origin``); its password is in that response's body alone
  (``Cache-Control: no-store``), never in a URL, a cookie or a log line. GitHub's token never
  leaves this process and is dropped once the reader's access is read (``oauth.py``).

Every response carries the security headers (``_headers``): a CSP allowing only this response's
nonce for style and script, no framing, HSTS, and no referrer, except that the branch page's is
``same-origin`` (under ``no-referrer`` a browser sends ``Origin: null`` with its form). The
callback's URL holds GitHub's one-time code: ``quiet_access_log`` keeps query strings out of
uvicorn's access log.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Protocol
from urllib.parse import parse_qsl, quote

from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from pgoverlay.action import record as pr_record
from pgoverlay.errors import GitHubError, PgoverlayError, UnmaskedAccessError
from pgoverlay.runner.callers import oauth
from pgoverlay.runner.names import NAME_RE
from pgoverlay.runner.service import models
from pgoverlay.runner.service.views import BaseView, BranchView
from pgoverlay.runner.settings import Settings
from pgoverlay.runner.web import render
from pgoverlay.runner.web.render import Credential
from pgoverlay.runner.web.sessions import SIGN_IN_SECONDS, Session, Sessions

log = logging.getLogger(__name__)

SESSION_COOKIE = "__Host-pgoverlay"
STATE_COOKIE = "__Host-pgoverlay-signin"
FORM_BYTES = 4096  # the most a credential form's body may hold
_HSTS = "max-age=31536000"


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


NOT_SET_UP = (
    "the branch page signs readers in with GitHub and needs an OAuth client: set "
    "PGOVERLAY_OAUTH_CLIENT_ID (the GitHub App's or OAuth App's client id) and "
    "PGOVERLAY_OAUTH_CLIENT_SECRET_FILE (see docs/access.md)"
)


def create_unconfigured(*, certificate: str | None = None) -> FastAPI:
    """The pages of a door whose admin has not set up sign-in: every path answers 503 with
    what is missing (the Postgres port works as ever; credentials come from `pgoverlay access
    grant`), but the door's own certificate (``certificate``, PEM: self-signed), which the
    strings `access grant` prints verify the door against. Nothing about any branch is said."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def _only(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if certificate is not None and request.url.path == f"/{render.CERT_DOWNLOAD}":
            return Response(certificate, media_type="application/x-pem-file")
        nonce = secrets.token_urlsafe(16)
        body = render.message_page(
            "Sign-in is not set up",
            "This host's branch pages need GitHub sign-in, which its admin has not set up: "
            + NOT_SET_UP
            + ". Until then, ask the admin for a credential (`pgoverlay access grant`).",
            nonce=nonce,
        )
        response = HTMLResponse(body, status_code=503)
        response.headers["Content-Security-Policy"] = (
            f"default-src 'none'; style-src 'nonce-{nonce}'; frame-ancestors 'none'"
        )
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Cache-Control"] = "no-store"
        return response

    return app


def page_origin(settings: Settings) -> str:
    """``https://HOST[:PORT]``: where readers reach the page (``Settings.door_name``) and
    GitHub sends them back."""
    return settings.page_origin


def quiet_access_log() -> None:
    """Keep query strings (the OAuth callback's one-time code and state) out of uvicorn's
    access log: the front door calls this before serving."""
    logging.getLogger("uvicorn.access").addFilter(_drop_query)


def _drop_query(record: logging.LogRecord) -> bool:
    args = record.args
    if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
        record.args = (*args[:2], args[2].split("?", 1)[0], *args[3:])
    return True


def _branch_path(name: str) -> str:
    return f"/b/{quote(name)}"


def _next_branch(next_path: str | None) -> str | None:
    """The branch a ``next`` path names, if it is one of ours (no open redirect)."""
    if next_path and next_path.startswith("/b/"):
        name = next_path[3:]
        if NAME_RE.fullmatch(name):
            return name
    return None


def create_page(
    settings: Settings,
    engine: PageEngine,
    *,
    secret: bytes,
    fingerprint: str | None = None,
    certificate: str | None = None,
    clock: Callable[[], float] = time.time,
    audit: Callable[..., None] | None = None,
) -> FastAPI:
    """The page's ASGI app. ``secret`` (32 random bytes or more) signs its cookies;
    ``fingerprint`` and ``certificate`` (PEM) are the front door's own certificate's when it is
    self-signed: shown with a credential, and offered for download, as the connection strings'
    ``sslrootcert``; ``clock`` is for tests; ``audit`` writes a line of the door's audit log
    (``AuditLog.write``) for every sign-in, refused ones too. Reads the OAuth client's secret
    now."""
    if not settings.page.oauth_client_id:
        raise PgoverlayError(NOT_SET_UP)
    github = oauth.GitHubSignIn(
        web_url=settings.page.github_web_url,
        api_url=settings.page.github_api_url,
        client_id=settings.page.oauth_client_id,
        client_secret=oauth.read_client_secret(settings.page.oauth_client_secret_file),
    )
    origin = page_origin(settings)
    callback = f"{origin}/oauth/callback"
    sessions = Sessions(secret=secret, lifetime=settings.page.session_seconds)
    lifetime = int(settings.page.session_seconds)
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def _headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        request.state.nonce = nonce = secrets.token_urlsafe(16)
        response = await call_next(request)
        csp = (
            f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
            "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
        )
        response.headers["Content-Security-Policy"] = csp
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers.setdefault("Referrer-Policy", "no-referrer")
        response.headers["Strict-Transport-Security"] = _HSTS
        response.headers["Cache-Control"] = "no-store"
        return response

    def message(request: Request, title: str, text: str, status: int, **kw: Any) -> HTMLResponse:
        body = render.message_page(title, text, nonce=request.state.nonce, **kw)
        return HTMLResponse(body, status_code=status)

    def not_found(request: Request) -> HTMLResponse:
        """The one answer for a branch that does not exist and one the reader may not see
        (with who is signed in, and a way out: the same for both)."""
        session = session_of(request)
        answer = message(
            request,
            "Not found",
            "There is no branch by this name that you can see. If you expected one, check the "
            "link, or ask for access to its repository on GitHub"
            + (" (or sign out, and in as another GitHub user)." if session else "."),
            404,
            who=(session.login, session.csrf) if session else None,
        )
        if session is not None:  # its sign-out form's POST must carry an Origin (below)
            answer.headers["Referrer-Policy"] = "same-origin"
        return answer

    def session_of(request: Request) -> Session | None:
        sid = sessions.unsign("session", request.cookies.get(SESSION_COOKIE))
        return sessions.get(sid, now=clock())

    def audited(request: Request, event: str, **fields: object) -> None:
        if audit is not None:
            source = request.client.host if request.client else ""
            audit(event, source=source, **fields)

    def to_sign_in(name: str) -> RedirectResponse:
        return RedirectResponse(f"/signin?next={quote(_branch_path(name), safe='')}", 303)

    async def readable(
        name: str, session: Session, *, layer: bool = False
    ) -> tuple[BranchView | None, oauth.Access | None, bool]:
        """The branch, the reader's access to it, and whether that access must be checked
        again (a sign-in) first. With ``layer``, its writable layer measured too, once the
        reader is known to have access: the engine walks the layer as root, which a reader
        without access must not be able to make it do."""
        if not NAME_RE.fullmatch(name):
            return None, None, False
        view = await run_in_threadpool(engine.branch, name)
        key = view.repository if view is not None and view.repository else unknown_key(name)
        checked = sessions.checked(session, key, now=clock())
        if checked is None:
            return view, None, True
        if layer and view is not None and checked.access is not None:
            view = await run_in_threadpool(engine.branch, name, layer=True)
        return view, checked.access, False

    @app.exception_handler(PgoverlayError)
    async def _engine_error(request: Request, exc: PgoverlayError) -> Response:
        log.error("page: %s %s: %s", request.method, request.url.path, exc)
        return message(
            request,
            "Not available",
            "The branch engine could not answer: try again in a minute, or tell the runner's "
            "admin.",
            503,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            return not_found(request)
        return message(request, "Refused", str(exc.detail), exc.status_code)

    @app.get("/b/{name}")
    async def branch_page(request: Request, name: str) -> Response:
        session = session_of(request)
        if session is None:
            return to_sign_in(name)
        view, access, recheck = await readable(name, session, layer=True)
        if recheck:
            return to_sign_in(name)
        if view is None or access is None:
            return not_found(request)
        masked = await run_in_threadpool(_masked, engine, view)
        text = render.branch_page(
            view,
            pr_record.read(view.record, branch=view.name),
            masked=masked,
            login=session.login,
            access=access,
            csrf=session.csrf,
            nonce=request.state.nonce,
            credentials=masked is not False or settings.access_unmasked,
            pull_url=_pull_url(settings, view),
        )
        # Its form's POST must carry an Origin: under no-referrer a browser sends "null"
        # instead. same-origin still sends nothing to any other site.
        return HTMLResponse(text, headers={"Referrer-Policy": "same-origin"})

    @app.post("/b/{name}/credential")
    async def credential(request: Request, name: str) -> Response:
        if request.headers.get("origin") != origin:
            return message(
                request,
                "Refused",
                f"This form is accepted only from {origin}: open the branch's page there and "
                "ask again.",
                403,
            )
        session = session_of(request)
        if session is None:  # no redirect: the CSP's form-action would stop one to GitHub
            return message(
                request,
                "Signed out",
                "Your session has ended: sign in again, then ask for your credential.",
                401,
                link=(_branch_path(name), "Sign in again"),
            )
        form = await _form(request)
        if form is None or not secrets.compare_digest(form.get("csrf", ""), session.csrf):
            return message(
                request,
                "Refused",
                "This form did not come from your branch page (its token is missing or "
                "stale): open the branch's page again and ask from there.",
                403,
            )
        view, access, recheck = await readable(name, session)
        if recheck:
            return message(
                request,
                "Sign in again",
                "Your access to this branch's repository must be checked again.",
                401,
                link=(_branch_path(name), "Sign in again"),
            )
        if view is None or access is None:
            return not_found(request)
        login = session.login
        grant = models.GrantRequest(
            login=login,
            read_only=access != "read-write",
            ttl=None,
            repository=None,
            app=False,
            vouched_by=f"github:{login}",
        )
        try:
            # The reader's own GitHub token goes with it: the engine asks GitHub itself.
            answer = await run_in_threadpool(
                partial(engine.grant, reader=session.reader_token), name, grant
            )
        except UnmaskedAccessError as err:  # the engine's answer names the admin's setting
            log.warning("page: no credential for %s on branch %s: %s", login, name, err)
            return message(
                request,
                "No credential",
                "This branch holds production data, and this host gives no personal "
                "credential on such branches: ask the runner's admin.",
                409,
                link=(_branch_path(name), "Back"),
            )
        except PgoverlayError as err:
            log.warning("page: no credential for %s on branch %s: %s", login, name, err)
            return message(
                request, "No credential", str(err), 409, link=(_branch_path(name), "Back")
            )
        if not answer.password:
            return message(request, "No credential", "The engine gave no password.", 502)
        log.info("page: %s got a %s credential for branch %s", login, access, name)
        shown = Credential(
            branch=name,
            login=login,
            role=answer.role,
            read_only=answer.read_only,
            expires_at=answer.expires_at,
            password=answer.password,
            host=answer.dsn_host,
            port=answer.dsn_port,
            database=answer.database,
        )
        text = render.credential_page(shown, fingerprint=fingerprint, nonce=request.state.nonce)
        return HTMLResponse(text)

    @app.post("/signout")
    async def sign_out(request: Request) -> Response:
        """End the session (the page's own form: its origin and CSRF token), and its cookie."""
        session = session_of(request)
        form = await _form(request)
        if (
            request.headers.get("origin") != origin
            or session is None
            or form is None
            or not secrets.compare_digest(form.get("csrf", ""), session.csrf)
        ):
            return message(request, "Refused", "Sign out from the branch page itself.", 403)
        sessions.end(session.id)
        response = message(request, "Signed out", "You are signed out of the branch pages.", 200)
        response.delete_cookie(SESSION_COOKIE, path="/", secure=True, httponly=True)
        return response

    @app.get(f"/{render.CERT_DOWNLOAD}")
    async def door_certificate(request: Request) -> Response:
        """The door's own certificate (public): what a reader's client verifies it against."""
        if certificate is None:
            return not_found(request)
        return Response(certificate, media_type="application/x-pem-file")

    @app.get("/signin")
    async def sign_in(request: Request, next: str = "") -> Response:
        name = _next_branch(next)
        if name is None:
            return message(request, "Nothing to sign in to", "Open a branch's page first.", 400)
        browser = sessions.unsign("browser", request.cookies.get(STATE_COOKIE))
        browser = browser or sessions.new_browser()
        state = sessions.begin(_branch_path(name), browser=browser, now=clock())
        url = oauth.authorize_url(
            github.web_url, client_id=github.client_id, redirect_uri=callback, state=state
        )
        response = RedirectResponse(url, 303)
        signed = sessions.sign("browser", browser)
        _cookie(response, STATE_COOKIE, signed, max_age=int(SIGN_IN_SECONDS))
        return response

    @app.get("/oauth/callback")
    async def callback_(request: Request, code: str = "", state: str = "") -> Response:
        browser = sessions.unsign("browser", request.cookies.get(STATE_COOKIE))
        started = sessions.finish(state, browser=browser, now=clock())
        if started is None:
            audited(request, "page_sign_in", outcome="refused:state")
            return message(
                request,
                "Sign-in refused",
                "This sign-in was not started by this browser, was used already, or took too "
                "long. Open the branch's page again to sign in.",
                400,
            )
        name = _next_branch(started.next)
        assert name is not None  # begin() stored only checked paths
        if not code:  # the reader declined on GitHub, or GitHub sent an error
            audited(request, "page_sign_in", branch=name, outcome="refused:github")
            return message(request, "Not signed in", "GitHub did not sign you in.", 401)
        try:
            login, key, access, token = await run_in_threadpool(
                _check, github, engine, code, callback, name, settings
            )
        except GitHubError as err:
            log.warning("page: sign-in failed: %s", err)
            audited(request, "page_sign_in", branch=name, outcome="failed:github")
            return message(request, "Sign-in failed", str(err), 502)
        session = sessions.open(
            login,
            reader_token=token,
            repository=key,
            access=access,
            now=clock(),
            previous=sessions.unsign("session", request.cookies.get(SESSION_COOKIE)),
        )
        log.info("page: %s signed in; %s: %s", login, key, access or "refused")
        audited(
            request,
            "page_sign_in",
            login=login,
            branch=name,
            repository=key if key != unknown_key(name) else None,
            outcome="ok" if access else "refused:access",
            access=access,
        )
        response = RedirectResponse(started.next, 303)
        _cookie(response, SESSION_COOKIE, sessions.sign("session", session.id), max_age=lifetime)
        return response

    return app


def unknown_key(name: str) -> str:
    """What a session records for a branch that did not exist when its reader signed in: a
    refusal, so that the next visit is a 404 as a refused reader's is, not another sign-in
    (which would tell a branch that exists from one that does not). No repository name has a
    colon."""
    return f"branch:{name}"


def _check(
    github: oauth.GitHubSignIn,
    engine: PageEngine,
    code: str,
    callback: str,
    name: str,
    settings: Settings,
) -> tuple[str, str, oauth.Access | None, str]:
    """Who signed in, the repository of branch ``name`` (``unknown_key``: no such branch),
    their access to it, and their GitHub token (kept in the session, in memory: the engine
    asks GitHub with it before it grants them a credential)."""
    token = github.exchange(code, redirect_uri=callback)
    login = github.login(token)
    view = engine.branch(name)
    if view is None or not view.repository:
        return login, unknown_key(name), None, token
    level = github.access(
        token,
        view.repository,
        write_permission=settings.page.write_permission,
        read_permission=settings.page.read_permission,
    )
    return login, view.repository, level, token


def _pull_url(settings: Settings, view: BranchView) -> str | None:
    """The branch's pull request on GitHub (None: it names none)."""
    if not view.repository or not view.pr:
        return None
    owner, _, name = view.repository.partition("/")
    return f"{settings.page.github_web_url.rstrip('/')}/{quote(owner)}/{quote(name)}/pull/{view.pr}"


def _masked(engine: PageEngine, view: BranchView) -> bool | None:
    """Whether the branch's base version is masked (None: not known)."""
    for base in engine.bases():
        if base.name == view.base and base.version == view.base_version:
            return base.masked
    found = pr_record.read(view.record, branch=view.name)
    info = found.report.branch if found is not None else None
    if info is not None and (info.base_name, info.base_version) == (view.base, view.base_version):
        return info.base_masked
    return None


async def _form(request: Request) -> dict[str, str] | None:
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


def _cookie(response: Response, name: str, value: str, *, max_age: int) -> None:
    response.set_cookie(
        name, value, max_age=max_age, path="/", secure=True, httponly=True, samesite="lax"
    )
