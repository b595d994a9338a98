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

from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from pgoverlay.errors import PgoverlayError
from pgoverlay.runner.callers import oauth
from pgoverlay.runner.settings import Settings
from pgoverlay.runner.web import render
from pgoverlay.runner.web.deps import PageEngine, PageState, message, not_found
from pgoverlay.runner.web.routes import branch_page, sign_in
from pgoverlay.runner.web.sessions import Sessions

log = logging.getLogger(__name__)

_HSTS = "max-age=31536000"


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
    """The page's ASGI app: the branch page's and sign-in's routers (``routes/``), sharing
    ``deps.PageState`` as ``app.state.pages``, with the security headers on every answer and
    one set of exception handlers. ``secret`` (32 random bytes or more) signs its cookies;
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
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    app.state.pages = PageState(
        settings=settings,
        engine=engine,
        github=github,
        sessions=Sessions(secret=secret, lifetime=settings.page.session_seconds),
        origin=page_origin(settings),
        fingerprint=fingerprint,
        certificate=certificate,
        clock=clock,
        audit=audit,
    )
    app.middleware("http")(_headers)
    app.add_exception_handler(PgoverlayError, _engine_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.include_router(branch_page.router)
    app.include_router(sign_in.router)
    return app


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


# -- the one set of exception handlers ----------------------------------------------------------


async def _engine_error(request: Request, exc: PgoverlayError) -> Response:
    log.error("page: %s %s: %s", request.method, request.url.path, exc)
    return message(
        request,
        "Not available",
        "The branch engine could not answer: try again in a minute, or tell the runner's admin.",
        503,
    )


async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    if exc.status_code == 404:
        return not_found(request)
    return message(request, "Refused", str(exc.detail), exc.status_code)
