"""The network API's branches: the socket's branch routes a workflow needs (create, get,
reset, destroy, size, its app credential, connection, record, trace), with the same request
bodies, answers, error bodies and body caps (``service.limits``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body

from pgoverlay import errors
from pgoverlay.runner.service import limits, vouch
from pgoverlay.runner.service.answers import Name
from pgoverlay.runner.service.models import (
    CreateRequest,
    GrantRequest,
    OwnerRequest,
    RecordRequest,
    TraceRequest,
)
from pgoverlay.runner.service.views import (
    BranchView,
    Connection,
    Destroyed,
    GrantView,
    Layer,
    Record,
    TraceMark,
)
from pgoverlay.runner.web.deps import Admitted, Door, Engine

router = APIRouter(prefix="/branches")


@router.post("", status_code=201)
def create(e: Engine, vouched: Admitted, body: Annotated[CreateRequest, Body()]) -> BranchView:
    return e.create(body.replace(pr=vouch.for_pull_request(body.pr, vouched)))


@router.get("/{name}")
def branch(e: Engine, name: Name) -> BranchView:
    found = e.branch(name)
    if found is None:
        raise errors.BranchMissingError(f"no branch named {name}")
    return found


@router.post("/{name}/reset")
def reset(e: Engine, name: Name, body: Annotated[OwnerRequest, Body()]) -> BranchView:
    return e.reset(name)


@router.post("/{name}/destroy")
def destroy(e: Engine, name: Name, body: Annotated[OwnerRequest, Body()]) -> Destroyed:
    return e.destroy(name)


@router.get("/{name}/size")
def size(e: Engine, name: Name) -> Layer:
    return e.size(name)


@router.post("/{name}/access")
def grant(e: Engine, name: Name, body: Annotated[GrantRequest, Body()]) -> GrantView:
    if not body.app or body.vouched_by is not None:
        raise errors.NotOwnerError(
            'a workflow may ask only for its pull request\'s app credential (`{"app": '
            "true}`): a person gets theirs on the branch's page"
        )
    return e.grant(name, body)


@router.get("/{name}/connection")
def connection(e: Engine, door: Door, name: Name) -> Connection:
    # The engine mints the job's own credential (never the branch role's password, which
    # PR SQL can change): the door admits it as it does every grant.
    own = e.connection(name)
    # Through the door, which routes by the branch's name as the database (over TLS).
    return Connection(
        host=door.host,
        port=door.port,
        database=name,
        user=own.user,
        password=own.password,
        sslmode="verify-full",
    )


@router.put(
    "/{name}/record",
    status_code=204,
    openapi_extra={limits.BODY_CAP_KEY: limits.MAX_RECORD_BODY_BYTES},
)
def record_put(e: Engine, name: Name, body: Annotated[RecordRequest, Body()]) -> None:
    e.save_record(name, body)


@router.get("/{name}/record")
def record_get(e: Engine, name: Name) -> Record:
    found = e.branch(name)
    if found is None:
        raise errors.BranchMissingError(f"no branch named {name}")
    if found.record is None:
        raise errors.BranchMissingError(f"branch {name} has no record yet")
    return found.record


@router.post("/{name}/trace")
def trace_begin(e: Engine, name: Name, body: Annotated[TraceRequest, Body()]) -> TraceMark:
    return e.trace_begin(name, body)


@router.post("/{name}/trace/mark")
def trace_mark(e: Engine, name: Name, body: Annotated[OwnerRequest, Body()]) -> TraceMark:
    return e.trace_mark(name)


@router.post("/{name}/trace/end")
def trace_end(e: Engine, name: Name, body: Annotated[OwnerRequest, Body()]) -> TraceMark:
    return e.trace_end(name)
