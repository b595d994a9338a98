"""The engine service's answer to the front door's lookup of a branch (made on each connection
through the door) stays lean: no middleware runs each answer through a task and a stream of
its own, and the view is written as the engine made it, not checked again by FastAPI on its
way out; the door asks from its event loop's own thread, handing the request to no thread
of its own. The app is called in-process, as uvicorn calls it, with the caller's peer
credentials in the request's state as ``protocol.PeerCredProtocol`` puts them there."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import fastapi.routing
import pytest
from starlette.middleware.base import BaseHTTPMiddleware

from helpers import Undo
from pgoverlay.errors import ServiceError
from pgoverlay.runner import branch
from pgoverlay.runner.pool import Pool
from pgoverlay.runner.pool.registry import BaseVersion
from pgoverlay.runner.service import kept
from pgoverlay.runner.service.app import create_app
from pgoverlay.runner.service.client import RemoteEngine
from pgoverlay.runner.service.engine import LocalEngine
from pgoverlay.runner.service.protocol import Peer
from pgoverlay.runner.service.shape import as_dict
from pgoverlay.runner.service.views import BranchView

ROOT = Peer(pid=1, uid=0, gid=0)


def call(app: Any, method: str, path: str, *, body: bytes = b"") -> tuple[int, bytes]:
    """One request to ``app`` as uvicorn makes it for root on the service's socket."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"localhost"), (b"content-length", str(len(body)).encode())],
        "client": None,
        "server": None,
        "state": {"peer": ROOT},
    }
    sent: list[dict[str, Any]] = []
    given = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return given.pop(0) if given else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_no_middleware_of_the_service_runs_each_answer_through_a_task_of_its_own(
    pool: Pool,
) -> None:
    app = create_app(pool.settings)
    kinds = [m.cls for m in app.user_middleware]
    assert kinds, "the service's app has its audit and its caps"
    assert not [k for k in kinds if isinstance(k, type) and issubclass(k, BaseHTTPMiddleware)]


def test_the_lookup_of_a_branch_is_written_as_the_engine_made_it(
    pool: Pool,
    base: BaseVersion,
    undo: Undo,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    undo.branch("lean-look")
    branch.create(pool, "lean-look", base_name=base.name)
    checked: list[object] = []
    real = fastapi.routing.serialize_response

    async def counted(*args: Any, **kwargs: Any) -> Any:
        checked.append(kwargs.get("response_content"))
        return await real(*args, **kwargs)

    monkeypatch.setattr(fastapi.routing, "serialize_response", counted)
    app = create_app(pool.settings)
    with caplog.at_level(logging.INFO, logger="pgoverlay.service"):
        status, body = call(app, "GET", "/v1/branches/lean-look")
        missing, said = call(app, "GET", "/v1/branches/lean-nothing")
        over, _ = call(app, "POST", "/v1/branches", body=b"{" + b" " * (1 << 21) + b"}")
    assert status == 200, body
    expected = as_dict(LocalEngine(pool).branch("lean-look"))
    assert json.loads(body) == json.loads(json.dumps(expected))
    assert checked == []  # not re-validated on its way out
    assert missing == 404 and json.loads(said)["code"] == "branch_missing"
    assert over == 413
    # Each request is still in the service's log, with the caller and what it got.
    logged = caplog.text
    assert "uid=0 pid=1 GET /v1/branches/lean-look -> 200" in logged
    assert "uid=0 pid=1 GET /v1/branches/lean-nothing -> 404" in logged
    assert "uid=0 pid=1 POST /v1/branches -> 413" in logged


def test_the_doors_lookup_from_its_event_loop_is_the_lookup_from_a_thread(
    service: Path, pool: Pool, base: BaseVersion, undo: Undo, tmp_path: Path
) -> None:
    """The front door asks the engine about a branch from its event loop's own thread
    (``RemoteEngine.look``): the same answer as ``branch``, None for a branch there is not, and
    the same error when the service cannot be reached."""
    undo.branch("lean-loop")
    branch.create(pool, "lean-loop", base_name=base.name)
    engine = RemoteEngine(service, timeout=30.0)
    assert asyncio.run(engine.look("lean-loop")) == engine.branch("lean-loop")
    assert asyncio.run(engine.look("lean-none")) is None
    gone = RemoteEngine(tmp_path / "no.sock", timeout=5.0)
    with pytest.raises(ServiceError) as raised:
        asyncio.run(gone.look("lean-loop"))
    with pytest.raises(ServiceError) as again:
        gone.branch("lean-loop")
    assert str(raised.value) == str(again.value)


def test_the_doors_lookups_keep_their_connection_and_each_is_answered_afresh(
    service: Path, pool: Pool, base: BaseVersion, undo: Undo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The door's lookups reuse one connection to the service, kept open between them (no
    connect per client's set-up), and every lookup is still asked: a branch destroyed
    between two lookups is gone for the second. A kept connection the service closed (its
    keep-alive passed) is not an error: the lookup is asked again on a new one."""
    undo.branch("lean-kept")
    branch.create(pool, "lean-kept", base_name=base.name)
    engine = RemoteEngine(service, timeout=30.0)
    monkeypatch.setattr(kept, "FRESH_SECONDS", 600.0)  # reuse one the service has closed

    async def lookups() -> list[BranchView | None]:
        loop = asyncio.get_running_loop()
        seen = [await engine.look("lean-kept") for _ in range(3)]
        asker = engine._kept[loop]
        idle = [writer for _, _, writer in asker._idle]
        assert len(idle) == 1  # the three asked on one connection
        branch.destroy(pool, "lean-kept")
        seen.append(await engine.look("lean-kept"))
        assert [w for _, _, w in asker._idle] == idle  # that one still
        _, reader, _ = asker._idle[0]
        # the service closes it once its keep-alive (5 s) passes
        assert await asyncio.wait_for(reader.read(), timeout=30) == b""
        asker._idle[0] = (time.monotonic(), *asker._idle[0][1:])  # as if fresh
        seen.append(await engine.look("lean-none"))
        return seen

    first, second, third, destroyed, after_close = asyncio.run(lookups())
    assert first is not None and first.name == "lean-kept" and first == second == third
    assert destroyed is None and after_close is None
