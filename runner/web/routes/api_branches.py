"""The network API's branches and bases: the routes of the engine's operations the network
serves (``operations.OPERATIONS`` with ``network``: the bases; a branch's create, get, reset,
destroy, size, app credential, connection, record and trace), made from their declarations as
the socket's are (``routes.add_network_routes``), with the same request bodies, answers, error
bodies and body caps (``service.limits``). Three are acts of the network's own: a create for the
token's pull request, the app's grant alone, a connection through the door. A record's read is
the network's alone."""

from __future__ import annotations

from fastapi import APIRouter, Request

from pgoverlay import errors
from pgoverlay.runner.service import routes, vouch
from pgoverlay.runner.service.answers import Name
from pgoverlay.runner.service.client import RemoteEngine
from pgoverlay.runner.service.models import CreateRequest, GrantRequest
from pgoverlay.runner.service.views import BranchView, Connection, GrantView, Record
from pgoverlay.runner.web.deps import Admitted, Door, Engine

router = APIRouter()


def create(e: RemoteEngine, _: Request, *, body: CreateRequest, vouched: Admitted) -> BranchView:
    return e.create(body.replace(pr=vouch.for_pull_request(body.pr, vouched)))


def grant(e: RemoteEngine, _: Request, *, name: str, body: GrantRequest) -> GrantView:
    if not body.app or body.vouched_by is not None:
        raise errors.NotOwnerError(
            'a workflow may ask only for its pull request\'s app credential (`{"app": '
            "true}`): a person gets theirs on the branch's page"
        )
    return e.grant(name, body)


def connection(e: RemoteEngine, _: Request, *, name: str, door: Door) -> Connection:
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


# The engine's operations the network serves, three with the acts above (an act's dependencies,
# ``Admitted`` and ``Door``, are its route's).
routes.add_network_routes(
    router, Engine, {"create": create, "grant": grant, "connection": connection}
)


@router.get("/branches/{name}/record")
def record_get(e: Engine, name: Name) -> Record:
    found = e.branch(name)
    if found is None:
        raise errors.BranchMissingError(f"no branch named {name}")
    if found.record is None:
        raise errors.BranchMissingError(f"branch {name} has no record yet")
    return found.record
