"""One side of a front-door connection (the client's or the branch's) as an asyncio protocol:
read as messages while the door talks to it, then spliced to the other side.

Spliced, a side's ``data_received`` writes what arrives straight to the other side's
transport: no task switch, no copy into a stream's buffer, so a query through the door costs
two socket writes more than a direct one. Flow control is the transports' own: when one side's
write buffer passes its high-water mark, asyncio calls that side's ``pause_writing``, which
stops reading the other side until the buffer drains (``resume_writing``).

At the end of a login, what the branch sends the client (its SASL final message,
AuthenticationOk, a dozen ParameterStatus, BackendKeyData) is held (``hold``, at most
``BUFFER_CAP`` bytes) and leaves with its ReadyForQuery: one write, one TLS record, not one of
each a message (each a system call, and a wake-up of the client, which waits for the
ReadyForQuery anyway).

Before the splice, data waits in the channel's buffer; reading is paused while the buffer holds
more than ``BUFFER_CAP`` bytes, so a peer that sends without reading cannot make it grow.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from typing import cast

from pgoverlay.runner.door import startup

BUFFER_CAP = 64 * 1024


class ChannelClosed(Exception):
    """The peer closed (or the connection broke) before a whole message arrived: private
    control flow, ending that one connection."""


class Channel(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.received = 0  # bytes read from this side (decrypted, for a TLS side)
        self.sent = 0  # bytes written to this side
        self._buffer = bytearray()
        self._held = bytearray()  # written with the next write (``hold``)
        self._waiter: asyncio.Future[None] | None = None
        self._eof = False
        self._peer: Channel | None = None
        self._writing_paused = False
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # -- asyncio's callbacks ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not derive from asyncio's classes; they have their methods.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        peer = self._peer
        if peer is not None:
            peer.forward(data)
            return
        self._buffer += data
        if len(self._buffer) > BUFFER_CAP and self.transport is not None:
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        if self._peer is not None:
            self._peer.close()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._wake()
        if self._peer is not None:
            self._peer.close()
        if not self.done.done():
            self.done.set_result(None)

    def pause_writing(self) -> None:
        self._writing_paused = True
        if self._peer is not None and self._peer.transport is not None:
            self._peer.transport.pause_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._peer is not None and self._peer.transport is not None:
            self._peer.transport.resume_reading()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- the door's side ---------------------------------------------------------------

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def forward(self, data: bytes) -> None:
        """Write ``data`` arriving from the other side (spliced)."""
        if self.transport is not None:
            self.sent += len(data)
            self.transport.write(data)

    def write(self, data: bytes) -> None:
        """Write ``data`` now, after what is held."""
        if self.transport is None or self.transport.is_closing():
            raise ChannelClosed("the connection is closed")
        if self._held:
            data = bytes(self._held) + data
            self._held.clear()
        self.sent += len(data)
        self.transport.write(data)

    def hold(self, data: bytes) -> None:
        """Write ``data`` with the next ``write`` or ``flush``, in one piece with it (now, when
        more than ``BUFFER_CAP`` bytes are held)."""
        self._held += data
        if len(self._held) > BUFFER_CAP:
            self.flush()

    def flush(self) -> None:
        """Write what is held."""
        if self._held:
            self.write(b"")

    async def read(self, count: int) -> bytes:
        """Exactly ``count`` bytes (raises ChannelClosed at the end of the stream)."""
        while len(self._buffer) < count:
            if self._eof:
                raise ChannelClosed("the peer closed the connection")
            if self.transport is not None:
                self.transport.resume_reading()
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = bytes(self._buffer[:count])
        del self._buffer[:count]
        return data

    async def peek(self) -> int:
        """The next byte, left unread."""
        first = await self.read(1)
        self._buffer[0:0] = first
        return first[0]

    async def read_message(self, *, cap: int) -> tuple[bytes, bytes]:
        """A typed message (type byte, body) whose body is at most ``cap`` bytes."""
        header = await self.read(5)
        length = startup.message_length(header, cap=cap)
        return header[:1], await self.read(length)

    async def start_tls(self, context: ssl.SSLContext, *, timeout: float) -> None:
        """Turn this (server) side into TLS; the same channel then reads decrypted data."""
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        tls = await loop.start_tls(
            self.transport, self, context, server_side=True, ssl_handshake_timeout=timeout
        )
        assert tls is not None
        self.transport = tls

    def info(self, name: str) -> object:
        return None if self.transport is None else self.transport.get_extra_info(name)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


def splice(a: Channel, b: Channel) -> None:
    """From now on, what either side sends goes to the other as it arrives (what each holds
    unread goes first)."""
    for one, other in ((a, b), (b, a)):
        one._peer = other
        if one._buffer:
            other.forward(bytes(one._buffer))
            one._buffer.clear()
    for one, other in ((a, b), (b, a)):
        if one._eof:
            other.close()
        elif one.transport is not None:
            if other._writing_paused:
                one.transport.pause_reading()
            else:
                one.transport.resume_reading()
