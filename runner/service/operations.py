"""Each operation of the engine, declared once: its HTTP verb and path on the service's socket,
its request (a ``models`` class, sent as the body) and answer (a ``views`` class), how the
engine's method takes them, and whether the network API serves it too.

Derived from ``OPERATIONS``: the socket's routes (``routes.add_socket_routes``, called by
``app.create_app``), the network API's routes for the operations it serves
(``routes.add_network_routes``), every request the clients send and how they read its answer
(``client.RemoteEngine.call``, which ``netclient.NetworkEngine`` inherits), and the list of
wire types (``tests/test_wire.py``). Adding an operation: declare it here, write the engine's
method (``engine.LocalEngine`` and the ``Engine`` protocol), the client's one-line method that
calls it, and a test.

How an operation's HTTP request becomes the engine's call, for every route alike: the path's
parameters are the method's first arguments, in order; the body is the next one
(``passes="request"``), or only its ``repository`` is, as that keyword (``"repository"``), or
it is read and checked but not passed on (``"nothing"``); each query parameter (a flag, false
unless asked) is the keyword of its name. The network API passes no query parameter and no
``repository`` (the door vouches for the token's repository instead, ``vouch``).

Lean on purpose: the CLI's read-only commands import this through the client, so the request
models (which bring the runtimes' table) are named, not imported, until a server builds its
routes.
"""

from __future__ import annotations

import re
import typing
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar
from urllib.parse import quote

from pgoverlay.runner.service import views
from pgoverlay.runner.service.shape import Shape

if TYPE_CHECKING:
    from pgoverlay.runner.service import models

Req = TypeVar("Req", bound="Shape | None")
Ans = TypeVar("Ans")

# The socket's API root; the network API's is ``netclient.PREFIX``.
API = "/v1"

Passes = Literal["request", "repository", "nothing"]
_PARAMETER = re.compile(r"\{(\w+)\}")


class Op(Generic[Req, Ans]):
    """One engine operation. ``Req`` is its request's type (None: it has no body), ``Ans`` its
    answer's (``answer`` at run time: a ``views`` class, a list of one, or None for 204).

    ``name`` is the route's (the OpenAPI ``operationId`` is made from it) and, unless
    ``method`` says otherwise, the engine's method's. ``status`` is the socket's status for a
    success, ``network_status`` the network API's when it differs. ``written_as_made``: the
    answer is written as the engine made it, without FastAPI checking it again on its way out
    (the list of every branch, and the lookup of one, which the front door makes on each
    connection). ``record_body``: its body may take
    ``limits.MAX_RECORD_BODY_BYTES`` (a record), not ``limits.MAX_BODY_BYTES``."""

    __slots__ = (
        "answer",
        "method",
        "name",
        "network",
        "network_status",
        "parameters",
        "passes",
        "path",
        "query",
        "record_body",
        "request",
        "status",
        "verb",
        "written_as_made",
    )

    def __init__(
        self,
        name: str,
        verb: Literal["GET", "POST", "PUT"],
        path: str,
        *,
        answer: Any,
        request: str | None = None,
        passes: Passes | None = None,
        method: str | None = None,
        query: tuple[str, ...] = (),
        status: int = 200,
        network: bool = False,
        network_status: int | None = None,
        written_as_made: bool = False,
        record_body: bool = False,
    ) -> None:
        self.name = name
        self.verb = verb
        self.path = path
        self.answer = answer
        self.request = request  # the name of its class in ``models``
        self.passes: Passes = passes or ("nothing" if request is None else "request")
        self.method = method or name
        self.query = query
        self.status = status
        self.network = network
        self.network_status = network_status or status
        self.written_as_made = written_as_made
        self.record_body = record_body
        self.parameters: tuple[str, ...] = tuple(_PARAMETER.findall(path))

    def __repr__(self) -> str:
        return f"Op({self.name!r}, {self.verb} {self.path})"

    def target(self, *values: str, **query: bool) -> str:
        """The path relative to the API's root for the path's parameters ``values`` (each
        quoted whole) and the query's flags."""
        if len(values) != len(self.parameters):
            raise TypeError(f"{self.name} takes {len(self.parameters)} path parameters")
        given = iter(values)
        path = _PARAMETER.sub(lambda _: quote(next(given), safe=""), self.path)
        if set(query) - set(self.query):
            raise TypeError(f"{self.name} takes no query {sorted(set(query) - set(self.query))}")
        flags = "&".join(f"{q}={str(query.get(q, False)).lower()}" for q in self.query)
        return f"{path}?{flags}" if flags else path

    def answer_types(self) -> list[type]:
        """The wire types its answer is made of (none for 204)."""
        kind = self.answer
        if typing.get_origin(kind) is list:
            kind = typing.get_args(kind)[0]
        return [] if kind is None else [kind]


