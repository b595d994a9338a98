"""A front door on an event loop of its own thread: for the benchmark and the tests, whose
clients (psql, pgbench, psycopg) are blocking. The service runs the door in a process of its
own instead, on the loop of that process's main thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import uvloop

from pgoverlay.runner.door.router import FrontDoor

T = TypeVar("T")


class DoorThread:
    """A loop running in a daemon thread (uvloop's unless ``uv`` is False)."""

    def __init__(self, *, uv: bool = True) -> None:
        self.loop = uvloop.new_event_loop() if uv else asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def call(self, coroutine: Coroutine[Any, Any, T], *, timeout: float = 30.0) -> T:
        """Run ``coroutine`` on the loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        self.loop.close()


@contextmanager
def running(
    make: Callable[[], FrontDoor], *, host: str = "127.0.0.1", port: int = 0, uv: bool = True
) -> Iterator[FrontDoor]:
    """A door made by ``make`` (on the loop's thread: its clock is that loop's), serving on
    ``host``:``port`` until the block ends."""
    thread = DoorThread(uv=uv)

    async def start() -> FrontDoor:
        door = make()
        await door.start(host=host, port=port)
        return door

    door = thread.call(start())
    try:
        yield door
    finally:
        try:
            thread.call(door.close())
        finally:
            thread.stop()
