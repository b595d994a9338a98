"""What one request may take of the engine service, a root process its callers do not control.

- **Bodies.** Every route takes at most ``MAX_BODY_BYTES`` (the largest request but a record,
  a create with every field at its longest, is under 500 bytes); a route that takes more says
  so in its OpenAPI operation (``BODY_CAP_KEY``): a record's takes ``MAX_RECORD_BODY_BYTES``,
  its largest valid record as a JSON string. ``RequestCap`` answers a declared Content-Length over
  the cap 413 before reading a byte of it, and counts a body without one (chunked) as it is
  read, answering 413 the moment it passes the cap. Either answer closes the connection.
- **Heads.** A request's target and headers over ``MAX_HEAD_BYTES`` are answered 431; h11
  stops buffering a head at that size too (400), so one sent slowly is cut there.
- **Time** and **connections** are the protocol's (``protocol.PeerCredProtocol``): a caller has
  ``service_request_timeout`` seconds for its whole request, and one uid at most
  ``service_connections_per_user`` connections open at once.

Answers the service writes outside FastAPI (``raw_answer``) are its usual ``ErrorBody`` JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pgoverlay.errors import RequestTooLargeError
from pgoverlay.runner.service.client import error_code
from pgoverlay.runner.service.models import MAX_RECORD_BYTES

MAX_BODY_BYTES = 4096
# A record's text is JSON (at most MAX_RECORD_BYTES as UTF-8), sent as a JSON string: escaped
# the way json.dumps does by default, a byte of it takes at most 6 (U+007F as \u007f), so
# every record a release of the client may send fits.
MAX_RECORD_BODY_BYTES = 6 * MAX_RECORD_BYTES + MAX_BODY_BYTES
MAX_HEAD_BYTES = 8192
# The OpenAPI extension a route's operation states its own cap in.
BODY_CAP_KEY = "x-max-body-bytes"


def raw_answer(status: int, code: str, message: str) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection, its body an ``ErrorBody``: for the
    protocol's refusals, which no route answers."""
    body = json.dumps({"code": code, "message": message}).encode()
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


def route_cap(routes: list[Any], scope: Scope) -> int:
    """The body cap of the route ``scope`` asks for: its operation's ``BODY_CAP_KEY``, else
    ``MAX_BODY_BYTES`` (also for a path no route serves)."""
    for route in routes:
        matched, _ = route.matches(scope)
        if matched is Match.FULL:
            extra = getattr(route, "openapi_extra", None) or {}
            return int(extra.get(BODY_CAP_KEY, MAX_BODY_BYTES))
    return MAX_BODY_BYTES


async def _too_large(send: Send, cap: int, *, what: str = "body", status: int = 413) -> None:
    message = (
        f"the request's {what} is over {cap} bytes, the most this operation takes: send "
        "what docs/service-openapi.json describes (the `pgoverlay` client does)"
    )
    body = json.dumps({"code": error_code(RequestTooLargeError), "message": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


def head_size(scope: Scope) -> int:
    """About the bytes of a request's head: its target and each header as sent."""
    size = len(scope["raw_path"]) + len(scope["query_string"])
    return size + sum(len(name) + len(value) + 4 for name, value in scope["headers"])


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:  # h11 refuses such a request before it gets here
                return None
    return None


class RequestCap:
    """ASGI middleware: a request's head held to ``MAX_HEAD_BYTES`` (431) and its body to
    ``cap_of(scope)`` bytes (413; see the module's docstring). Over the body's, the caller gets
    413 and the application an ``http.disconnect``; what the application answers then is
    dropped."""

    def __init__(self, app: ASGIApp, *, cap_of: Callable[[Scope], int]) -> None:
        self.app = app
        self.cap_of = cap_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if head_size(scope) > MAX_HEAD_BYTES:
            await _too_large(send, MAX_HEAD_BYTES, what="head (target and headers)", status=431)
            return
        cap = self.cap_of(scope)
        declared = _declared_length(scope)
        if declared is not None and declared > cap:
            await _too_large(send, cap)
            return
        taken = 0
        answered = False

        async def counted() -> Message:
            nonlocal taken, answered
            if answered:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                taken += len(message.get("body", b""))
                if taken > cap:
                    answered = True
                    await _too_large(send, cap)
                    return {"type": "http.disconnect"}
            return message

        async def unless_answered(message: Message) -> None:
            if not answered:
                await send(message)

        await self.app(scope, counted, unless_answered)