BASES: Op[None, list[views.BaseView]] = Op(
    "bases", "GET", "/bases", answer=list[views.BaseView], network=True
)
BASE_WORKLOAD: Op[None, views.BaseWorkload] = Op(
    "base_workload", "GET", "/bases/{name}/workload", answer=views.BaseWorkload
)
BRANCHES: Op[None, list[views.BranchView]] = Op(
    "branch_list",
    "GET",
    "/branches",
    method="branches",
    answer=list[views.BranchView],
    query=("layer",),
    written_as_made=True,  # a thousand branches: FastAPI's check cost more than making them
)
CREATE: Op[models.CreateRequest, views.BranchView] = Op(
    "create",
    "POST",
    "/branches",
    request="CreateRequest",
    answer=views.BranchView,
    status=201,
    network=True,
)
BRANCH: Op[None, views.BranchView] = Op(
    "branch",
    "GET",
    "/branches/{name}",
    answer=views.BranchView,  # the engine's None is answered 404 (BranchMissingError)
    query=("layer",),
    network=True,
    written_as_made=True,  # the front door's lookup, on each connection
)
RESET: Op[models.OwnerRequest, views.BranchView] = Op(
    "reset",
    "POST",
    "/branches/{name}/reset",
    request="OwnerRequest",
    passes="repository",
    answer=views.BranchView,
    network=True,
)
DESTROY: Op[models.OwnerRequest, views.Destroyed] = Op(
    "destroy",
    "POST",
    "/branches/{name}/destroy",
    request="OwnerRequest",
    passes="repository",
    answer=views.Destroyed,
    network=True,
)
SUSPEND: Op[models.OwnerRequest, views.BranchView] = Op(
    "suspend",
    "POST",
    "/branches/{name}/suspend",
    request="OwnerRequest",
    passes="repository",
    answer=views.BranchView,
)
WAKE: Op[models.OwnerRequest, views.BranchView] = Op(
    "wake",
    "POST",
    "/branches/{name}/wake",
    request="OwnerRequest",
    passes="repository",
    answer=views.BranchView,
)
CONNECTION: Op[None, views.Connection] = Op(
    "connection", "GET", "/branches/{name}/connection", answer=views.Connection, network=True
)
SIZE: Op[None, views.Layer] = Op(
    "size", "GET", "/branches/{name}/size", answer=views.Layer, network=True
)
RECORD: Op[models.RecordRequest, None] = Op(
    "record",
    "PUT",
    "/branches/{name}/record",
    method="save_record",
    request="RecordRequest",
    answer=None,
    status=204,
    network=True,
    record_body=True,
)
TRACE_BEGIN: Op[models.TraceRequest, views.TraceMark] = Op(
    "trace_begin",
    "POST",
    "/branches/{name}/trace",
    request="TraceRequest",
    answer=views.TraceMark,
    network=True,
)
TRACE_MARK: Op[models.OwnerRequest, views.TraceMark] = Op(
    "trace_mark",
    "POST",
    "/branches/{name}/trace/mark",
    request="OwnerRequest",
    passes="repository",
    answer=views.TraceMark,
    network=True,
)
TRACE_END: Op[models.OwnerRequest, views.TraceMark] = Op(
    "trace_end",
    "POST",
    "/branches/{name}/trace/end",
    request="OwnerRequest",
    passes="repository",
    answer=views.TraceMark,
    network=True,
)
GRANT: Op[models.GrantRequest, views.GrantView] = Op(
    "grant",
    "POST",
    "/branches/{name}/access",
    request="GrantRequest",
    answer=views.GrantView,
    status=201,
    network=True,
    network_status=200,  # as the network API has answered it since its first release
)
GRANTS: Op[None, list[views.GrantView]] = Op(
    "grants", "GET", "/branches/{name}/access", answer=list[views.GrantView]
)
REVOKE: Op[models.OwnerRequest, views.Revoked] = Op(
    "revoke",
    "POST",
    "/branches/{name}/access/{login}/revoke",
    request="OwnerRequest",
    passes="repository",
    answer=views.Revoked,
)
END_JOB: Op[models.OwnerRequest, views.Revoked] = Op(
    "end_job",
    "POST",
    "/branches/{name}/job/end",
    request="OwnerRequest",
    passes="nothing",  # the job that ended is the vouched repository's
    answer=views.Revoked,
)
CHECK_CREDENTIAL: Op[models.CredentialCheck, views.Credential] = Op(
    "check_credential",
    "POST",
    "/credentials/check",
    request="CredentialCheck",
    answer=views.Credential,
)
GC: Op[None, views.GcReport] = Op("gc", "POST", "/gc", answer=views.GcReport)

OPERATIONS: tuple[Op[Any, Any], ...] = (
    BASES,
    BASE_WORKLOAD,
    BRANCHES,
    CREATE,
    BRANCH,
    RESET,
    DESTROY,
    SUSPEND,
    WAKE,
    CONNECTION,
    SIZE,
    RECORD,
    TRACE_BEGIN,
    TRACE_MARK,
    TRACE_END,
    GRANT,
    GRANTS,
    REVOKE,
    END_JOB,
    CHECK_CREDENTIAL,
    GC,
)
