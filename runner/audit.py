"""The audit log: one JSON object per line, appended, for an admin to ship.

Every grant and revoke of a personal credential, and every issue, revoke and refused use of
an API token (written by the engine, as root, to ``<home>/audit/engine.jsonl``), and every
connection through the front door (written by the door, as its own user, to
``<home>/audit/door.jsonl``) is a line: what happened (``event``), when (``at``, UTC, ISO
8601), and the event's own fields (who, branch, source address, start, end, bytes). A line
never holds a password or a token: callers pass only the fields named here, and ``write``
refuses a field whose name says it is a secret.

Lines are written with one ``write`` on a descriptor opened ``O_APPEND``, so two processes
appending to one file never interleave within a line (the kernel appends a write of a regular
file whole), and a line is at most ``LINE_CAP`` bytes.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

from pgoverlay.runner import safefs

LINE_CAP = 4096
_SECRET_WORDS = ("password", "secret", "token")

ENGINE_LOG = Path("audit") / "engine.jsonl"
DOOR_LOG = Path("audit") / "door.jsonl"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def line(event: str, **fields: object) -> bytes:
    """The line for ``event``: ``{"at": …, "event": …, **fields}``, cut to ``LINE_CAP``."""
    for name in fields:
        if any(word in name.lower() for word in _SECRET_WORDS):
            raise ValueError(f"an audit line never holds a secret (field {name!r})")
    text = json.dumps({"at": now(), "event": event, **fields}, default=str, ensure_ascii=True)
    data = text.encode()
    if len(data) + 1 > LINE_CAP:  # keep it one JSON object, marked as cut
        data = json.dumps({"at": now(), "event": event, "cut": True}).encode()
    return data + b"\n"


class AuditLog:
    """An audit file, opened once for appending (a new file is the owner's, mode 0600; an
    existing one must be that user's regular file: never a link followed)."""

    def __init__(self, path: Path, *, uid: int, gid: int) -> None:
        self.path = path
        self._fd = safefs.open_log(path, uid=uid, gid=gid)

    def write(self, event: str, **fields: object) -> None:
        os.write(self._fd, line(event, **fields))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def engine_line(home: Path, event: str, **fields: object) -> None:
    """One line of the engine's audit log (root's, mode 0600, in ``<home>/audit``), opened
    for it and closed: the engine writes few (grants, revokes, API tokens)."""
    folder = home / ENGINE_LOG.parent
    try:
        os.lstat(folder)
    except FileNotFoundError:
        safefs.make_dir(folder, uid=0, gid=0, mode=0o755, exist_ok=True)
    entry = AuditLog(home / ENGINE_LOG, uid=0, gid=0)
    try:
        entry.write(event, **fields)
    finally:
        entry.close()


def read(path: Path) -> list[dict[str, object]]:
    """Every line of an audit file, parsed (for `pgoverlay access log` and tests)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(row) for row in text.splitlines() if row.strip()]
