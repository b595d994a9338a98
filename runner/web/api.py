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

The routes mirror the socket's branch routes a workflow needs (create, get, reset, destroy,
connection, record, trace), with the same request bodies, answers, error bodies and body caps
(``service.limits``); a connection is answered through the front door's Postgres port. Every
request is logged with the verified repository and the status; a token never is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Body, Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from pgoverlay import errors
from pgoverlay.errors import PgoverlayError
from pgoverlay.runner.callers.oidc import Identity, Verifier
from pgoverlay.runner.callers.policy import Policy
from pgoverlay.runner.door.guard import client_of
from pgoverlay.runner.door.refusals import Refusals, claim_of
from pgoverlay.runner.service import acting, limits, tokens, vouch
from pgoverlay.runner.service.app import Name, status_of
from pgoverlay.runner.service.client import RemoteEngine, error_code
from pgoverlay.runner.service.models import (
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
    Destroyed,
    ErrorBody,
    GrantView,
    Layer,
    Record,
    TraceMark,
)
from pgoverlay.runner.service.vouch import Vouched

log = logging.getLogger(__name__)

PREFIX = "/api/v1"
# The engine, reached with the caller's credential (an OIDC token, or an API token and the
# repository its listener names), which the engine verifies itself: a RemoteEngine on the socket.
EngineFor = Callable[[str, "acting.Acting | None"], RemoteEngine]


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


Engine = Annotated[RemoteEngine, Depends(_caller)]


class HoldRequest(BaseModel):
    """Take a branch's hold for ``seconds`` (renewed by the holder), waiting at most ``wait``
    seconds for another job's to end."""

    model_config = ConfigDict(extra="forbid", strict=True)
    seconds: int = Field(default=120, ge=10, le=600)
    wait: int = Field(default=25, ge=0, le=50)


class Held(BaseModel):
    hold: str
    seconds: int


@dataclass
class _Hold:
    id: str
    until: float  # time.monotonic()


@dataclass
class Holds:
    """Which job holds each branch, by repository id and branch name: one job of a pull request
    at a time, whichever runner it landed on (the Action takes its branch's hold for its whole
    run). Kept in the door's memory: a door that restarts forgets them, and a job holding one
    renews it or loses it when it lapses. A repository may hold at most ``most`` at once."""

    most: int = 64
    _held: dict[tuple[int, str], _Hold] = field(default_factory=dict)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    def _lapse(self) -> None:
        now = time.monotonic()
        for key in [k for k, h in self._held.items() if h.until <= now]:
            del self._held[key]

    async def take(self, key: tuple[int, str], *, seconds: int, wait: float) -> str:
        deadline = time.monotonic() + wait
        async with self._changed:
            while True:
                self._lapse()
                held = self._held.get(key)
                if held is None:
                    if sum(k[0] == key[0] for k in self._held) >= self.most:
                        raise errors.LimitReachedError(
                            f"this repository's jobs hold {self.most} branches at once, the "
                            "most the pool allows: let some finish, then try again"
                        )
                    made = _Hold(secrets.token_urlsafe(16), time.monotonic() + seconds)
                    self._held[key] = made
                    return made.id
                now = time.monotonic()
                if now >= deadline:
                    raise errors.LockBusyError(
                        f"another job of this repository holds branch {key[1]} (for "
                        f"{held.until - now:.0f} s more unless it renews it): try again"
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._changed.wait(), timeout=min(deadline, held.until) - now
                    )

    async def renew(self, key: tuple[int, str], hold: str, *, seconds: int) -> None:
        async with self._changed:
            self._lapse()
            held = self._held.get(key)
            if held is None or not secrets.compare_digest(held.id, hold):
                raise errors.LockBusyError(
                    f"this job's hold on branch {key[1]} lapsed (another job may hold it now): "
                    "re-run the job"
                )
            held.until = time.monotonic() + seconds

    async def give_back(self, key: tuple[int, str], hold: str) -> bool:
        """True when ``hold`` was the branch's, and is given back now."""
        async with self._changed:
            held = self._held.get(key)
            if held is not None and secrets.compare_digest(held.id, hold):
                del self._held[key]
                self._changed.notify_all()
                return True
            return False


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
    app.add_middleware(
        limits.RequestCap, cap_of=lambda scope: limits.route_cap(app.router.routes, scope)
    )

    app.state.verifier = verifier
    app.state.policy = policy
    app.state.engine_for = engine_for
    app.state.ipv6_prefix = ipv6_prefix
    app.state.refusals = Refusals(
        failed_logins=failed_logins, failed_window=failed_window, clock=time.monotonic
    )
    app.state.door = door  # the door's own identity, which asks whether an API token is good
    holds = Holds()

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

    @app.get("/pool")
    def pool(e: Engine) -> dict[str, object]:
        return {
            "door_name": door_host,
            "door_port": door_port,
            "door_https_port": door_https_port,
            "app_sslmode": app_sslmode,
        }

    @app.get("/bases")
    def bases(e: Engine) -> list[BaseView]:
        return e.bases()

    @app.post("/branches", status_code=201)
    def create(e: Engine, request: Request, body: Annotated[CreateRequest, Body()]) -> BranchView:
        vouched: Vouched = request.state.vouched
        return e.create(body.replace(pr=vouch.for_pull_request(body.pr, vouched)))

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

    @app.get("/branches/{name}/size")
    def size(e: Engine, name: Name) -> Layer:
        return e.size(name)

    @app.post("/branches/{name}/access")
    def grant(e: Engine, name: Name, body: Annotated[GrantRequest, Body()]) -> GrantView:
        if not body.app or body.vouched_by is not None:
            raise errors.NotOwnerError(
                'a workflow may ask only for its pull request\'s app credential (`{"app": '
                "true}`): a person gets theirs on the branch's page"
            )
        return e.grant(name, body)

    @app.post("/branches/{name}/hold")
    async def hold(
        e: Engine, request: Request, name: Name, body: Annotated[HoldRequest, Body()]
    ) -> Held:
        key = (request.state.vouched.repository_id, name)
        made = await holds.take(key, seconds=body.seconds, wait=body.wait)
        return Held(hold=made, seconds=body.seconds)

    @app.post("/branches/{name}/hold/{hold}/renew")
    async def renew(e: Engine, request: Request, name: Name, hold: str) -> Held:
        key = (request.state.vouched.repository_id, name)
        await holds.renew(key, hold, seconds=120)
        return Held(hold=hold, seconds=120)

    @app.delete("/branches/{name}/hold/{hold}", status_code=204)
    async def give_back(e: Engine, request: Request, name: Name, hold: str) -> None:
        if await holds.give_back((request.state.vouched.repository_id, name), hold):
            # The job that held the branch ended: the credential it was given goes with it
            # (another repository's branch of that name, which it held the name of, keeps its).
            with contextlib.suppress(errors.NotOwnerError):
                await asyncio.to_thread(e.end_job, name)

    @app.get("/branches/{name}/connection")
    def connection(e: Engine, name: Name) -> Connection:
        # The engine mints the job's own credential (never the branch role's password, which
        # PR SQL can change): the door admits it as it does every grant.
        own = e.connection(name)
        # Through the door, which routes by the branch's name as the database (over TLS).
        return Connection(
            host=door_host,
            port=door_port,
            database=name,
            user=own.user,
            password=own.password,
            sslmode="verify-full",
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
