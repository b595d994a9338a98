"""The engine service's client: the ``Engine`` operations as HTTP+JSON requests on its Unix
socket. Errors come back as the engine raised them (same class, message and exit code).

Plain ``http.client`` over a Unix socket: one request per connection, nothing to pool, and
nothing heavy to import for a command that only asks.
"""

from __future__ import annotations

import dataclasses
import errno
import http.client
import json
import os
import socket
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from pydantic import TypeAdapter, ValidationError

from pgoverlay import errors
from pgoverlay.errors import PgoverlayError, ServiceError, config_error
from pgoverlay.runner.branch.login import Connection
from pgoverlay.runner.pool import SOCKET_ROOT, pool_id
from pgoverlay.runner.service.models import CreateRequest, OwnerRequest, RecordRequest, TraceRequest
from pgoverlay.runner.service.views import (
    BaseView,
    BranchView,
    Destroyed,
    ErrorBody,
    GcReport,
    Layer,
    TraceMark,
)
from pgoverlay.runner.settings import Settings

M = TypeVar("M")
Request = CreateRequest | OwnerRequest | RecordRequest | TraceRequest
API = "/v1"


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


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(os.fspath(self.path))
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class RemoteEngine:
    """The engine, reached through the service's socket at ``path``."""

    def __init__(self, path: Path, *, timeout: float = 3600.0) -> None:
        self.path = path
        self.timeout = timeout

    def close(self) -> None:
        pass

    def _call(self, method: str, url: str, body: Request | None = None) -> Any:
        conn = _UnixConnection(self.path, self.timeout)
        try:
            payload = json.dumps(dataclasses.asdict(body)).encode() if body is not None else None
            headers = {"Content-Type": "application/json"} if payload is not None else {}
            try:
                conn.request(method, API + url, body=payload, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
            except OSError as err:
                raise self._unreachable(err) from None
        finally:
            conn.close()
        try:
            decoded = json.loads(data) if data else None
        except ValueError:
            raise ServiceError(
                f"the engine service at {self.path} answered {answer.status} with something "
                "that is not JSON: is another program listening on that socket?"
            ) from None
        if answer.status >= 400:
            raise self._error(answer.status, decoded)
        return decoded

    def _unreachable(self, err: OSError) -> ServiceError:
        if err.errno in (errno.EACCES, errno.EPERM):
            return ServiceError(
                f"this user may not use the engine service's socket {self.path}: add it to the "
                "service's group (`usermod -aG pgoverlay USER`, then log in again or restart the "
                "runner)"
            )
        if err.errno in (errno.ENOENT, errno.ECONNREFUSED):
            return ServiceError(
                f"the engine service is not running (no answer on {self.path}): start it with "
                "`systemctl start pgoverlay` or `pgoverlay pool init` (as root)"
            )
        return ServiceError(f"the engine service at {self.path} did not answer: {err}")

    def _error(self, status: int, decoded: Any) -> PgoverlayError:
        try:
            body = _adapter(ErrorBody).validate_python(decoded)
        except ValidationError:
            return ServiceError(f"the engine service answered {status} without an error body")
        return ERRORS.get(body.code, ServiceError)(body.message)

    def _get(self, url: str, model: type[M]) -> M:
        return _parse(model, self._call("GET", url))

    def health(self) -> None:
        """Return when the service answers; ServiceError (saying how to fix it) otherwise."""
        self._call("GET", "/health")

    # -- the Engine operations -----------------------------------------------------------

    def bases(self) -> list[BaseView]:
        return _parse_list(BaseView, self._call("GET", "/bases"))

    def branches(self, *, layer: bool = False) -> list[BranchView]:
        found = self._call("GET", f"/branches?layer={str(layer).lower()}")
        return _parse_list(BranchView, found)

    def branch(self, name: str, *, layer: bool = False) -> BranchView | None:
        try:
            return self._get(f"/branches/{quote(name)}?layer={str(layer).lower()}", BranchView)
        except errors.BranchMissingError:
            return None

    def create(self, request: CreateRequest) -> BranchView:
        return _parse(BranchView, self._call("POST", "/branches", request))

    def reset(self, name: str, *, repository: str | None = None) -> BranchView:
        body = OwnerRequest(repository=repository)
        return _parse(BranchView, self._call("POST", f"/branches/{quote(name)}/reset", body))

    def destroy(self, name: str, *, repository: str | None = None) -> Destroyed:
        body = OwnerRequest(repository=repository)
        return _parse(Destroyed, self._call("POST", f"/branches/{quote(name)}/destroy", body))

    def connection(self, name: str) -> Connection:
        return self._get(f"/branches/{quote(name)}/connection", Connection)

    def size(self, name: str) -> Layer:
        return self._get(f"/branches/{quote(name)}/size", Layer)

    def save_record(self, name: str, request: RecordRequest) -> None:
        self._call("PUT", f"/branches/{quote(name)}/record", request)

    def gc(self) -> GcReport:
        return _parse(GcReport, self._call("POST", "/gc"))

    def trace_begin(self, name: str, request: TraceRequest) -> TraceMark:
        return _parse(TraceMark, self._call("POST", f"/branches/{quote(name)}/trace", request))

    def trace_mark(self, name: str, *, repository: str | None = None) -> TraceMark:
        body = OwnerRequest(repository=repository)
        return _parse(TraceMark, self._call("POST", f"/branches/{quote(name)}/trace/mark", body))

    def trace_end(self, name: str, *, repository: str | None = None) -> TraceMark:
        body = OwnerRequest(repository=repository)
        return _parse(TraceMark, self._call("POST", f"/branches/{quote(name)}/trace/end", body))


_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}


def _adapter(model: type[M]) -> TypeAdapter[M]:
    """What checks ``model``'s answers (built once per model: building one costs)."""
    if model not in _ADAPTERS:
        _ADAPTERS[model] = TypeAdapter(model)
    return _ADAPTERS[model]


def _parse(model: type[M], data: Any) -> M:
    """An answer as its model; ServiceError if it does not fit (a service of another release)."""
    try:
        return _adapter(model).validate_python(data)
    except ValidationError as exc:
        raise config_error(
            exc,
            what=f"the engine service's answer ({model.__name__}) does not fit its protocol:",
            fix="restart the service (`systemctl restart pgoverlay`) so that it runs this release",
            error=ServiceError,
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
    return SOCKET_ROOT / f"{pool_id(settings.home)}.sock"


def client(settings: Settings) -> RemoteEngine:
    """The engine of the pool at ``settings.home``, through its service."""
    return RemoteEngine(socket_path(settings), timeout=settings.command_timeout)
