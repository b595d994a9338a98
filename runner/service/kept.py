"""Questions to the engine service on connections kept open between them: the front door's
lookup of a branch, asked on every client connection, from the door's event loop.

A new connection for each question cost the door a connect, and the service a new connection
(its protocol object, the peer's credentials read from the socket), on every client's set-up.
Here a finished exchange leaves its connection idle for the next question (HTTP/1.1
keep-alive), at most ``MAX_IDLE`` of them, each reused only within ``FRESH_SECONDS`` of its
last answer: well inside the service's own limits on an idle connection (it closes one after
``KEEP_ALIVE_SECONDS``, and answers 408 to one that sent nothing for its request timeout), so
a question is not sent on a connection the service is closing. If one is closed all the same
(the service restarted, or was set to a shorter request timeout and said 408), the question is
asked again on a new connection: a question changes nothing, so asking twice is safe.

Every question is still asked and answered: nothing of an answer is kept, so a destroyed
branch, a revoked grant or a suspended branch is seen by the very next question.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

MAX_IDLE = 8  # connections kept open between questions (the service lets a uid hold 32)
FRESH_SECONDS = 2.0  # the service's keep-alive is 5 s, its request timeout 10 s by default


class Gone(Exception):
    """A kept connection the service had closed before it answered a byte: private control
    flow, the question is asked again on a new connection."""


class Kept:
    """Connections to the service's socket at ``path`` kept for the next question; used from
    one event loop."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._idle: list[tuple[float, asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def ask(self, request: bytes, *, timeout: float) -> bytes:
        """The whole answer (head and body) to ``request`` (an HTTP/1.1 GET without
        ``Connection: close``). OSError when the socket cannot be reached or the connection
        breaks; ValueError when what comes back is not HTTP/1.1 with a Content-Length."""
        async with asyncio.timeout(timeout):  # TimeoutError: an OSError, as a socket's timeout
            while self._idle:
                since, reader, writer = self._idle.pop()
                if time.monotonic() - since > FRESH_SECONDS or reader.at_eof():
                    writer.close()
                    continue
                try:
                    return await self._exchange(reader, writer, request, kept=True)
                except Gone:
                    continue
            reader, writer = await asyncio.open_unix_connection(os.fspath(self.path))
            return await self._exchange(reader, writer, request, kept=False)

    async def _exchange(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        request: bytes,
        *,
        kept: bool,
    ) -> bytes:
        done = False
        head = b""
        try:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            if kept and head.startswith(b"HTTP/1.1 408"):
                raise Gone  # the service's word that it closed the idle connection
            length, close = _framing(head)
            body = await reader.readexactly(length)
            done = not close
            return head + body
        except (asyncio.IncompleteReadError, ConnectionError) as err:
            if kept and not head and not getattr(err, "partial", b""):
                raise Gone from None  # closed by the service while it was idle
            raise ConnectionResetError("the engine service closed the connection") from None
        except asyncio.LimitOverrunError:
            raise ValueError("an answer's head over 64 KiB") from None
        finally:
            if done and len(self._idle) < MAX_IDLE:
                self._idle.append((time.monotonic(), reader, writer))
            else:
                writer.close()

    def close(self) -> None:
        """Close the idle connections."""
        for _, _, writer in self._idle:
            writer.close()
        self._idle.clear()


def _framing(head: bytes) -> tuple[int, bool]:
    """An answer's Content-Length, and whether the service closes the connection after it."""
    length: int | None = None
    close = False
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == "content-length" and value.isdigit():
            length = int(value)
        elif name == "connection" and "close" in value:
            close = True
        elif name == "transfer-encoding":
            raise ValueError("a chunked answer (the service sends a Content-Length)")
    if length is None:
        raise ValueError("an answer without a Content-Length")
    return length, close
