"""The engine's operations (``operations.OPERATIONS``) as FastAPI routes: every route of the
service's socket, and those of the network API for the operations it serves, made from each
operation's declaration by one rule (``operations`` states it).

A route validates its path's parameters (``Name``, ``Login``), its query's flags and its body
(the request's class in ``models``) before it runs, then calls the engine's method and answers
what it returns. Which engine it calls is the app's own dependency (``engine``): the socket's
``LocalEngine`` for the peer's uid, the network API's ``RemoteEngine`` for the verified token.
Nothing here runs as root or imports what does.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Body, FastAPI, Query, Request
from fastapi.responses import JSONResponse
from pydantic import StringConstraints

from pgoverlay import errors
from pgoverlay.runner.service import limits, models
from pgoverlay.runner.service.answers import Name
from pgoverlay.runner.service.models import LOGIN_PATTERN
from pgoverlay.runner.service.operations import API, OPERATIONS, Op
from pgoverlay.runner.service.shape import as_dict

# A credential's login in a path: a GitHub login, or the name of a preview app's or a job's role.
Login = Annotated[
    str,
    StringConstraints(
        pattern=f"^(?:{LOGIN_PATTERN[1:-1]}|(?:app|job)_[a-z0-9_]{{1,59}})$", max_length=63
    ),
]
# What each parameter an operation's path names is.
PATH_PARAMETERS: dict[str, Any] = {"name": Name, "login": Login}

# A network route's own act, instead of the engine's method alone: called with the engine, the
# request, and the route's parameters by name (its body as ``body``); returns the answer. A
# keyword-only parameter of its own beyond those (a FastAPI dependency, by its annotation) is
# the route's too.
Act = Callable[..., Any]
# Where routes are added: an app, or a router an app includes.
Routes = FastAPI | APIRouter


def invoke(op: Op[Any, Any], engine: Any, params: Mapping[str, Any], *, network: bool) -> Any:
    """The engine's method of ``op`` called with a route's parameters, as ``operations`` says;
    for the network API, without the query's flags and the body's ``repository``."""
    args = [params[name] for name in op.parameters]
    kwargs = {} if network else {flag: params[flag] for flag in op.query}
    if op.passes == "request":
        args.append(params["body"])
    elif op.passes == "repository" and not network:
        kwargs["repository"] = params["body"].repository
    answer = getattr(engine, op.method)(*args, **kwargs)
    if answer is None and op.answer is not None:  # a lookup's: no such branch
        hint = "" if network else ": see `pgoverlay branch list`"
        raise errors.BranchMissingError(f"no branch named {params['name']}{hint}")
    return answer


def _signature(
    op: Op[Any, Any], engine: Any, *, network: bool, act: Act | None = None
) -> inspect.Signature:
    """The route's parameters as FastAPI reads them: the engine (the app's dependency), the
    request, the path's parameters, the body and the query's flags, then ``act``'s own."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    found = [
        inspect.Parameter("e", keyword, annotation=engine),
        inspect.Parameter("request", keyword, annotation=Request),
    ]
    found += [
        inspect.Parameter(name, keyword, annotation=PATH_PARAMETERS[name]) for name in op.parameters
    ]
    if op.request is not None:
        model = getattr(models, op.request)
        found.append(inspect.Parameter("body", keyword, annotation=Annotated[model, Body()]))
    if not network:
        found += [
            inspect.Parameter(flag, keyword, annotation=Annotated[bool, Query()], default=False)
            for flag in op.query
        ]
    if act is not None:
        taken = {p.name for p in found} | {"e", "request"}
        found += [
            p
            for p in inspect.signature(act, eval_str=True).parameters.values()
            if p.kind is keyword and p.name not in taken
        ]
    return inspect.Signature(found)


def add_route(
    app: Routes,
    op: Op[Any, Any],
    engine: Any,
    *,
    prefix: str,
    network: bool = False,
    act: Act | None = None,
) -> None:
    """The route of ``op`` on ``app``, at ``prefix`` + its path, calling ``engine`` (an
    ``Annotated`` dependency) as ``operations`` says, or ``act`` (a network route's own)."""

    def endpoint(*, e: Any, request: Request, **params: Any) -> Any:
        if act is not None:
            answer = act(e, request, **params)
        else:
            answer = invoke(op, e, params, network=network)
        if op.written_as_made:
            return JSONResponse(as_dict(answer))
        return answer

    endpoint.__signature__ = _signature(  # type: ignore[attr-defined]
        op, engine, network=network, act=act
    )
    endpoint.__doc__ = None
    extra = {limits.BODY_CAP_KEY: limits.MAX_RECORD_BODY_BYTES} if op.record_body else None
    app.add_api_route(
        prefix + op.path,
        endpoint,
        methods=[op.verb],
        name=op.name,
        response_model=op.answer,
        status_code=op.network_status if network else op.status,
        openapi_extra=extra,
    )


def add_socket_routes(app: FastAPI, engine: Any) -> None:
    """Every operation's route on the service's socket, at ``API``."""
    for op in OPERATIONS:
        add_route(app, op, engine, prefix=API)


def add_network_routes(app: Routes, engine: Any, acts: Mapping[str, Act]) -> None:
    """The route of every operation the network API serves, relative to where the API is
    mounted, on ``app`` (or a router the API includes); ``acts`` holds the network's own act of
    an operation, by its name."""
    unknown = set(acts) - {op.name for op in OPERATIONS if op.network}
    if unknown:
        raise ValueError(f"no network operation named {', '.join(sorted(unknown))}")
    for op in OPERATIONS:
        if op.network:
            add_route(app, op, engine, prefix="", network=True, act=acts.get(op.name))
