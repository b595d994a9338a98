"""The branch's server log, read back as statements: when each ran, how long, in which
transaction block, and what the trace's event triggers and ``log_lock_waits`` said about it.

With ``log_min_duration_statement = 0`` every statement that completes logs one line,
``duration: 12.345 ms  statement: TEXT`` (simple protocol) or one line per phase of the
extended protocol, ``duration: X ms  parse|bind|execute NAME: TEXT``. A log entry's time is when
the line was written, the statement's end; the start is the end less the duration. The event
triggers' lines (``pgoverlay-trace {json}``) and lock waits come from the same backend before
its statement's duration line, so they belong to the next statement that pid completes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from pgoverlay.runner.service.views import LogEntry

TRACE_PREFIX = "pgoverlay-trace "
_DURATION = re.compile(
    r"^duration: (?P<ms>\d+(?:\.\d+)?) ms\s+"
    r"(?:statement: |(?P<phase>parse|bind|execute)(?: fetch from)? [^:]*: )(?P<text>.*)$",
    re.DOTALL,
)
_WAIT = re.compile(
    r"^process (?P<pid>\d+) (?P<state>still waiting for|acquired) (?P<mode>\w+) on "
    r"(?:relation (?P<rel>\d+) of database \d+|.+?) after (?P<ms>\d+(?:\.\d+)?) ms"
)
_BEGIN = re.compile(r"^(BEGIN|START\s+TRANSACTION)\b", re.IGNORECASE)
_END = re.compile(r"^(COMMIT|END|ROLLBACK|ABORT)\b(?!\s+PREPARED)", re.IGNORECASE)
_LEADING_COMMENTS = re.compile(r"^(\s+|--[^\n]*(\n|$)|/\*.*?\*/)*", re.DOTALL)
_PARAMETERS = "parameters: "  # a DETAIL line's start, for the extended protocol's values
# What psql sends for a statement ``pgoverlay.action.insight.marks`` marked ends with this (psql
# turns the ``\;`` into ``;``).
_SUFFIX = re.compile(
    r";\s*CALL\s+pgoverlay_trace\.statement_end\('(?P<nonce>[0-9a-f]{1,64})',\s*(?P<index>\d+)\);?\s*$"
)
# Continuation entries of an error or notice: never a statement of their own.
_CONTINUATION = {"DETAIL", "CONTEXT", "STATEMENT", "HINT", "QUERY", "LOCATION"}


@dataclass(frozen=True)
class HeldLock:
    relation: int
    mode: str  # as pg_locks names it


@dataclass(frozen=True)
class ScanCount:
    """A transaction's own counters of one relation: its sequential scans and the rows they
    read, and the rows it inserted, updated and deleted (None from a base prepared before the
    trace read them)."""

    relation: int
    seq_scan: int
    seq_tup_read: int
    inserted: int | None = None
    updated: int | None = None
    deleted: int | None = None


def _count(x: dict[str, object]) -> ScanCount:
    def optional(key: str) -> int | None:
        value = x.get(key)
        return None if value is None else int(str(value))

    return ScanCount(
        int(str(x["rel"])),
        int(str(x["seq_scan"])),
        int(str(x["seq_tup_read"])),
        optional("ins"),
        optional("upd"),
        optional("del"),
    )


@dataclass(frozen=True)
class DdlEvent:
    """The end of one DDL command: the locks its backend then held, and its transaction's
    cumulative scan counters."""

    tag: str
    vxid: str
    locks: list[HeldLock]
    scans: list[ScanCount]


@dataclass(frozen=True)
class StatementMark:
    """A call of the statement procedure: the locks its backend then held, its transaction's
    cumulative scan counters, the ``lock_timeout`` in force, and who it says it is (the
    migration's nonce and the statement's index)."""

    nonce: str
    statement: int
    vxid: str
    locks: list[HeldLock]
    scans: list[ScanCount]
    lock_timeout_ms: int | None
    at: float


@dataclass(frozen=True)
class RewriteEvent:
    """A table about to be rewritten; ``reason`` holds Postgres's AT_REWRITE_* bits."""

    relation: int
    reason: int
    vxid: str


