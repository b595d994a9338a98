"""The engine service's HTTP API: each route validates its request with pydantic, acts
through a ``LocalEngine`` for the calling uid, and answers a model or an ``ErrorBody``.

The caller's uid comes from the socket's peer credentials (``protocol.PeerCredProtocol``), never
from anything the caller sends; the front door's uid alone may forward its callers'
credentials (``vouch``), which the engine verifies itself (``witness``); the pool's policy
(``admission``), when the service holds one, is handed to each request's engine as it stands
then. Every request is logged with that uid; secrets never are.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Annotated

from fastapi import Body, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import StringConstraints
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pgoverlay import errors
from pgoverlay.errors import PgoverlayError
from pgoverlay.runner.names import NAME_RE
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.service import limits, vouch
from pgoverlay.runner.service.admission import SocketPolicy
from pgoverlay.runner.service.client import API, SETTINGS_HEADER, error_code
from pgoverlay.runner.service.engine import LocalEngine, door_uid
from pgoverlay.runner.service.models import (
    EXCERPT_CHARS,
    LOGIN_PATTERN,
    CreateRequest,
    CredentialCheck,
    GrantRequest,
    OwnerRequest,
    RecordRequest,
    TraceRequest,
)
from pgoverlay.runner.service.shape import as_dict
from pgoverlay.runner.service.views import (
    BaseView,
    BranchView,
    Connection,
    Credential,
    Destroyed,
    ErrorBody,
    GcReport,
    GrantView,
    Layer,
    Revoked,
    TraceMark,
)
from pgoverlay.runner.service.witness import Witness
from pgoverlay.runner.settings import Settings

log = logging.getLogger("pgoverlay.service")

# A branch name in a path, checked before any route runs.
Name = Annotated[str, StringConstraints(pattern=NAME_RE.pattern, max_length=63)]
# A credential's login in a path: a GitHub login, or the name of a preview app's or a job's role.
Login = Annotated[
    str,
    StringConstraints(
        pattern=f"^(?:{LOGIN_PATTERN[1:-1]}|(?:app|job)_[a-z0-9_]{{1,59}})$", max_length=63
    ),
]

# The HTTP status of each kind of error; anything else the engine raises on purpose is 500.
STATUS: list[tuple[type[PgoverlayError], int]] = [
    (errors.NotOwnerError, 403),  # DoorForbiddenError too
    (errors.UnmaskedAccessError, 403),
    (errors.PolicyError, 403),
    (errors.TokenError, 401),
    (errors.GitHubError, 503),
    (errors.AccessError, 409),
    (errors.BranchMissingError, 404),
    (errors.BaseMissingError, 404),
    (errors.LimitReachedError, 429),
    (errors.PortsExhaustedError, 429),
    (errors.BranchExistsError, 409),  # BranchOwnedError too
    (errors.LockBusyError, 409),
    (errors.BranchStateError, 409),
    (errors.SettingsDifferError, 409),
    (errors.TraceError, 409),
    (errors.InvalidNameError, 422),
    (errors.ConfigError, 422),
    (errors.PoolFullError, 507),
]
ERROR_ANSWERS: dict[int | str, dict[str, object]] = {
    code: {"model": ErrorBody} for code in (401, 403, 404, 409, 413, 422, 429, 431, 500, 503, 507)
}
DESCRIPTION = (
    f"A request's body is at most {limits.MAX_BODY_BYTES} bytes unless its operation's "
    f"`{limits.BODY_CAP_KEY}` says more; a larger one is answered 413 before it is read. A "
    f"request's head is at most {limits.MAX_HEAD_BYTES} bytes (431 beyond). A caller has "
    "`PGOVERLAY_SERVICE_REQUEST_TIMEOUT` seconds to send its whole request (408 after), and "
    "a uid other than root's at most `PGOVERLAY_SERVICE_CONNECTIONS_PER_USER` connections "
    "open at once (429 beyond)."
)
# What a refusal quotes of the caller's input at most (see models.excerpt).
MAX_REFUSAL_CHARS = 300


def status_of(err: PgoverlayError) -> int:
    return next((code for cls, code in STATUS if isinstance(err, cls)), 500)


async def _engine(request: Request) -> LocalEngine:
    """The engine, acting for the uid at the other end of the socket."""
    peer = request.scope.get("state", {}).get("peer")
    if peer is None:  # not through the service's socket (cannot happen when run by `serve`)
        raise errors.ServiceError("the caller's identity is unknown")
    pools: threading.local = request.app.state.pools
    settings: Settings = request.app.state.settings

    def pool() -> Pool:
        # SQLite connections stay in their thread: one pool per thread of the route's
        # threadpool, opened there on first use and kept open.
        found: Pool | None = getattr(pools, "pool", None)
        if found is None:
            found = pools.pool = Pool.open(settings)
        return found

    held: SocketPolicy = request.app.state.policy
    evidence = vouch.parse(request.headers)
    if evidence is None:
        return LocalEngine(pool, uid=peer.uid, policy=held.current)
    # Credentials the front door forwards: from the door's uid only, and verified here (the
    # door's word is not taken: a forged vouch without a credential that proves it gets nothing).
    if peer.uid == 0 or peer.uid != door_uid(settings.door.user):
        raise errors.NotOwnerError(
            "only the front door's identity may vouch for a repository or a person (the "
            "x-pgoverlay-vouched-* headers): ask without them, and name the repository in the "
            "request"
        )
    witness: Witness = request.app.state.witness
    vouched = await run_in_threadpool(witness.vouched, evidence, home=settings.home)
    return LocalEngine(
        pool,
        uid=peer.uid,
        vouched=vouched,
        reader=witness.reader(evidence),
        policy=held.current,
    )


Caller = Annotated[LocalEngine, Depends(_engine)]


async def _same_settings(request: Request) -> None:
    """Root's CLI sends its settings' fingerprint: the service acts for root only with the
    settings root's own process would have used (another home, port range, runtime or fault
    point, and root works on the pool itself). Other callers have no say in the settings."""
    peer = request.scope.get("state", {}).get("peer")
    given = request.headers.get(SETTINGS_HEADER)
    if peer is not None and peer.uid == 0 and given not in (None, request.app.state.fingerprint):
        raise errors.SettingsDifferError(
            "the engine service runs with other settings than this command's: root's "
            "command works on the pool itself (restart the service, `systemctl restart "
            "pgoverlay`, for it to take these)"
        )


class Audit:
    """ASGI middleware: a line in the log for each request, with the caller's uid and pid and
    the status it got (a 413 of ``RequestCap``, inside it, too). Plain ASGI, as Starlette's
    ``@app.middleware`` runs each answer through a task and a stream of its own: a tenth of
    the front door's lookup of a branch, which it makes on each connection."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status: int | None = None

        async def sent(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start" and status is None:
                status = message["status"]
            await send(message)

        await self.app(scope, receive, sent)
        peer = scope.get("state", {}).get("peer")
        log.info(
            "uid=%s pid=%s %s %s -> %s",
            peer.uid if peer else "?",
            peer.pid if peer else "?",
            scope["method"],
            scope["path"],
            status,
        )


def create_app(settings: Settings, *, policy: SocketPolicy | None = None) -> FastAPI:
    """The service's app for ``settings``, its socket's callers held to ``policy`` (None: the
    pool's settings alone; the service passes the policy of ``api_policy_file``)."""
    app = FastAPI(
        title="pgoverlay engine service",
        summary="Branches of seeded bases for the workflows of this runner",
        version="1",
        docs_url=None,
        redoc_url=None,
        description=DESCRIPTION,
        responses=ERROR_ANSWERS,
        dependencies=[Depends(_same_settings)],
    )
    app.state.settings = settings
    app.state.fingerprint = settings.fingerprint()
    app.state.pools = threading.local()
    app.state.policy = policy if policy is not None else SocketPolicy(None)
    app.state.witness = Witness(settings, lambda: app.state.policy.current)
    # Inside the audit, which logs what the caller got, a 413 too.
    app.add_middleware(
        limits.RequestCap, cap_of=lambda scope: limits.route_cap(app.router.routes, scope)
    )
    app.add_middleware(Audit)

    @app.exception_handler(PgoverlayError)
    async def engine_error(_: Request, err: PgoverlayError) -> JSONResponse:
        body = ErrorBody(code=error_code(type(err)), message=str(err))
        return JSONResponse(as_dict(body), status_code=status_of(err))

    @app.exception_handler(RequestValidationError)
    async def bad_request(_: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0] if err.errors() else {}
        # A field's name may be the caller's own (an unknown one): quoted as an excerpt.
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "request"
        # A request's own check (its __post_init__) names its field in its message.
        problem = str(first.get("msg", "not valid")).removeprefix("Value error, ")
        if len(where) > EXCERPT_CHARS:
            where = f"{where[:EXCERPT_CHARS]}..."
        message = problem if where == "request" else f"{where}: {problem}"
        body = ErrorBody(code="invalid_request", message=message[:MAX_REFUSAL_CHARS])
        return JSONResponse(as_dict(body), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, err: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code, "bad_request")
        message = (
            "no such operation: the service's API is in docs/service-openapi.json"
            if err.status_code in (404, 405)
            else str(err.detail)
        )
        body = ErrorBody(code=code, message=message)
        return JSONResponse(as_dict(body), status_code=err.status_code)

    @app.exception_handler(Exception)
    async def failure(_: Request, err: Exception) -> JSONResponse:
        log.error("request failed: %s", type(err).__name__, exc_info=err)
        body = ErrorBody(
            code="internal",
            message=f"the engine failed ({type(err).__name__}): the service's log has the "
            "details; `pgoverlay gc` (as root) mends what an interrupted operation left",
        )
        return JSONResponse(as_dict(body), status_code=500)

    @app.get(f"{API}/health")
    def health() -> dict[str, bool]:
        return {"ok": True}

    @app.get(f"{API}/bases")
    def bases(e: Caller) -> list[BaseView]:
        return e.bases()

    @app.get(f"{API}/branches", response_model=list[BranchView])
    def branch_list(e: Caller, layer: Annotated[bool, Query()] = False) -> JSONResponse:
        # Written as the engine made them: FastAPI's check of every view on its way out (into
        # pydantic's twin and back) cost more than making them, with a thousand branches.
        return JSONResponse(as_dict(e.branches(layer=layer)))

    @app.post(f"{API}/branches", status_code=201)
    def create(e: Caller, body: Annotated[CreateRequest, Body()]) -> BranchView:
        return e.create(body)

    @app.get(f"{API}/branches/{{name}}", response_model=BranchView)
    def branch(e: Caller, name: Name, layer: Annotated[bool, Query()] = False) -> JSONResponse:
        # The front door's lookup, on each connection: written as the engine made it, not
        # checked again on its way out (as the list above).
        found = e.branch(name, layer=layer)
        if found is None:
            raise errors.BranchMissingError(f"no branch named {name}: see `pgoverlay branch list`")
        return JSONResponse(as_dict(found))

    @app.post(f"{API}/branches/{{name}}/reset")
    def reset(e: Caller, name: Name, body: Annotated[OwnerRequest, Body()]) -> BranchView:
        return e.reset(name, repository=body.repository)

    @app.post(f"{API}/branches/{{name}}/destroy")
    def destroy(e: Caller, name: Name, body: Annotated[OwnerRequest, Body()]) -> Destroyed:
        return e.destroy(name, repository=body.repository)

    @app.post(f"{API}/branches/{{name}}/suspend")
    def suspend(e: Caller, name: Name, body: Annotated[OwnerRequest, Body()]) -> BranchView:
        return e.suspend(name, repository=body.repository)

    @app.post(f"{API}/branches/{{name}}/wake")
    def wake(e: Caller, name: Name, body: Annotated[OwnerRequest, Body()]) -> BranchView:
        return e.wake(name, repository=body.repository)

    @app.get(f"{API}/branches/{{name}}/connection")
    def connection(e: Caller, name: Name) -> Connection:
        return e.connection(name)

    @app.get(f"{API}/branches/{{name}}/size")
    def size(e: Caller, name: Name) -> Layer:
        return e.size(name)

    @app.put(
        f"{API}/branches/{{name}}/record",
        status_code=204,
        openapi_extra={limits.BODY_CAP_KEY: limits.MAX_RECORD_BODY_BYTES},
    )
    def record(e: Caller, name: Name, body: Annotated[RecordRequest, Body()]) -> None:
        e.save_record(name, body)

    @app.post(f"{API}/branches/{{name}}/trace")
    def trace_begin(e: Caller, name: Name, body: Annotated[TraceRequest, Body()]) -> TraceMark:
        return e.trace_begin(name, body)

    @app.post(f"{API}/branches/{{name}}/trace/mark")
    def trace_mark(e: Caller, name: Name, body: Annotated[OwnerRequest, Body()]) -> TraceMark:
        return e.trace_mark(name, repository=body.repository)

    @app.post(f"{API}/branches/{{name}}/trace/end")
    def trace_end(e: Caller, name: Name, body: Annotated[OwnerRequest, Body()]) -> TraceMark:
        return e.trace_end(name, repository=body.repository)

    @app.post(f"{API}/branches/{{name}}/access", status_code=201)
    def grant(e: Caller, name: Name, body: Annotated[GrantRequest, Body()]) -> GrantView:
        return e.grant(name, body)

    @app.get(f"{API}/branches/{{name}}/access")
    def grants(e: Caller, name: Name) -> list[GrantView]:
        return e.grants(name)

    @app.post(f"{API}/branches/{{name}}/access/{{login}}/revoke")
    def revoke(
        e: Caller, name: Name, login: Login, body: Annotated[OwnerRequest, Body()]
    ) -> Revoked:
        return e.revoke(name, login, repository=body.repository)

    @app.post(f"{API}/branches/{{name}}/job/end")
    def end_job(e: Caller, name: Name, body: Annotated[OwnerRequest, Body()]) -> Revoked:
        return e.end_job(name)

    @app.post(f"{API}/credentials/check")
    def check_credential(e: Caller, body: Annotated[CredentialCheck, Body()]) -> Credential:
        return e.check_credential(body)

    @app.post(f"{API}/gc")
    def gc(e: Caller) -> GcReport:
        return e.gc()

    return app


def openapi_document() -> str:
    """The service's API as an OpenAPI document (published as docs/service-openapi.json)."""
    return json.dumps(create_app(Settings()).openapi(), indent=2, sort_keys=True) + "\n"
