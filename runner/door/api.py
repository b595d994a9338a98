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
3. The engine asked through its socket (``client.RemoteEngine``) with the verified repository
   and its id in the ``vouch`` headers, and the policy's limits for it: the engine creates the
   branch for that repository id and refuses it every branch not created for the same id. The
   ``repository`` a request's body names is ignored there.

A caller that is not a job (the webhook listener on another host) sends instead an API token
the admin issued (``pgo_...``, ``service.tokens``) and names, in each request, the repository
it acts for (``service.acting``: the repository, its id, its owner's id, and on a create
whether the pull request comes from a fork), which the listener takes from the signed
delivery. The door asks the engine (its socket's ``/credentials/check``: the door never reads
the token store) whether the token is good for that repository (401 if not), then the policy
(``Policy.admit_listener``), then vouches for that repository exactly as for a job's token.

The routes mirror the socket's branch routes a workflow needs (create, get, reset, destroy,
connection, record, trace), with the same request bodies, answers, error bodies and body caps
(``service.limits``); a connection is answered through the front door's Postgres port. Every
request is logged with the verified repository and the status; a token never is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Body, Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from pgoverlay import errors
from pgoverlay.errors import PgoverlayError
from pgoverlay.runner.door.oidc import Identity, Verifier
from pgoverlay.runner.door.policy import Decision, Policy
from pgoverlay.runner.service import acting, limits, tokens
from pgoverlay.runner.service.acting import Acting
from pgoverlay.runner.service.app import Name, status_of
from pgoverlay.runner.service.client import RemoteEngine, error_code
from pgoverlay.runner.service.models import (
    CreateRequest,
    CredentialCheck,
    OwnerRequest,
    RecordRequest,
    TraceRequest,
)
from pgoverlay.runner.service.shape import as_dict
from pgoverlay.runner.service.views import (
    BranchView,
    Connection,
    Destroyed,
    ErrorBody,
    Record,
    TraceMark,
)
from pgoverlay.runner.service.vouch import Vouched

log = logging.getLogger(__name__)

PREFIX = "/api/v1"
# The engine, reached for one verified repository (the door: a RemoteEngine on the socket).
EngineFor = Callable[[Vouched], RemoteEngine]


