"""The service's answers, read back by its client without pydantic (``wire.decode``), and the
client's own HTTP exchange on a Unix socket."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from pgoverlay.errors import RequestError, ServiceError
from pgoverlay.runner.service import client
from pgoverlay.runner.service.client import exchange
from pgoverlay.runner.service.models import CreateRequest
from pgoverlay.runner.service.shape import as_dict
from pgoverlay.runner.service.views import (
    BaseView,
    BranchView,
    Connection,
    Layer,
    TraceMark,
    WarmView,
)
from pgoverlay.runner.service.wire import decode

BRANCH = BranchView(
    name="pr-7",
    state="ready",
    running=True,
    liveness="running",
    base="shop",
    base_version=2,
    runtime="local",
    host="127.0.0.1",
    port=55432,
    database="shop",
    user="pgoverlay",
    created_at=1.5,
    ready_at=2.0,
    expires_at=None,
    repository="acme/shop",
    pr=7,
    owner_uid=1001,
    layer=Layer(logical_bytes=10, physical_bytes=4),
)


def _through_json(view: object) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(json.dumps(as_dict(view)))
    return data


def test_every_answer_reads_back_as_it_was_sent() -> None:
    base = BaseView(
        name="shop",
        version=2,
        state="ready",
        pg_major=15,
        size_bytes=1 << 30,
        database="shop",
        created_at=1.0,
        prepared_at=None,
        masked=False,
        mask_rules="",
        mask_sha256="",
        locked_down=True,
        branches=1,
        warm=[WarmView(runtime="local", target=2, ready=1, memory_bytes_each=None)],
    )
    for view in (BRANCH, base, Connection(host="h", port=1, database="d", user="u", password="p")):
        assert decode(type(view), _through_json(view)) == view
    mark = TraceMark(
        at=1,
        wal_lsn=5,
        layer=Layer(logical_bytes=1, physical_bytes=1),
        relations=[],
        interval=0.1,
        instrumented=True,
    )
    assert decode(TraceMark, _through_json(mark)) == mark


def test_a_field_a_newer_service_adds_is_left_out() -> None:
    data = {**_through_json(BRANCH), "added_later": 1}
    assert decode(BranchView, data) == BRANCH


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"port": "55432"}, "port: expected int, got str"),
        ({"port": True}, "port: expected int, got bool"),
        ({"liveness": "maybe"}, "liveness: expected one of running, stopped, unknown"),
        ({"layer": {"logical_bytes": 1}}, "layer.physical_bytes: missing"),
        ({"layer": []}, "layer: expected an object, got list"),
        ({"pr": None, "name": None}, "name: expected str, got NoneType"),
    ],
)
def test_what_does_not_fit_is_named_by_its_field(change: dict[str, object], problem: str) -> None:
    data = {**_through_json(BRANCH), **change}
    with pytest.raises(ValueError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        decode(BranchView, data)
    missing = {k: v for k, v in _through_json(BRANCH).items() if k != "owner_uid"}
    with pytest.raises(ValueError, match="owner_uid: missing"):
        decode(BranchView, missing)


def _serve_once(path: Path, answer: bytes, seen: list[bytes]) -> threading.Thread:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)

    def run() -> None:
        with server, server.accept()[0] as conn:
            request = b""
            while b"\r\n\r\n" not in request or not request.endswith(b"}"):
                request += conn.recv(4096)
            seen.append(request)
            conn.sendall(answer)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_the_exchange_sends_a_request_and_reads_the_answer(tmp_path: Path) -> None:
    seen: list[bytes] = []
    body = b'{"ok": true}'
    answer = b"HTTP/1.1 201 Created\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    thread = _serve_once(tmp_path / "s", answer, seen)
    status, data = exchange(tmp_path / "s", "POST", "/v1/x", b'{"a": 1}', {"x-k": "v"}, 5)
    thread.join()
    assert (status, data) == (201, body)
    head, _, sent = seen[0].partition(b"\r\n\r\n")
    assert head.startswith(b"POST /v1/x HTTP/1.1\r\n") and b"\r\nx-k: v" in head
    assert b"\r\nContent-Length: 8" in head and sent == b'{"a": 1}'


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n{}", "cut short"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", "chunked"),
        (b"SSH-2.0-OpenSSH_9.2\r\n", "not an HTTP"),
    ],
)
def test_an_answer_that_is_not_the_services_http_is_refused(
    tmp_path: Path, answer: bytes, problem: str
) -> None:
    thread = _serve_once(tmp_path / "s", answer, [])
    with pytest.raises(ValueError, match=problem):
        exchange(tmp_path / "s", "POST", "/v1/x", b"{}", {}, 5)
    thread.join()


# -- root's client: a request the service did not act on is declined -------------------------


def _silent(path: Path) -> socket.socket:
    """A socket at ``path`` that takes connections and never answers (a wedged service)."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    return server


