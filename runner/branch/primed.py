"""What this process keeps primed for the next claim of a warm branch: the engine's connection
to each warm branch it started, and a password whose SCRAM verifier is already computed.

A claim is what a user waits for. Opening the engine's connection (the server forks and
authenticates a backend) and computing a verifier (4096 PBKDF2 rounds) are most of its work,
and neither depends on who claims: the process that locked a warm branch's role keeps that
connection open, idle, until a claim takes it or the branch is torn down; and each claim leaves
the next one a fresh password with its verifier, computed in another thread.

Only a long-lived process gains (the engine service, which both starts warm branches and claims
them); any other simply finds nothing held and connects, as before. Everything here is guarded
by one lock: the service claims from request threads and starts warm branches from its own.
"""

from __future__ import annotations

import atexit
import contextlib
import secrets
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

_lock = threading.Lock()
_sessions: dict[str, psycopg.Connection[Any]] = {}
_spare: list[tuple[str, Future[str]]] = []
_workers: list[ThreadPoolExecutor] = []


def keep(key: str, conn: psycopg.Connection[Any]) -> None:
    """Hold ``conn`` (the engine's connection to the warm branch whose files go by ``key``)
    for its claim; one already held for ``key`` is closed."""
    with _lock:
        old = _sessions.pop(key, None)
        _sessions[key] = conn
    if old is not None:
        _close(old)


def take(key: str) -> psycopg.Connection[Any] | None:
    """The connection held for ``key``, now the caller's to close; None if none is held or it
    is closed."""
    with _lock:
        conn = _sessions.pop(key, None)
    if conn is not None and conn.closed:
        return None
    return conn


def drop(key: str) -> None:
    """Close the connection held for ``key``, if any (its branch is being torn down)."""
    conn = take(key)
    if conn is not None:
        _close(conn)


def _close(conn: psycopg.Connection[Any]) -> None:
    with contextlib.suppress(Exception):  # a connection whose server is gone closes anyway
        conn.close()


@atexit.register
def _close_all() -> None:
    with _lock:
        held = list(_sessions.values())
        _sessions.clear()
    for conn in held:
        _close(conn)


def _verifier(password: str) -> str:
    from pgoverlay.runner.postgres import roles

    return roles.scram_verifier(password)


def _compute(password: str) -> Future[str]:
    with _lock:
        if not _workers:
            _workers.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="pgo-scram"))
        worker = _workers[0]
    return worker.submit(_verifier, password)


def password() -> tuple[str, Future[str]]:
    """A new branch password and its SCRAM verifier (computed, or being computed in another
    thread, so the caller only waits for it when it needs it); the next call's pair starts
    being computed now."""
    with _lock:
        ready = _spare.pop() if _spare else None
    if ready is None:
        made = secrets.token_urlsafe(24)
        ready = (made, _compute(made))
    following = secrets.token_urlsafe(24)
    following_secret = _compute(following)
    with _lock:
        _spare[:] = [(following, following_secret)]
    return ready
