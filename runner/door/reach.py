"""Whether this host's front door answers: a connect to its Postgres port, and nothing else
imported (the Action asks it at each run, whose start is kept short; ``serve`` starts and
stops the door)."""

from __future__ import annotations

import socket

from pgoverlay.runner.settings import Settings


def answering(settings: Settings, *, timeout: float = 1.0) -> bool:
    """Whether something accepts connections on the door's Postgres port here."""
    host = "127.0.0.1" if settings.door.address in ("0.0.0.0", "::", "*") else settings.door.address
    try:
        with socket.create_connection((host, settings.door.port), timeout=timeout):
            return True
    except OSError:
        return False