def test_roots_question_to_a_service_that_does_not_answer_is_declined_in_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A question (a GET) changes nothing, so root may ask the engine itself after a while; a
    change (a POST) may have been made, so only its own timeout ends it, as an error."""
    monkeypatch.setattr(client, "ROOT_QUESTION_WAIT", 0.2)
    with _silent(tmp_path / "s"):
        root = client.RemoteEngine(tmp_path / "s", timeout=0.6, for_root=True)
        with pytest.raises(client.Declined):
            root.branches()
        with pytest.raises(ServiceError) as raised:
            root.destroy("pr-7")
        assert not isinstance(raised.value, client.Declined)
        # Anyone else's client waits for its own timeout, and is not declined.
        other = client.RemoteEngine(tmp_path / "s", timeout=0.3)
        with pytest.raises(ServiceError) as raised:
            other.branches()
        assert not isinstance(raised.value, client.Declined)


def test_roots_request_to_a_socket_without_a_service_is_declined(tmp_path: Path) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp_path / "s"))
    stale.close()  # the file stays; nothing listens
    root = client.RemoteEngine(tmp_path / "s", for_root=True)
    for call in (root.branches, lambda: root.destroy("pr-7")):
        with pytest.raises(client.Declined):
            call()


def test_roots_request_refused_for_other_settings_is_declined(tmp_path: Path) -> None:
    body = b'{"code": "settings_differ", "message": "other settings"}'
    answer = b"HTTP/1.1 409 Conflict\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    thread = _serve_once(tmp_path / "s", answer, [])
    with pytest.raises(client.Declined):
        client.RemoteEngine(tmp_path / "s", for_root=True).destroy("pr-7")
    thread.join()


# -- Shape: what the views and requests are ---------------------------------------------------


def test_a_shape_is_keyword_only_frozen_and_compares_by_its_fields() -> None:
    with pytest.raises(TypeError, match="missing keyword argument 'physical_bytes'"):
        Layer(logical_bytes=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'extra'"):
        Layer(logical_bytes=1, physical_bytes=2, extra=3)  # type: ignore[call-arg]
    layer = Layer(logical_bytes=1, physical_bytes=2)
    with pytest.raises(AttributeError, match="frozen"):
        layer.logical_bytes = 5  # type: ignore[misc]
    assert (
        layer
        == Layer(logical_bytes=1, physical_bytes=2)
        != Layer(logical_bytes=1, physical_bytes=3)
    )
    assert hash(layer) == hash(Layer(logical_bytes=1, physical_bytes=2))
    assert layer.replace(physical_bytes=3) == Layer(logical_bytes=1, physical_bytes=3)
    assert repr(layer) == "Layer(logical_bytes=1, physical_bytes=2)"
    # A default made anew for each instance, as dataclasses' default_factory
    marks = [
        TraceMark(at=1, wal_lsn=5, layer=layer, relations=[], interval=0.1, instrumented=True)
        for _ in range(2)
    ]
    assert marks[0].dropped == [] and marks[0].dropped is not marks[1].dropped


def test_a_connection_leaves_its_password_out_of_its_repr() -> None:
    c = Connection(host="h", port=5432, database="d", user="u", password="s3cret")
    assert "s3cret" not in repr(c) and "user='u'" in repr(c)


def test_a_request_checks_its_values_when_made_and_when_pydantic_reads_it() -> None:
    from pydantic import TypeAdapter, ValidationError

    with pytest.raises(RequestError, match="is not a name"):
        CreateRequest(name="Bad Name")
    read = TypeAdapter(CreateRequest)
    made = read.validate_python({"name": "pr-1", "pr": 7})
    assert made == CreateRequest(name="pr-1", pr=7) and type(made) is CreateRequest
    with pytest.raises(ValidationError, match="Unexpected keyword argument"):
        read.validate_python({"name": "pr-1", "owner_uid": 0})
    with pytest.raises(ValidationError, match="int"):
        read.validate_python({"name": "pr-1", "pr": "seven"})
    with pytest.raises(ValidationError, match="pr: 0 is out of range"):  # RequestError
        read.validate_python({"name": "pr-1", "pr": 0})


def test_pydantic_writes_an_answer_as_its_fields() -> None:
    from pydantic import TypeAdapter

    assert TypeAdapter(BranchView).dump_python(BRANCH, mode="json") == _through_json(BRANCH)
    assert TypeAdapter(list[BranchView]).dump_python([BRANCH], mode="json") == [
        _through_json(BRANCH)
    ]
