"""The engine's API on the network, ``https://HOST:PORT/api/v1/...``: what a workflow on any
runner asks of the pool, authenticated by its GitHub Actions OIDC token. Served by the front
door (unprivileged) on its HTTPS port, beside the branch pages; it reaches the engine only
through the service's socket, as the door's uid, vouching for the token's repository.

Each request:

1. ``Authorization: Bearer <token>``: the token is verified (``oidc.Verifier``, in a thread:
   it may fetch the issuer's keys). Refused: 401 with what is wrong (never the token); the
   issuer unreachable: 503.
2. The pool's policy (``policy.Policy.admit``) asked of the verified identity. Refused: 403
   naming the policy's rule and the fix.
3. The engine asked through its socket (``client.RemoteEngine``), forwarding the token itself
   in the ``vouch`` headers: the engine verifies it again and asks the same policy
   (``service.witness``), so a door that is taken gets nothing for a repository whose token it
   does not hold. It creates the branch for the token's repository id and refuses it every
   branch not created for the same id. The ``repository`` a request's body names is ignored.

A caller that is not a job (the webhook listener on another host) sends instead an API token
the admin issued (``pgo_...``, ``service.tokens``) and names, in each request, the repository
it acts for (``service.acting``: the repository, its id, its owner's id, and on a create
whether the pull request comes from a fork), which the listener takes from the signed
delivery. The door asks the engine (its socket's ``/credentials/check``: the door never reads
the token store) whether the token is good for that repository (401 if not), then the policy
(``Policy.admit_listener``), then vouches for that repository exactly as for a job's token.

The routes of the engine's operations a workflow needs (bases, create, get, reset, destroy,
size, grant, connection, record, trace) are made from the same declarations as the socket's
(``service.operations``, by ``service.routes``, in ``routes.api_branches``), with the same request
bodies, answers, error bodies and body caps (``service.limits``); a connection is answered
through the front door's Postgres port. The holds, the record's read and ``/pool`` are the
network's own. Every request is logged with the verified repository and the status; a token
never is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from pgoverlay import errors
from pgoverlay.errors import PgoverlayError
from pgoverlay.runner.callers.oidc import Verifier
from pgoverlay.runner.callers.policy import Policy
from pgoverlay.runner.door.refusals import Refusals
from pgoverlay.runner.service import limits
from pgoverlay.runner.service.answers import status_of
from pgoverlay.runner.service.client import RemoteEngine, error_code
from pgoverlay.runner.service.shape import as_dict
from pgoverlay.runner.service.views import ErrorBody
from pgoverlay.runner.web.deps import EngineFor, WayIn
from pgoverlay.runner.web.routes import api_branches, api_holds, api_pool
from pgoverlay.runner.web.routes.api_holds import Holds

log = logging.getLogger(__name__)

PREFIX = "/api/v1"
ROUTERS = (api_pool.router, api_branches.router, api_holds.router)
# Each route the API serves, as its router declares it (the app holds the routers, not their
# routes): what the body caps are read from.
ROUTES = [route for router in ROUTERS for route in router.routes]


def status(err: PgoverlayError) -> int:
    """The HTTP status of an error: a refused token 401 (its issuer unreachable 503), the engine
    service unreachable 503, the rest as the socket answers them."""
    if isinstance(err, errors.IssuerError | errors.ServiceError):
        return 503
    if isinstance(err, errors.TokenError):
        return 401
    return status_of(err)


def create_api(
    *,
    verifier: Verifier,
    policy: Policy,
    engine_for: EngineFor,
    door: RemoteEngine,
    door_host: str,
    door_port: int,
    door_https_port: int,
    app_sslmode: str,
    failed_logins: int,
    failed_window: float,
    ipv6_prefix: int,
) -> FastAPI:
    """The API's ASGI app, its routes relative to where it is mounted (``PREFIX``). ``door`` is the
    engine as the door's own identity (no repository vouched for): it asks whether an API token
    is good. ``door_host`` and ``door_port`` are the front door's Postgres address: a branch's
    connection is answered through it (its own port is on the pool host's loopback); with
    ``door_https_port`` and ``app_sslmode`` (``Settings.door_app_sslmode``), they are the way in
    a workflow's report tells people and programs (``GET /pool``). An IPv6 caller's refused
    tokens count against its ``ipv6_prefix``-bit network, as the Postgres port counts its failed
    logins."""
    app = FastAPI(
        title="pgoverlay network API",
        summary="Branches for GitHub Actions jobs on any runner, by their OIDC token",
        version="1",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.add_middleware(limits.RequestCap, cap_of=lambda scope: limits.route_cap(ROUTES, scope))
    app.state.verifier = verifier
    app.state.policy = policy
    app.state.engine_for = engine_for
    app.state.ipv6_prefix = ipv6_prefix
    app.state.refusals = Refusals(
        failed_logins=failed_logins, failed_window=failed_window, clock=time.monotonic
    )
    app.state.door = door  # the door's own identity, which asks whether an API token is good
    app.state.way_in = WayIn(
        host=door_host, port=door_port, https_port=door_https_port, app_sslmode=app_sslmode
    )
    app.state.holds = Holds()
    app.middleware("http")(_audit)
    app.add_exception_handler(PgoverlayError, _refused)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _bad_request)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _failure)
    for router in ROUTERS:
        app.include_router(router)
    return app


async def _audit(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    response = await call_next(request)
    log.info(
        "api %s %s for %s -> %s",
        request.method,
        request.url.path,
        getattr(request.state, "repository", "an unverified caller"),
        response.status_code,
    )
    response.headers["cache-control"] = "no-store"
    return response


# -- the one set of exception handlers ----------------------------------------------------------


def _answer(code: int, kind: str, message: str) -> JSONResponse:
    body = ErrorBody(code=kind, message=message)
    headers = {"www-authenticate": 'Bearer error="invalid_token"'} if code == 401 else None
    return JSONResponse(as_dict(body), status_code=code, headers=headers)


async def _refused(_: Request, err: PgoverlayError) -> JSONResponse:
    return _answer(status(err), error_code(type(err)), str(err))


async def _bad_request(_: Request, err: RequestValidationError) -> JSONResponse:
    first = err.errors()[0] if err.errors() else {}
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")[:40] or "request"
    problem = str(first.get("msg", "not valid")).removeprefix("Value error, ")
    return _answer(422, "invalid_request", f"{where}: {problem}"[:300])


async def _http_error(_: Request, err: StarletteHTTPException) -> JSONResponse:
    if err.status_code in (404, 405):
        return _answer(
            err.status_code,
            "not_found" if err.status_code == 404 else "method_not_allowed",
            f"no such operation: the network API's routes are in docs/api.md ({PREFIX}/...)",
        )
    return _answer(err.status_code, "bad_request", str(err.detail))


async def _failure(_: Request, err: Exception) -> JSONResponse:
    log.error("api request failed: %s", type(err).__name__, exc_info=err)
    return _answer(500, "internal", "the front door failed: its log has the details")