@dataclass(frozen=True)
class LockWait:
    relation: int | None  # None: a wait on something else (a transaction id, a tuple)
    mode: str  # as pg_locks names it
    seconds: float  # the longest wait the log reported
    acquired: bool


@dataclass(frozen=True)
class Statement:
    """One completed statement of one backend."""

    pid: int
    start: float  # server clock, epoch seconds
    end: float
    seconds: float  # the server's own duration (with parse and bind, for the extended protocol)
    text: str
    block: int | None  # the transaction block it ran in (an id within one parse), or None
    transaction_end: float  # when its locks were released: its block's COMMIT, or its own end
    ddl: list[DdlEvent] = field(default_factory=list)
    rewrites: list[RewriteEvent] = field(default_factory=list)
    waits: list[LockWait] = field(default_factory=list)
    # The extended protocol's values, as the DETAIL line after the statement gives them
    # ("$1 = 'shop', $2 = NULL"); "" for the simple protocol.
    parameters: str = ""
    marks: list[StatementMark] = field(default_factory=list)  # in the order they were logged
    # The (nonce, index) of the call a statement mark appended to the query (not in ``text``).
    called: tuple[str, int] | None = None

    @property
    def control(self) -> bool:
        """True for transaction control (BEGIN, COMMIT, ...), which takes no locks of its own."""
        bare = _LEADING_COMMENTS.sub("", self.text)
        return bool(_BEGIN.match(bare) or _END.match(bare))


@dataclass
class _Pending:
    """What one backend logged since its last completed statement."""

    ddl: list[DdlEvent] = field(default_factory=list)
    rewrites: list[RewriteEvent] = field(default_factory=list)
    waits: dict[tuple[int | None, str], LockWait] = field(default_factory=dict)
    marks: list[StatementMark] = field(default_factory=list)
    phase_seconds: float = 0.0  # parse and bind of the extended protocol, before its execute
    phase_start: float | None = None


@dataclass(frozen=True)
class ParsedLog:
    statements: list[Statement]  # in the order they completed
    malformed: int = 0  # trace lines that could not be read
    orphans: int = 0  # trace events with no statement after them (the log ended first)


def parse(entries: Iterable[LogEntry], *, ignore_pids: Iterable[int] = ()) -> ParsedLog:
    """Read the log of one migration into statements; entries of ``ignore_pids`` are skipped."""
    ignored = set(ignore_pids)
    pending: dict[int, _Pending] = {}
    statements: list[Statement] = []
    malformed = 0
    just_done: dict[int, int] = {}  # pid -> its statement whose DETAIL may follow
    for entry in entries:
        if entry.pid in ignored:
            continue
        done = just_done.pop(entry.pid, None)
        if entry.level.upper() in _CONTINUATION:
            if done is not None and entry.level.upper() == "DETAIL":
                values = entry.message.removeprefix(_PARAMETERS)
                if values != entry.message:
                    statements[done] = replace(statements[done], parameters=values)
            continue
        state = pending.setdefault(entry.pid, _Pending())
        message = entry.message
        if message.startswith(TRACE_PREFIX):
            malformed += not _read_event(message.removeprefix(TRACE_PREFIX), state)
            continue
        wait = _WAIT.match(message)
        if wait:
            _add_wait(state, wait)
            continue
        found = _DURATION.match(message)
        if not found:
            continue
        seconds = float(found.group("ms")) / 1000
        phase = found.group("phase")
        if phase in ("parse", "bind"):
            start = entry.time - seconds
            state.phase_start = start if state.phase_start is None else state.phase_start
            state.phase_seconds += seconds
            continue
        start = entry.time - seconds
        if state.phase_start is not None:
            start = min(start, state.phase_start)
        text, called = split_call(found.group("text").strip())
        statements.append(
            Statement(
                pid=entry.pid,
                start=start,
                end=entry.time,
                seconds=seconds + state.phase_seconds,
                text=text,
                block=None,
                transaction_end=entry.time,
                ddl=state.ddl,
                rewrites=state.rewrites,
                waits=list(state.waits.values()),
                marks=state.marks,
                called=called,
            )
        )
        pending[entry.pid] = _Pending()
        just_done[entry.pid] = len(statements) - 1
    orphans = sum(len(p.ddl) + len(p.rewrites) + len(p.marks) for p in pending.values())
    return ParsedLog(_blocks(statements), malformed=malformed, orphans=orphans)


