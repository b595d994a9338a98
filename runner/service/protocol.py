"""The engine service's HTTP/1.1 protocol: uvicorn's h11 one, with who is calling and what a
caller may hold.

Who is calling is read from the socket itself (SO_PEERCRED: the kernel's word for the peer's
pid, uid and gid), attached to each request as ``request.scope["state"]["peer"]``. Each
connection is then held to ``Caps``:

- a uid other than root's has at most ``connections_per_user`` connections open at once; one
  more is answered 429 (``service_busy``) and closed before anything is read from it. Root is
  not counted: it can stop the service anyway, and its CLI and gc must not be locked out by a
  member's flood;
- a caller has ``request_timeout`` seconds from connecting (or from the answer to its previous
  request on the same connection) to send its whole request, head and body; then it gets 408
  and the connection is closed. The time its request takes to be served is not counted.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from collections import Counter
from dataclasses import dataclass
from typing import ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from pgoverlay.errors import ServiceBusyError, TimeoutExpiredError
from pgoverlay.runner.service.client import error_code
from pgoverlay.runner.service.limits import MAX_HEAD_BYTES, raw_answer

log = logging.getLogger("pgoverlay.service")

# h11's states of the caller's side once its whole request is in.
_RECEIVED = (h11.DONE, h11.MUST_CLOSE)


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int


def peer_of(sock: socket.socket) -> Peer:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(pid=pid, uid=uid, gid=gid)


@dataclass(frozen=True, kw_only=True)
class Caps:
    """What one caller may hold of the service (the settings of the same names)."""

    connections_per_user: int
    request_timeout: float


class PeerCredProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, with the connection's peer credentials in each request's
    state and ``caps`` held (see the module's docstring). ``for_caps`` makes the class a
    service uses, with a count of connections of its own."""

    caps: ClassVar[Caps]
    # per uid: connections open, and those refused since one of them last closed
    open_by_uid: ClassVar[Counter[int]]
    refused_by_uid: ClassVar[Counter[int]]

    @classmethod
    def for_caps(cls, caps: Caps) -> type[PeerCredProtocol]:
        counters = {"open_by_uid": Counter[int](), "refused_by_uid": Counter[int]()}
        return type(cls.__name__, (cls,), {"caps": caps, **counters})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._counted: int | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._peer: Peer | None = None
        sock = transport.get_extra_info("socket")
        if sock is None or sock.family != socket.AF_UNIX:
            transport.close()  # only the Unix socket is served
            return
        peer = self._peer = peer_of(sock)
        self.app_state = {**self.app_state, "peer": peer}
        limit = self.caps.connections_per_user
        if peer.uid != 0 and self.open_by_uid[peer.uid] >= limit:
            if not self.refused_by_uid[peer.uid]:  # once a flood, not once a connection
                log.warning(
                    "uid=%s pid=%s has %s connections open, its limit: refusing more",
                    peer.uid,
                    peer.pid,
                    limit,
                )
            self.refused_by_uid[peer.uid] += 1
            message = (
                f"this user (uid {peer.uid}) already has {limit} requests open on the engine "
                "service, the most it allows: let them finish, or raise "
                "PGOVERLAY_SERVICE_CONNECTIONS_PER_USER (then restart the service)"
            )
            transport.write(raw_answer(429, error_code(ServiceBusyError), message))
            transport.close()
            return
        if peer.uid != 0:
            self.open_by_uid[peer.uid] += 1
            self._counted = peer.uid
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        uid = self._counted
        if uid is not None:
            self._counted = None
            self.open_by_uid[uid] -= 1
            if self.open_by_uid[uid] <= 0:
                del self.open_by_uid[uid]
            refused = self.refused_by_uid.pop(uid, 0)
            if refused:
                log.warning("uid=%s: %s connections over its limit were refused", uid, refused)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state in _RECEIVED:
            self._disarm()  # the whole request is in: serving it takes what it takes

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state not in _RECEIVED:
            self._arm()  # the next request on this connection, or the rest of this one's body

    def send_400_response(self, msg: str) -> None:
        """h11 could not read the request (uvicorn's answer is plain text): say so as the
        service's own error answers do."""
        message = (
            "the request is not HTTP/1.1 the service can read, or its head (request line and "
            f"headers) is over {MAX_HEAD_BYTES} bytes: send what docs/service-openapi.json "
            "describes (the `pgoverlay` client does)"
        )
        self.transport.write(raw_answer(400, "bad_request", message))
        self.transport.close()

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.caps.request_timeout, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        peer = self._peer
        log.warning(
            "uid=%s pid=%s sent no whole request within %g s: closed",
            peer.uid if peer else "?",
            peer.pid if peer else "?",
            self.caps.request_timeout,
        )
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):  # no answer begun
            message = (
                f"the request did not arrive whole within {self.caps.request_timeout:g} s of "
                "connecting: send it at once (the `pgoverlay` client does)"
            )
            self.transport.write(raw_answer(408, error_code(TimeoutExpiredError), message))
        if self.cycle is not None:
            self.cycle.disconnected = True  # what the application answers now goes nowhere
        self.transport.close()
