"""Signing a reader in with GitHub (``/signin``, GitHub's ``/oauth/callback``) and out
(``/signout``)."""

from __future__ import annotations

import logging
import secrets

from fastapi import APIRouter, Request, Response
from fastapi.responses import RedirectResponse
from starlette.concurrency import run_in_threadpool

from pgoverlay.errors import GitHubError
from pgoverlay.runner.callers import oauth
from pgoverlay.runner.names import NAME_RE
from pgoverlay.runner.settings import Settings
from pgoverlay.runner.web.deps import (
    SESSION_COOKIE,
    STATE_COOKIE,
    PageEngine,
    Pages,
    Reader,
    branch_path,
    form_of,
    message,
    unknown_key,
)
from pgoverlay.runner.web.sessions import SIGN_IN_SECONDS

log = logging.getLogger("pgoverlay.runner.web.page")

router = APIRouter()


@router.post("/signout")
async def sign_out(request: Request, pages: Pages, session: Reader) -> Response:
    """End the session (the page's own form: its origin and CSRF token), and its cookie."""
    form = await form_of(request)
    if (
        request.headers.get("origin") != pages.origin
        or session is None
        or form is None
        or not secrets.compare_digest(form.get("csrf", ""), session.csrf)
    ):
        return message(request, "Refused", "Sign out from the branch page itself.", 403)
    pages.sessions.end(session.id)
    response = message(request, "Signed out", "You are signed out of the branch pages.", 200)
    response.delete_cookie(SESSION_COOKIE, path="/", secure=True, httponly=True)
    return response


@router.get("/signin")
async def sign_in(request: Request, pages: Pages, next: str = "") -> Response:
    name = _next_branch(next)
    if name is None:
        return message(request, "Nothing to sign in to", "Open a branch's page first.", 400)
    sessions = pages.sessions
    browser = sessions.unsign("browser", request.cookies.get(STATE_COOKIE))
    browser = browser or sessions.new_browser()
    state = sessions.begin(branch_path(name), browser=browser, now=pages.clock())
    url = oauth.authorize_url(
        pages.github.web_url,
        client_id=pages.github.client_id,
        redirect_uri=pages.callback,
        state=state,
    )
    response = RedirectResponse(url, 303)
    signed = sessions.sign("browser", browser)
    _cookie(response, STATE_COOKIE, signed, max_age=int(SIGN_IN_SECONDS))
    return response


@router.get("/oauth/callback")
async def callback_(request: Request, pages: Pages, code: str = "", state: str = "") -> Response:
    sessions = pages.sessions
    browser = sessions.unsign("browser", request.cookies.get(STATE_COOKIE))
    started = sessions.finish(state, browser=browser, now=pages.clock())
    if started is None:
        pages.audited(request, "page_sign_in", outcome="refused:state")
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
        pages.audited(request, "page_sign_in", branch=name, outcome="refused:github")
        return message(request, "Not signed in", "GitHub did not sign you in.", 401)
    try:
        login, key, access, token = await run_in_threadpool(
            _check, pages.github, pages.engine, code, pages.callback, name, pages.settings
        )
    except GitHubError as err:
        log.warning("page: sign-in failed: %s", err)
        pages.audited(request, "page_sign_in", branch=name, outcome="failed:github")
        return message(request, "Sign-in failed", str(err), 502)
    session = sessions.open(
        login,
        reader_token=token,
        repository=key,
        access=access,
        now=pages.clock(),
        previous=sessions.unsign("session", request.cookies.get(SESSION_COOKIE)),
    )
    log.info("page: %s signed in; %s: %s", login, key, access or "refused")
    pages.audited(
        request,
        "page_sign_in",
        login=login,
        branch=name,
        repository=key if key != unknown_key(name) else None,
        outcome="ok" if access else "refused:access",
        access=access,
    )
    response = RedirectResponse(started.next, 303)
    signed = sessions.sign("session", session.id)
    _cookie(response, SESSION_COOKIE, signed, max_age=pages.lifetime)
    return response


def _next_branch(next_path: str | None) -> str | None:
    """The branch a ``next`` path names, if it is one of ours (no open redirect)."""
    if next_path and next_path.startswith("/b/"):
        name = next_path[3:]
        if NAME_RE.fullmatch(name):
            return name
    return None


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


def _cookie(response: Response, name: str, value: str, *, max_age: int) -> None:
    response.set_cookie(
        name, value, max_age=max_age, path="/", secure=True, httponly=True, samesite="lax"
    )
