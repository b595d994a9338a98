"""The engine service's client: the ``Engine`` operations as HTTP+JSON requests on its Unix
socket. Errors come back as the engine raised them (same class, message and exit code).

One request per connection (but the front door's lookups, ``look``, on connections kept
open: ``kept``), written and read here rather than with ``http.client``: importing
that (with ``ssl`` and ``email``) cost a command that only asks the service about 40 ms, more
than the service takes to answer. The service is uvicorn on a socket only root and the
service's group may open: its answers are HTTP/1.1 with a Content-Length, and ``wire.decode``
checks that each answer is what this release expects.
"""

from __future__ import annotations

import _socket  # socket's C module: `socket` adds selectors and enums, ~7 ms a command
import copy
import json
import os
import typing
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pgoverlay import errors
from pgoverlay.errors import PgoverlayError, ServiceError
from pgoverlay.runner.service import access, address
from pgoverlay.runner.service import operations as ops
from pgoverlay.runner.service.operations import API, Ans, Op, Req
from pgoverlay.runner.service.shape import Shape, as_dict
from pgoverlay.runner.service.views import (
    BaseView,
    BaseWorkload,
    BranchView,
    Connection,
    Credential,
    Destroyed,
    ErrorBody,
    GcReport,
    GrantView,
    Layer,
    Revoked,
    TraceMark,
)
from pgoverlay.runner.service.wire import decode

if TYPE_CHECKING:
    import asyncio

    from pgoverlay.runner.service.kept import Kept
    from pgoverlay.runner.service.models import (
        CreateRequest,
        CredentialCheck,
        GrantRequest,
        OwnerRequest,
        RecordRequest,
        TraceRequest,
    )
    from pgoverlay.runner.settings import Settings

M = TypeVar("M", bound=Shape)
# Root's settings, as Settings.fingerprint(): the service acts for root only with its own.
SETTINGS_HEADER = "x-pgoverlay-settings"


def error_code(cls: type[BaseException]) -> str:
    """``BranchMissingError`` -> ``branch_missing``: the stable code of an error answer."""
    name = cls.__name__.removesuffix("Error")
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")


def _error_classes() -> dict[str, type[PgoverlayError]]:
    found: dict[str, type[PgoverlayError]] = {}
    for value in vars(errors).values():
        if isinstance(value, type) and issubclass(value, PgoverlayError):
            found[error_code(value)] = value
    return found


ERRORS = _error_classes()


def _owner(repository: str | None) -> OwnerRequest:
    from pgoverlay.runner.service.models import OwnerRequest

    return OwnerRequest(repository=repository)


class Unreached(OSError):
    """The service's socket could not be connected to: nothing was sent. Private control flow:
    ``RemoteEngine`` turns it into its own errors."""


class Declined(ServiceError):
    """The service did not act for root (it is not running, runs with other settings, or did
    not answer a question in time): nothing was done, and root works on the engine itself.
    Private control flow: only root's client raises it, and the CLI's root engine catches it."""


# How long root waits for the service to answer a question (a GET): then root asks the engine
# itself, which is safe for a question, as no answer changed anything.
ROOT_QUESTION_WAIT = 5.0


def exchange(
    path: Path,
    method: str,
    target: str,
    body: bytes | None,
    headers: dict[str, str],
    timeout: float,
) -> tuple[int, bytes]:
    """One HTTP/1.1 request on the Unix socket ``path``: the answer's status and body. OSError
    when the socket cannot be reached; ValueError when what comes back is not HTTP."""
    request = _request(method, target, body, headers)
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(os.fspath(path))
        except OSError as err:
            raise Unreached(err.errno, err.strerror) from None
        # The service may answer, and close, before it read the whole request (a body over
        # its cap, a caller over its connections): its answer, when there is one, says why.
        cut: OSError | None = None
        try:
            sock.sendall(request)
        except (BrokenPipeError, ConnectionResetError) as err:
            cut = err
        chunks = []
        try:
            while chunk := sock.recv(1 << 16):
                chunks.append(chunk)
        except ConnectionResetError as err:
            cut = cut or err
        if cut is not None and not chunks:
            raise cut
    finally:
        sock.close()
    return _answer(b"".join(chunks))


