"""The branch page, ``/b/BRANCH``, its credential form, and the door's own certificate."""

from __future__ import annotations

import logging
import secrets
from functools import partial
from urllib.parse import quote

from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse
from starlette.concurrency import run_in_threadpool

from pgoverlay.action import record as pr_record
from pgoverlay.errors import PgoverlayError, UnmaskedAccessError
from pgoverlay.runner.service import models
from pgoverlay.runner.service.views import BranchView
from pgoverlay.runner.settings import Settings
from pgoverlay.runner.web import render
from pgoverlay.runner.web.deps import (
    PageEngine,
    Pages,
    Reader,
    branch_path,
    form_of,
    message,
    not_found,
    to_sign_in,
)
from pgoverlay.runner.web.render import Credential

log = logging.getLogger("pgoverlay.runner.web.page")

router = APIRouter()


@router.get("/b/{name}")
async def branch_page(request: Request, name: str, pages: Pages, session: Reader) -> Response:
    if session is None:
        return to_sign_in(name)
    view, access, recheck = await pages.readable(name, session, layer=True)
    if recheck:
        return to_sign_in(name)
    if view is None or access is None:
        return not_found(request)
    masked = await run_in_threadpool(_masked, pages.engine, view)
    text = render.branch_page(
        view,
        pr_record.read(view.record, branch=view.name),
        masked=masked,
        login=session.login,
        access=access,
        csrf=session.csrf,
        nonce=request.state.nonce,
        credentials=masked is not False or pages.settings.access_unmasked,
        pull_url=_pull_url(pages.settings, view),
    )
    # Its form's POST must carry an Origin: under no-referrer a browser sends "null"
    # instead. same-origin still sends nothing to any other site.
    return HTMLResponse(text, headers={"Referrer-Policy": "same-origin"})


@router.post("/b/{name}/credential")
async def credential(request: Request, name: str, pages: Pages, session: Reader) -> Response:
    if request.headers.get("origin") != pages.origin:
        return message(
            request,
            "Refused",
            f"This form is accepted only from {pages.origin}: open the branch's page there "
            "and ask again.",
            403,
        )
    if session is None:  # no redirect: the CSP's form-action would stop one to GitHub
        return message(
            request,
            "Signed out",
            "Your session has ended: sign in again, then ask for your credential.",
            401,
            link=(branch_path(name), "Sign in again"),
        )
    form = await form_of(request)
    if form is None or not secrets.compare_digest(form.get("csrf", ""), session.csrf):
        return message(
            request,
            "Refused",
            "This form did not come from your branch page (its token is missing or "
            "stale): open the branch's page again and ask from there.",
            403,
        )
    view, access, recheck = await pages.readable(name, session)
    if recheck:
        return message(
            request,
            "Sign in again",
            "Your access to this branch's repository must be checked again.",
            401,
            link=(branch_path(name), "Sign in again"),
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
            partial(pages.engine.grant, reader=session.reader_token), name, grant
        )
    except UnmaskedAccessError as err:  # the engine's answer names the admin's setting
        log.warning("page: no credential for %s on branch %s: %s", login, name, err)
        return message(
            request,
            "No credential",
            "This branch holds production data, and this host gives no personal "
            "credential on such branches: ask the runner's admin.",
            409,
            link=(branch_path(name), "Back"),
        )
    except PgoverlayError as err:
        log.warning("page: no credential for %s on branch %s: %s", login, name, err)
        return message(request, "No credential", str(err), 409, link=(branch_path(name), "Back"))
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
    text = render.credential_page(shown, fingerprint=pages.fingerprint, nonce=request.state.nonce)
    return HTMLResponse(text)


@router.get(f"/{render.CERT_DOWNLOAD}")
async def door_certificate(request: Request, pages: Pages) -> Response:
    """The door's own certificate (public): what a reader's client verifies it against."""
    if pages.certificate is None:
        return not_found(request)
    return Response(pages.certificate, media_type="application/x-pem-file")


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
