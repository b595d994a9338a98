"""Each engine operation is declared once (``runner/service/operations.py``): the socket's routes
are made from the declarations, the client sends each through them, and the engine, its
protocol and both clients have a method for each. A route or an engine method added beside
the declarations, or a declaration whose types are not the ones it sends and answers, fails
here."""

from __future__ import annotations

import inspect
import typing
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute

from pgoverlay.runner.callers import policy
from pgoverlay.runner.callers.oidc import Verifier
from pgoverlay.runner.service import models, operations
from pgoverlay.runner.service.app import create_app
from pgoverlay.runner.service.client import RemoteEngine
from pgoverlay.runner.service.engine import Engine, LocalEngine
from pgoverlay.runner.service.netclient import NetworkEngine
from pgoverlay.runner.service.operations import API, OPERATIONS, Op
from pgoverlay.runner.settings import Settings
from pgoverlay.runner.web import api

NOT_OPERATIONS = {"close"}  # the Engine protocol's methods that send nothing


def _declared() -> dict[str, Op[Any, Any]]:
    return {name: op for name, op in vars(operations).items() if isinstance(op, Op)}


def test_every_declared_operation_is_listed_once() -> None:
    assert sorted(_declared().values(), key=id) == sorted(OPERATIONS, key=id)
    assert len({op.name for op in OPERATIONS}) == len(OPERATIONS)
    assert len({(op.verb, op.path) for op in OPERATIONS}) == len(OPERATIONS)


@pytest.mark.parametrize("name", sorted(_declared()))
def test_an_operations_declared_types_are_those_it_sends_and_answers(name: str) -> None:
    """``Op[Req, Ans]`` is what mypy checks a caller against; ``request`` and ``answer`` what
    the routes read and the client decodes: they are the same types."""
    op = _declared()[name]
    hint = typing.get_type_hints(operations, localns={"models": models})[name]
    request, answer = typing.get_args(hint)
    assert request is (type(None) if op.request is None else getattr(models, op.request))
    assert answer == (type(None) if op.answer is None else op.answer)
    assert op.request is not None or op.passes == "nothing"
    assert op.passes != "repository" or op.request == "OwnerRequest"


def test_the_sockets_routes_are_the_declared_operations_and_its_health() -> None:
    app = create_app(Settings())
    routes = {
        (route.name, method, route.path)
        for route in app.routes
        if isinstance(route, APIRoute)
        for method in route.methods or ()
    }
    declared = {(op.name, op.verb, API + op.path) for op in OPERATIONS}
    assert routes == declared | {("health", "GET", f"{API}/health")}


def test_the_network_apis_routes_are_the_declared_network_operations_and_its_own() -> None:
    """The network API serves the operations declared for it (``network=True``), beside its
    own routes (the holds, a record's read, the pool's way in)."""
    door = RemoteEngine(Path("/nonexistent/service.sock"))
    served = api.create_api(
        verifier=Verifier("https://token.actions.githubusercontent.com", "https://pool.test"),
        policy=policy.parse(b"owners: [acme]\n", name="policy.yml"),
        engine_for=lambda token, named: door,
        door=door,
        door_host="pool.test",
        door_port=5432,
        door_https_port=8443,
        app_sslmode="verify-full",
        failed_logins=10,
        failed_window=300.0,
        ipv6_prefix=64,
    )
    # FastAPI keeps an included router's routes in the router (the app's list holds none of
    # them): the routers' routes (api.ROUTES, whose body caps the app reads) name each, and the
    # app's OpenAPI document says they are what it serves.
    routes = {
        (route.name, method, route.path)
        for route in api.ROUTES
        if isinstance(route, APIRoute)
        for method in route.methods or ()
    }
    paths = served.openapi()["paths"]
    assert {(verb.upper(), path) for path in paths for verb in paths[path]} == {
        (method, path) for _, method, path in routes
    }
    declared = {(op.name, op.verb, op.path) for op in OPERATIONS if op.network}
    own = {
        ("pool", "GET", "/pool"),
        ("hold", "POST", "/branches/{name}/hold"),
        ("renew", "POST", "/branches/{name}/hold/{hold}/renew"),
        ("give_back", "DELETE", "/branches/{name}/hold/{hold}"),
        ("record_get", "GET", "/branches/{name}/record"),
    }
    assert routes == declared | own


def test_the_engine_its_protocol_and_both_clients_have_each_operations_method() -> None:
    """An engine method the protocol adds is an operation only once it is declared, and a
    declared operation calls a method every engine has, taking the path's parameters first."""
    protocol = {
        name
        for name, _ in inspect.getmembers(Engine, inspect.isfunction)
        if not name.startswith("_")
    }
    assert protocol - NOT_OPERATIONS == {op.method for op in OPERATIONS}
    for op in OPERATIONS:
        for engine in (LocalEngine, RemoteEngine, NetworkEngine):
            method = getattr(engine, op.method)
            positional = [
                p.name
                for p in inspect.signature(method).parameters.values()
                if p.kind is p.POSITIONAL_OR_KEYWORD and p.name != "self"
            ]
            assert positional[: len(op.parameters)] == list(op.parameters), (engine, op)
            keywords = set(inspect.signature(method).parameters)
            assert set(op.query) <= keywords, (engine, op)
            assert op.passes != "repository" or "repository" in keywords, (engine, op)


def test_a_target_quotes_each_path_parameter_whole_and_states_each_flag() -> None:
    assert operations.REVOKE.target("pr-1", "app_x/y") == "/branches/pr-1/access/app_x%2Fy/revoke"
    assert operations.BRANCH.target("pr-1") == "/branches/pr-1?layer=false"
    assert operations.BRANCHES.target(layer=True) == "/branches?layer=true"
    with pytest.raises(TypeError):
        operations.SIZE.target()
    with pytest.raises(TypeError):
        operations.SIZE.target("pr-1", layer=True)