def _request(
    method: str,
    target: str,
    body: bytes | None,
    headers: dict[str, str],
    *,
    keep_alive: bool = False,
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: localhost"]
    lines += [] if keep_alive else ["Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def _answer(raw: bytes) -> tuple[int, bytes]:
    head, blank, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    version, _, rest = status_line.partition(" ")
    if not blank or not version.startswith("HTTP/1.") or not rest[:3].isdigit():
        raise ValueError("not an HTTP/1.1 answer")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", ""):
        raise ValueError("a chunked answer (the service sends a Content-Length)")
    length = headers.get("content-length")
    if length is not None and int(length) != len(body):
        raise ValueError(f"an answer cut short ({len(body)} of {length} bytes)")
    return int(rest[:3]), body


class RemoteEngine:
    """The engine, reached through the service's socket at ``path``."""

    def __init__(
        self,
        path: Path,
        *,
        timeout: float = 3600.0,
        headers: dict[str, str] | None = None,
        for_root: bool = False,
    ) -> None:
        self.path = path
        self.timeout = timeout
        self.headers = headers or {}
        # Root's client: a request the service did not act on raises Declined (see for_root).
        self.for_root = for_root
        # the front door's lookups' connections, per event loop (``look``)
        self._kept: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Kept] = (
            weakref.WeakKeyDictionary()
        )

    def close(self) -> None:
        pass

    def _call(
        self, method: str, url: str, body: Shape | None = None, *, raw: bytes | None = None
    ) -> Any:
        """The decoded answer to a request with ``body`` (or the JSON ``raw``); the engine's
        error, as its class, for an error answer."""
        payload = json.dumps(as_dict(body)).encode() if body is not None else raw
        question = method == "GET"
        wait = min(self.timeout, ROOT_QUESTION_WAIT) if self.for_root and question else self.timeout
        try:
            status, data = self._send(method, url, payload, wait)
        except (OSError, ValueError) as err:
            raise self._unanswered(err, question=question) from None
        return self._decoded(status, data)

    def _unanswered(self, err: OSError | ValueError, *, question: bool) -> ServiceError:
        """The error of a request that got no answer (OSError) or not the service's (ValueError)."""
        if isinstance(err, OSError):
            if self.for_root and (isinstance(err, Unreached) or question):
                return Declined(f"the engine service did not answer ({err})")
            return self._unreachable(err)
        return ServiceError(
            f"{self.where} answered with something that is not its protocol ({err}): "
            f"{self.imposter}"
        )

    def _decoded(self, status: int, data: bytes) -> Any:
        """An answer's JSON; the engine's error, as its class, for an error answer."""
        try:
            decoded = json.loads(data) if data else None
        except ValueError:
            raise ServiceError(
                f"{self.where} answered {status} with something that is not JSON: {self.imposter}"
            ) from None
        if status >= 400:
            error = self._error(status, decoded)
            if self.for_root and isinstance(error, errors.SettingsDifferError):
                raise Declined(str(error))
            raise error
        return decoded

    @property
    def where(self) -> str:
        """The service, as an error message names it."""
        return f"the engine service at {self.path}"

    # What an answer that is not the service's protocol suggests.
    imposter = "is another program listening on that socket?"

    def _send(self, method: str, url: str, payload: bytes | None, wait: float) -> tuple[int, bytes]:
        """One request, ``url`` relative to the API's root: the answer's status and body.
        OSError when the service cannot be reached; ValueError when the answer is not HTTP."""
        return exchange(self.path, method, API + url, payload, self.headers, wait)

    def _unreachable(self, err: OSError) -> ServiceError:
        return ServiceError(access.explain(self.path, err))

    def _error(self, status: int, decoded: Any) -> PgoverlayError:
        try:
            body = decode(ErrorBody, decoded)
        except ValueError:
            return ServiceError(f"the engine service answered {status} without an error body")
        return ERRORS.get(body.code, ServiceError)(body.message)

    def health(self) -> None:
        """Return when the service answers; ServiceError (saying how to fix it) otherwise."""
        self._call("GET", "/health")

    def call(self, op: Op[Req, Ans], request: Req, *path: str, **query: bool) -> Ans:
        """The engine's answer to operation ``op`` with ``request`` (its body; None when it
        has none), ``path`` its path's parameters and ``query`` its query's flags."""
        return _read(op, self._call(op.verb, op.target(*path, **query), request))

    # -- the Engine operations ------------------------------------------------------------

    def bases(self) -> list[BaseView]:
        return self.call(ops.BASES, None)

    def base_workload(self, name: str) -> BaseWorkload:
        return self.call(ops.BASE_WORKLOAD, None, name)

    def branches(self, *, layer: bool = False) -> list[BranchView]:
        return self.call(ops.BRANCHES, None, layer=layer)

    def branch(self, name: str, *, layer: bool = False) -> BranchView | None:
        try:
            return self.call(ops.BRANCH, None, name, layer=layer)
        except errors.BranchMissingError:
            return None

    async def look(self, name: str) -> BranchView | None:
        """``branch`` (without its layer), asked from the running event loop's thread: the
        front door's lookup on each connection, on a connection kept open from the last
        (``kept``). The same request and answer, asked each time: the engine's answer is as
        fresh as ``branch``'s."""
        import asyncio

        from pgoverlay.runner.service import kept

        loop = asyncio.get_running_loop()
        asker = self._kept.get(loop)
        if asker is None:
            asker = self._kept[loop] = kept.Kept(self.path)
        target = API + ops.BRANCH.target(name, layer=False)
        request = _request("GET", target, None, self.headers, keep_alive=True)
        try:
            status, data = _answer(await asker.ask(request, timeout=self.timeout))
        except (OSError, ValueError) as err:
            raise self._unanswered(err, question=True) from None
        try:
            return _read(ops.BRANCH, self._decoded(status, data))
        except errors.BranchMissingError:
            return None

    def create(self, request: CreateRequest) -> BranchView:
        return self.call(ops.CREATE, request)

    def reset(self, name: str, *, repository: str | None = None) -> BranchView:
        return self.call(ops.RESET, _owner(repository), name)

    def destroy(self, name: str, *, repository: str | None = None) -> Destroyed:
        return self.call(ops.DESTROY, _owner(repository), name)

    def suspend(self, name: str, *, repository: str | None = None) -> BranchView:
        return self.call(ops.SUSPEND, _owner(repository), name)

    def wake(self, name: str, *, repository: str | None = None) -> BranchView:
        return self.call(ops.WAKE, _owner(repository), name)

    def connection(self, name: str) -> Connection:
        return self.call(ops.CONNECTION, None, name)

    def size(self, name: str) -> Layer:
        return self.call(ops.SIZE, None, name)

    def save_record(self, name: str, request: RecordRequest) -> None:
        self.call(ops.RECORD, request, name)

    def gc(self) -> GcReport:
        return self.call(ops.GC, None)

    def grant(self, name: str, request: GrantRequest, *, reader: str | None = None) -> GrantView:
        """A credential in branch ``name``. ``reader``: the GitHub token of the person the front
        door grants to, forwarded for the engine to ask GitHub who they are (``vouch``)."""
        engine = self
        if reader is not None:
            from pgoverlay.runner.service import vouch

            engine = copy.copy(self)
            engine.headers = {**self.headers, **vouch.headers(reader=reader)}
        return engine.call(ops.GRANT, request, name)

    def end_job(self, name: str) -> Revoked:
        return self.call(ops.END_JOB, _owner(None), name)

    def grants(self, name: str) -> list[GrantView]:
        return self.call(ops.GRANTS, None, name)

    def revoke(self, name: str, login: str, *, repository: str | None = None) -> Revoked:
        return self.call(ops.REVOKE, _owner(repository), name, login)

    def trace_begin(self, name: str, request: TraceRequest) -> TraceMark:
        return self.call(ops.TRACE_BEGIN, request, name)

    def check_credential(self, request: CredentialCheck) -> Credential:
        """Whether an API token is good for a repository (the front door's question)."""
        return self.call(ops.CHECK_CREDENTIAL, request)

    def trace_mark(self, name: str, *, repository: str | None = None) -> TraceMark:
        return self.call(ops.TRACE_MARK, _owner(repository), name)

    def trace_end(self, name: str, *, repository: str | None = None) -> TraceMark:
        return self.call(ops.TRACE_END, _owner(repository), name)


def _read(op: Op[Any, Ans], data: Any) -> Ans:
    """The answer to ``op`` as its type (None for one that answers nothing)."""
    answer = op.answer
    if answer is None:
        return typing.cast(Ans, None)
    if typing.get_origin(answer) is list:
        return typing.cast(Ans, _parse_list(typing.get_args(answer)[0], data))
    return typing.cast(Ans, _parse(answer, data))


def _parse(model: type[M], data: Any) -> M:
    """An answer as its model; ServiceError if it does not fit (a service of another release)."""
    try:
        return decode(model, data)
    except ValueError as exc:
        raise ServiceError(
            f"the engine service's answer ({model.__name__}) does not fit its protocol: {exc}; "
            "restart the service (`systemctl restart pgoverlay`) so that it runs this release"
        ) from None


def _parse_list(model: type[M], data: Any) -> list[M]:
    if not isinstance(data, list):
        raise ServiceError(
            f"the engine service's answer is not a list of {model.__name__}: restart the service "
            "(`systemctl restart pgoverlay`) so that it runs this release"
        )
    return [_parse(model, item) for item in data]


def socket_path(settings: Settings) -> Path:
    """The service's socket for the pool at ``settings.home``."""
    return address.socket_path(settings.home)


def client(settings: Settings) -> RemoteEngine:
    """The engine of the pool at ``settings.home``, through its service."""
    return RemoteEngine(socket_path(settings), timeout=settings.command_timeout)


def for_root(settings: Settings) -> RemoteEngine | None:
    """The engine service, asked on root's behalf, when its socket is there: a root command
    then costs a request, not the engine's imports, and a create may claim a warm branch whose
    session the service holds. Each request carries root's settings' fingerprint; a service
    that is not running or runs with other settings acts on none of them, and its client
    raises ``Declined`` for root to work on the pool itself. None: no service to ask."""
    path = socket_path(settings)
    if not path.exists():
        return None
    return RemoteEngine(
        path,
        timeout=settings.command_timeout,
        headers={SETTINGS_HEADER: settings.fingerprint()},
        for_root=True,
    )