def status(err: PgoverlayError) -> int:
    """The HTTP status of an error: a refused token 401 (its issuer unreachable 503), the engine
    service unreachable 503, the rest as the socket answers them."""
    if isinstance(err, errors.IssuerError | errors.ServiceError):
        return 503
    if isinstance(err, errors.TokenError):
        return 401
    return status_of(err)


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
    naming the rule and the fix otherwise."""
    return _vouched(identity, policy.admit(identity))


def _vouched(identity: Identity, decision: Decision) -> Vouched:
    if not decision.allowed:
        raise errors.PolicyError(
            f"the pool's policy does not admit this job of {identity.repository} "
            f"({decision.rule}): {decision.reason}"
        )
    return Vouched(
        repository=identity.repository,
        repository_id=identity.repository_id,
        branch_limit=decision.branch_limit,
        total_limit=decision.total_limit,
    )


def listener_identity(acting: Acting) -> Identity:
    """The repository a request with an API token names, as an Identity with no workflow or
    event (the policy's ``admit_listener`` reads only its repository and owner)."""
    return Identity(
        repository=acting.repository,
        repository_id=acting.repository_id,
        repository_owner=acting.owner,
        repository_owner_id=acting.owner_id,
        event_name="",
        ref="",
        head_ref="",
        base_ref="",
        job_workflow_ref="",
        runner_environment="",
        repository_visibility="",
        actor="",
        sub="",
    )


def _listener_vouched(request: Request, token: str) -> Vouched:
    """What the door vouches for a request with an API token: the repository it names, if the
    engine says the token is good for it and the policy admits it. The forks rule is asked
    on a create alone: it refuses a fork its new branch, never the end of one."""
    create = getattr(request.scope.get("route"), "name", None) == "create"
    named = acting.parse(request.headers, create=create)
    door: RemoteEngine = request.app.state.door
    checked = door.check_credential(CredentialCheck(secret=token, repository=named.repository))
    request.state.repository = (
        f"{named.repository} (id {named.repository_id}) with the API token {checked.name}"
    )
    identity = listener_identity(named)
    policy: Policy = request.app.state.policy
    return _vouched(identity, policy.admit_listener(identity, from_fork=named.from_fork))


async def _caller(request: Request) -> RemoteEngine:
    """The engine, for the repository of the request's verified and admitted token."""
    token = bearer(request.headers.get("authorization"))
    engine_for: EngineFor = request.app.state.engine_for
    if tokens.looks_like(token):
        return engine_for(await asyncio.to_thread(_listener_vouched, request, token))
    verifier: Verifier = request.app.state.verifier
    identity = await asyncio.to_thread(verifier.verify, token)
    request.state.repository = f"{identity.repository} (id {identity.repository_id})"
    return engine_for(vouched_for(identity, request.app.state.policy))


Engine = Annotated[RemoteEngine, Depends(_caller)]


def create_api(
    *,
    verifier: Verifier,
    policy: Policy,
    engine_for: EngineFor,
    door: RemoteEngine,
    door_host: str,
    door_port: int,
) -> FastAPI:
    """The API's ASGI app, its routes relative to where it is mounted (``PREFIX``).
    ``door`` is the engine as the door's own identity (no repository vouched for): it asks
    whether an API token is good. ``door_host`` and ``door_port`` are the front door's
    Postgres address: a branch's connection is answered through it (its own port is on the
    pool host's loopback)."""
    app = FastAPI(
        title="pgoverlay network API",
        summary="Branches for GitHub Actions jobs on any runner, by their OIDC token",
        version="1",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.add_middleware(
        limits.RequestCap, cap_of=lambda scope: limits.route_cap(app.router.routes, scope)
    )

    app.state.verifier = verifier
    app.state.policy = policy
    app.state.engine_for = engine_for
    app.state.door = door  # the door's own identity, which asks whether an API token is good

    @app.middleware("http")
    async def audit(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
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

    def answer(code: int, kind: str, message: str) -> JSONResponse:
        body = ErrorBody(code=kind, message=message)
        headers = {"www-authenticate": 'Bearer error="invalid_token"'} if code == 401 else None
        return JSONResponse(as_dict(body), status_code=code, headers=headers)

    @app.exception_handler(PgoverlayError)
    async def refused(_: Request, err: PgoverlayError) -> JSONResponse:
        return answer(status(err), error_code(type(err)), str(err))

    @app.exception_handler(RequestValidationError)
    async def bad_request(_: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0] if err.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")[:40] or "request"
        problem = str(first.get("msg", "not valid")).removeprefix("Value error, ")
        return answer(422, "invalid_request", f"{where}: {problem}"[:300])

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, err: StarletteHTTPException) -> JSONResponse:
        if err.status_code in (404, 405):
            return answer(
                err.status_code,
                "not_found" if err.status_code == 404 else "method_not_allowed",
                f"no such operation: the network API's routes are in docs/api.md ({PREFIX}/...)",
            )
        return answer(err.status_code, "bad_request", str(err.detail))

    @app.exception_handler(Exception)
    async def failure(_: Request, err: Exception) -> JSONResponse:
        log.error("api request failed: %s", type(err).__name__, exc_info=err)
        return answer(500, "internal", "the front door failed: its log has the details")

    @app.post("/branches", status_code=201)
    def create(e: Engine, body: Annotated[CreateRequest, Body()]) -> BranchView:
        return e.create(body)

    @app.get("/branches/{name}")
    def branch(e: Engine, name: Name) -> BranchView:
        found = e.branch(name)
        if found is None:
            raise errors.BranchMissingError(f"no branch named {name}")
        return found

    @app.post("/branches/{name}/reset")
    def reset(e: Engine, name: Name, body: Annotated[OwnerRequest, Body()]) -> BranchView:
        return e.reset(name)

    @app.post("/branches/{name}/destroy")
    def destroy(e: Engine, name: Name, body: Annotated[OwnerRequest, Body()]) -> Destroyed:
        return e.destroy(name)

    @app.get("/branches/{name}/connection")
    def connection(e: Engine, name: Name) -> Connection:
        own = e.connection(name)
        # Through the door, which routes by the branch's name as the database (over TLS).
        return Connection(
            host=door_host, port=door_port, database=name, user=own.user, password=own.password
        )

    @app.put(
        "/branches/{name}/record",
        status_code=204,
        openapi_extra={limits.BODY_CAP_KEY: limits.MAX_RECORD_BODY_BYTES},
    )
    def record_put(e: Engine, name: Name, body: Annotated[RecordRequest, Body()]) -> None:
        e.save_record(name, body)

    @app.get("/branches/{name}/record")
    def record_get(e: Engine, name: Name) -> Record:
        found = e.branch(name)
        if found is None:
            raise errors.BranchMissingError(f"no branch named {name}")
        if found.record is None:
            raise errors.BranchMissingError(f"branch {name} has no record yet")
        return found.record

    @app.post("/branches/{name}/trace")
    def trace_begin(e: Engine, name: Name, body: Annotated[TraceRequest, Body()]) -> TraceMark:
        return e.trace_begin(name, body)

    @app.post("/branches/{name}/trace/mark")
    def trace_mark(e: Engine, name: Name, body: Annotated[OwnerRequest, Body()]) -> TraceMark:
        return e.trace_mark(name)

    @app.post("/branches/{name}/trace/end")
    def trace_end(e: Engine, name: Name, body: Annotated[OwnerRequest, Body()]) -> TraceMark:
        return e.trace_end(name)

    return app
