"""The branch's server log, read back by root: what is new since an offset, and the entries of
the branch's login role in it.

The server writes each entry as a head line (``conf.LOG_OPTIONS``' prefix)::

    2026-11-30 22:58:01.123 UTC [12345] user@db LOG:  duration: 0.051 ms  statement: ...

and continuation lines that start with a tab (the server puts one after every newline of a
message), so nothing a session sends can start a line of its own. DETAIL, CONTEXT, STATEMENT
and HINT lines are entries of their own with the same prefix.

The file lives in a directory the branch's OS user owns: it is opened without following a link,
and only as that user's regular file with one link (``safefs.open_regular``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pgoverlay.runner import safefs
from pgoverlay.runner.service.views import LogEntry
from pgoverlay.runner.trace.instrument import PREFIX, SCHEMA, STATEMENT_END, TRIGGERS

MAX_BYTES = 32 * 1024 * 1024
_HEAD = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) UTC \[(\d+)\] (.*)")
_LEVEL = re.compile(r"([A-Z]+):  ?(.*)", re.DOTALL)
# The first CONTEXT line of a RAISE in one of the trace's own functions.
_OURS = re.compile(
    rf"PL/pgSQL function {SCHEMA}\."
    rf"(({'|'.join(f for _, f in TRIGGERS.values())})\(\)|{STATEMENT_END}\(text,integer\)) "
    r"line \d+ at RAISE"
)


@dataclass(frozen=True)
class Chunk:
    """What a read found: the complete lines after the offset, where the next read starts,
    and whether lines were skipped (more than ``MAX_BYTES`` were new, or the file restarted)."""

    text: str
    offset: int
    truncated: bool
    restarted: bool = False


def size(path: Path, *, uid: int) -> int:
    """The log's size now (0 when it does not exist yet): where a trace starts reading."""
    try:
        fd = safefs.open_regular(path, os.O_RDONLY, uid=uid)
    except FileNotFoundError:
        return 0
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def read_new(path: Path, *, uid: int, offset: int, limit: int = MAX_BYTES) -> Chunk:
    """The complete lines written after ``offset`` (at most the last ``limit`` bytes of them).
    A partial last line is left for the next read."""
    try:
        fd = safefs.open_regular(path, os.O_RDONLY, uid=uid)
    except FileNotFoundError:
        return Chunk(text="", offset=0, truncated=False, restarted=offset > 0)
    try:
        end = os.fstat(fd).st_size
        restarted = end < offset  # a new file (the branch was reset): read it from its start
        start = 0 if restarted else offset
        truncated = end - start > limit
        if truncated:
            start = end - limit
        os.lseek(fd, start, os.SEEK_SET)
        data = _read_exactly(fd, end - start)
    finally:
        os.close(fd)
    if truncated:
        # The first line is probably a part of one: skip to the next.
        cut = data.find(b"\n") + 1
        start, data = start + cut, data[cut:]
    complete = data.rfind(b"\n") + 1
    return Chunk(
        text=data[:complete].decode(errors="replace"),
        offset=start + complete,
        truncated=truncated,
        restarted=restarted,
    )


def _read_exactly(fd: int, count: int) -> bytes:
    chunks: list[bytes] = []
    while count > 0:
        chunk = os.read(fd, min(count, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)


def _time(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC).timestamp()


def parse(text: str, *, user: str, database: str) -> list[LogEntry]:
    """The entries of sessions of ``user`` on ``database``, with their continuation lines;
    every other line (other users, the server's own processes, stray output) is skipped."""
    who = f"{user}@{database} "
    entries: list[LogEntry] = []
    current: dict[str, Any] | None = None
    for line in text.split("\n"):
        if line.startswith("\t"):
            if current is not None:
                current["message"] = f"{current['message']}\n{line[1:]}"
            continue
        if current is not None:
            entries.append(_entry(current))
            current = None
        head = _HEAD.fullmatch(line)
        if head is None or not head.group(3).startswith(who):
            continue
        level = _LEVEL.fullmatch(head.group(3)[len(who) :])
        if level is None:
            continue
        current = {
            "time": _time(head.group(1)),
            "pid": int(head.group(2)),
            "level": level.group(1),
            "message": level.group(2),
        }
    if current is not None:
        entries.append(_entry(current))
    return entries


def _entry(fields: dict[str, Any]) -> LogEntry:
    return LogEntry(
        time=fields["time"], pid=fields["pid"], level=fields["level"], message=fields["message"]
    )


def drop_forged(entries: list[LogEntry]) -> tuple[list[LogEntry], int]:
    """Entries without the ``pgoverlay-trace`` lines the trace's functions did not write, and
    how many there were. A line of ours is followed, in its session, by a CONTEXT entry whose
    first line names one of our functions; a role that logs such a line itself (RAISE LOG in
    a DO block or a function of its own) cannot give it that CONTEXT."""
    kept: list[LogEntry] = []
    forged = 0
    skipping: int | None = None  # pid whose forged entry's DETAIL/CONTEXT lines follow
    for i, entry in enumerate(entries):
        if skipping == entry.pid and entry.level in ("DETAIL", "CONTEXT", "STATEMENT", "HINT"):
            continue
        skipping = None
        if entry.level == "LOG" and entry.message.startswith(PREFIX):
            following = _next_of(entries, i, entry.pid)
            if (
                following is None
                or following.level != "CONTEXT"
                or not _OURS.fullmatch(following.message.split("\n", 1)[0])
            ):
                forged += 1
                skipping = entry.pid
                continue
        kept.append(entry)
    return kept, forged


def _next_of(entries: list[LogEntry], i: int, pid: int) -> LogEntry | None:
    """The first entry after ``entries[i]`` from process ``pid`` (no copy of the rest: a
    mark's log may hold many thousands of entries)."""
    for j in range(i + 1, len(entries)):
        if entries[j].pid == pid:
            return entries[j]
    return None
