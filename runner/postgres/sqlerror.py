"""psycopg's errors as ours: where the engine (or the Action) talks to a server, a failure
leaves as a :class:`~pgoverlay.errors.PgoverlayError` that says what failed and what to do.

The reason is the server's (or libpq's) one-line message and its hint; libpq never puts a
password in one, and no DSN is added to it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from pgoverlay.errors import PgoverlayError


def reason(err: psycopg.Error) -> str:
    """The server's primary message (or libpq's first line) and its hint, on one line."""
    diag = err.diag
    lines = str(err).strip().splitlines()
    parts = [diag.message_primary or (lines[0] if lines else type(err).__name__)]
    if diag.message_hint:
        parts.append(f"hint: {diag.message_hint}")
    return "; ".join(parts)


@contextmanager
def wrapped(error: type[PgoverlayError], *, what: str, fix: str) -> Iterator[None]:
    """Turn a ``psycopg.Error`` raised inside into ``error("{what}: {reason}; {fix}")``."""
    try:
        yield
    except psycopg.Error as err:
        raise error(f"{what}: {reason(err)}; {fix}") from None
