"""The engine service's HTTP API: each route validates its request with pydantic, acts
through a ``LocalEngine`` for the calling uid, and answers a model or an ``ErrorBody``. The
routes are made from the engine's operations as ``operations`` declares them (``routes``);
this module holds what is the socket's own: who is calling, the settings' check, the audit,
the error answers.

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

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pgoverlay import errors
from pgoverlay.errors import PgoverlayError
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.service import limits, routes, vouch
from pgoverlay.runner.service.admission import SocketPolicy
from pgoverlay.runner.service.answers import status_of
from pgoverlay.runner.service.client import SETTINGS_HEADER, error_code
from pgoverlay.runner.service.engine import LocalEngine, door_uid
from pgoverlay.runner.service.models import EXCERPT_CHARS
from pgoverlay.runner.service.operations import API
from pgoverlay.runner.service.shape import as_dict
from pgoverlay.runner.service.views import ErrorBody
from pgoverlay.runner.service.witness import Witness
from pgoverlay.runner.settings import Settings

log = logging.getLogger("pgoverlay.service")

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
    _hold(app, settings, policy)
    _answer_errors(app)

    @app.get(f"{API}/health")
    def health() -> dict[str, bool]:
        return {"ok": True}

    routes.add_socket_routes(app, Caller)
    return app


def openapi_document() -> str:
    """The service's API as an OpenAPI document (published as docs/service-openapi.json)."""
    return json.dumps(create_app(Settings()).openapi(), indent=2, sort_keys=True) + "\n"


def _hold(app: FastAPI, settings: Settings, policy: SocketPolicy | None) -> None:
    """What the routes share, in ``app.state``, and the middleware around them."""
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


def _answer_errors(app: FastAPI) -> None:
    """The app's one set of exception handlers: every error an ``ErrorBody``."""
    app.add_exception_handler(PgoverlayError, _engine_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _bad_request)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _failure)


async def _engine_error(_: Request, err: PgoverlayError) -> JSONResponse:
    body = ErrorBody(code=error_code(type(err)), message=str(err))
    return JSONResponse(as_dict(body), status_code=status_of(err))


async def _bad_request(_: Request, err: RequestValidationError) -> JSONResponse:
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


async def _http_error(_: Request, err: StarletteHTTPException) -> JSONResponse:
    code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code, "bad_request")
    message = (
        "no such operation: the service's API is in docs/service-openapi.json"
        if err.status_code in (404, 405)
        else str(err.detail)
    )
    body = ErrorBody(code=code, message=message)
    return JSONResponse(as_dict(body), status_code=err.status_code)


async def _failure(_: Request, err: Exception) -> JSONResponse:
    log.error("request failed: %s", type(err).__name__, exc_info=err)
    body = ErrorBody(
        code="internal",
        message=f"the engine failed ({type(err).__name__}): the service's log has the "
        "details; `pgoverlay gc` (as root) mends what an interrupted operation left",
    )
    return JSONResponse(as_dict(body), status_code=500)