def _read_event(payload: str, state: _Pending) -> bool:
    """Add one event trigger line to its backend's pending events; False if unreadable."""
    try:
        event = json.loads(payload)
        if event["event"] == "ddl":
            state.ddl.append(
                DdlEvent(
                    tag=str(event.get("tag", "")),
                    vxid=str(event["vxid"]),
                    locks=[HeldLock(int(x["rel"]), str(x["mode"])) for x in event["locks"]],
                    scans=[_count(x) for x in event.get("scans", [])],
                )
            )
        elif event["event"] == "statement":
            timeout = event.get("lock_timeout_ms")
            state.marks.append(
                StatementMark(
                    nonce=str(event["nonce"]),
                    statement=int(event["statement"]),
                    vxid=str(event["vxid"]),
                    locks=[HeldLock(int(x["rel"]), str(x["mode"])) for x in event["locks"]],
                    scans=[_count(x) for x in event["scans"]],
                    lock_timeout_ms=int(timeout) if timeout is not None else None,
                    at=float(event["at"]),
                )
            )
        elif event["event"] == "rewrite":
            state.rewrites.append(
                RewriteEvent(int(event["rel"]), int(event["reason"]), str(event["vxid"]))
            )
        else:
            return False
    except (ValueError, KeyError, TypeError):
        return False
    return True


def _add_wait(state: _Pending, found: re.Match[str]) -> None:
    """Keep the longest wait per (relation, mode): "still waiting" repeats, "acquired" ends."""
    rel = int(found.group("rel")) if found.group("rel") else None
    key = (rel, found.group("mode"))
    seconds = float(found.group("ms")) / 1000
    acquired = found.group("state") == "acquired"
    before = state.waits.get(key)
    if before is not None:
        seconds = max(seconds, before.seconds)
        acquired = acquired or before.acquired
    state.waits[key] = LockWait(rel, found.group("mode"), seconds, acquired)


def _blocks(statements: Sequence[Statement]) -> list[Statement]:
    """Give each statement its transaction block (BEGIN ... COMMIT of the same pid) and the time
    its locks were released. A block the log does not see end is taken to end with its last
    statement: the best the log knows."""
    block_of: list[int | None] = []
    open_block: dict[int, int] = {}
    block_end: dict[int, float] = {}
    next_id = 0
    for stmt in statements:
        bare = _LEADING_COMMENTS.sub("", stmt.text)
        block = open_block.get(stmt.pid)
        if block is None and _BEGIN.match(bare):
            block = open_block[stmt.pid] = next_id
            next_id += 1
        block_of.append(block)
        if block is not None:
            block_end[block] = stmt.end
            if _END.match(bare):
                del open_block[stmt.pid]
    return [
        replace(s, block=b, transaction_end=s.end if b is None else block_end[b])
        for s, b in zip(statements, block_of, strict=True)
    ]


def split_call(logged: str) -> tuple[str, tuple[str, int] | None]:
    """A logged query without the call a mark added, and the call's (nonce, index); the text as
    it is and None when it holds no such call at its end."""
    found = _SUFFIX.search(logged)
    if found is None:
        return logged, None
    return logged[: found.start() + 1], (found.group("nonce"), int(found.group("index")))
