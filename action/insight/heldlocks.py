"""The locks one migration took, and which of its statements took each, from the trace's
four sources: DDL events and statement marks (exact), what the documentation says a
statement takes (inferred), pg_locks samples and lock waits (``analyze``). Pure."""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from pgoverlay.action.insight import documented, locks, logparse
from pgoverlay.action.insight.model import LockUse
from pgoverlay.action.insight.work import (
    KINDS,
    SCANNED_KINDS,
    Analysis,
    Hold,
    tenth_ms,
)
from pgoverlay.runner.service.views import TraceMark

# The log's times have millisecond precision: a sample may predate its statement's start by it.
CLOCK_SLACK = 0.001
INDEX_KINDS = frozenset({KINDS["i"], KINDS["I"]})
CONCURRENTLY = re.compile(r"\bCONCURRENTLY\b", re.IGNORECASE)


@dataclass(frozen=True)
class Window:
    """A lock the trace read exactly: which backend held it, from when to when."""

    pid: int
    relation: int
    mode: str  # in capitals
    start: float
    end: float


def from_events(
    work: Analysis,
    logged: Sequence[logparse.Statement],
    index_of: Mapping[int, int],
    accepted: Mapping[int, logparse.StatementMark],
) -> list[Window]:
    """Locks and scans from the DDL events and the statement marks: both read the backend's
    own pg_locks while its transaction held them (exact). A lock the transaction did not hold
    before a statement was taken by it, and is held from its start to its transaction's end
    (from the first of the unobserved statements before it in its transaction, when those
    left no event: one of them may have taken it); a later statement of the same transaction
    that reports it ran under it, and lists it with the same hold (the first taker stays the
    one a migration's lock is attributed to). Scans are the delta of the transaction's
    counters since its previous event, on relations the statement then holds a lock on that
    blocks writes. The windows of the locks read are returned."""
    held: dict[str, dict[tuple[int, str], float]] = defaultdict(dict)
    counters: dict[str, dict[int, tuple[int, int]]] = defaultdict(dict)
    windows: dict[tuple[str, int, str], Window] = {}
    unobserved: dict[int, tuple[int | None, float]] = {}  # pid -> (block, first start)
    for position, stmt in enumerate(logged):
        index = index_of.get(position)
        mark = accepted.get(position)
        events: list[logparse.DdlEvent | logparse.StatementMark] = [*stmt.ddl]
        if mark is not None:
            events.append(mark)
        since = unobserved.get(stmt.pid)
        # Only a mark's new locks may be an earlier unmarked statement's (a DDL event's are
        # the DDL's own, as they always were).
        start = stmt.start
        if mark is not None and since is not None and since[0] == stmt.block:
            start = since[1]
        if not events:
            if stmt.block is not None and not stmt.control:
                unobserved[stmt.pid] = (stmt.block, start)
            else:
                unobserved.pop(stmt.pid, None)
            continue
        unobserved.pop(stmt.pid, None)
        for event in events:
            for lock in event.locks:
                key = (lock.relation, lock.mode)
                first = start if isinstance(event, logparse.StatementMark) else stmt.start
                taken = held[event.vxid].setdefault(key, first)
                if work.counts(lock.relation):
                    work.hold(
                        index, lock.relation, lock.mode, stmt.transaction_end - taken, "exact"
                    )
                    mode = locks.sql_name(lock.mode)
                    windows[(event.vxid, lock.relation, mode)] = Window(
                        stmt.pid, lock.relation, mode, taken, stmt.transaction_end
                    )
            for count in event.scans:
                if index is not None or work.command:  # not another session's stray statement
                    _written(work, event.vxid, count)
                scans0, rows0 = counters[event.vxid].get(count.relation, (0, 0))
                counters[event.vxid][count.relation] = (count.seq_scan, count.seq_tup_read)
                under = _write_blocking(held[event.vxid], count.relation)
                # a table's or materialized view's own: an index's counter counts index scans
                # (a rewrite reads its TOAST through the TOAST table's index)
                full = work.kind(count.relation) in SCANNED_KINDS
                if count.seq_scan > scans0 and under and work.counts(count.relation) and full:
                    entry = work.scanned[(index, count.relation)]
                    entry.scans += count.seq_scan - scans0
                    entry.rows += count.seq_tup_read - rows0
                    entry.under = stronger(entry.under, under)
    return list(windows.values())


def _written(work: Analysis, vxid: str, count: logparse.ScanCount) -> None:
    """Keep a transaction's own row counters of a relation (cumulative: the largest read)."""
    if count.inserted is None or count.updated is None or count.deleted is None:
        work.uncounted = True
        return
    known = work.written.get((vxid, count.relation), (0, 0, 0))
    work.written[(vxid, count.relation)] = (
        max(known[0], count.inserted),
        max(known[1], count.updated),
        max(known[2], count.deleted),
    )


def from_documented(
    work: Analysis,
    logged: Sequence[logparse.Statement],
    index_of: Mapping[int, int],
    accepted: Mapping[int, logparse.StatementMark],
    windows: Sequence[Window],
) -> dict[int, list[Window]]:
    """Locks of statements no mark read, where Postgres documents the mode the statement took
    (``documented``): held from the statement's start to its transaction's end; for the
    CONCURRENTLY forms and VACUUM, which run outside a transaction block, that is the whole
    statement, every internal transaction of it. A lock the trace read exactly is left as
    it is. The windows inferred are returned, by the position of the statement that gave
    each (samples inside one add nothing)."""
    gave: dict[int, list[Window]] = defaultdict(list)
    for position, stmt in enumerate(logged):
        if stmt.control:
            continue
        for oid, mode in documented.locks(stmt.text, work.before):
            gone = work.kind(oid) in INDEX_KINDS and oid not in work.after
            dying = mode == documented.DYING and gone and CONCURRENTLY.search(stmt.text)
            if dying:  # a concurrent drop's last lock, however it was seen (a mark included)
                work.dying.add(oid)
            if position in accepted or not work.counts(oid):
                continue
            if _covered(windows, stmt.pid, oid, mode, stmt.start):
                continue
            start = stmt.transaction_end if dying else stmt.start  # at the end, an instant
            held = stmt.transaction_end - start
            work.hold(index_of.get(position), oid, mode, held, "inferred")
            window = Window(stmt.pid, oid, mode, start, stmt.transaction_end)
            gave[position].append(window)
    return gave


def _covered(
    windows: Sequence[Window],
    pid: int,
    oid: int,
    mode: str,
    at: float,
    *,
    early: float = CLOCK_SLACK,
    late: float = CLOCK_SLACK,
) -> bool:
    """Whether the trace read (or inferred) this lock in a window around ``at``, which may
    precede the window's start by ``early`` or follow its end by ``late``."""
    name = locks.sql_name(mode)
    return any(
        w.pid == pid
        and w.relation == oid
        and w.mode == name
        and w.start - early <= at <= w.end + max(late, CLOCK_SLACK)
        for w in windows
    )


def _write_blocking(held: Collection[tuple[int, str]], relation: int) -> str:
    """The strongest mode held on ``relation`` that blocks writes, or ""."""
    modes = [
        locks.sql_name(mode)
        for rel, mode in held
        if rel == relation and locks.covers(locks.blocks(mode), "writes")
    ]
    return max(modes, key=locks.strength, default="")


def stronger(a: str, b: str) -> str:
    if not a:
        return b
    return a if locks.strength(a) >= locks.strength(b) else b


def from_samples(
    work: Analysis,
    before: TraceMark,
    after: TraceMark,
    logged: Sequence[logparse.Statement],
    index_of: Mapping[int, int],
    ignore_pids: Collection[int],
    windows: Sequence[Window],
) -> bool:
    """Sampled spans, given to the statement their pid was running when the span was first
    seen (or ran last before it: a lock outlives its statement until the transaction ends).
    A span first seen before this migration began (a lock still held at the previous mark,
    which the trace reports again) is not this migration's, and one of a lock the trace read
    exactly, or inferred, adds nothing. The sampler folds per transaction: the spans of one
    lock that one statement held across its own transactions (CREATE INDEX CONCURRENTLY's
    session lock) are joined into one, from the first sighting to the last. True if any span
    counted."""
    by_pid: dict[int, list[int]] = defaultdict(list)
    for position, stmt in enumerate(logged):
        by_pid[stmt.pid].append(position)
    joined: dict[tuple[int | None, int, int, str, bool], list[tuple[float, float]]] = {}
    used = False
    for span in sorted(after.locks, key=lambda s: s.first):
        if span.pid in ignore_pids or not work.counts(span.relation) or span.first < before.at:
            continue
        try:
            locks.sql_name(span.mode)
        except ValueError:
            continue
        # A statement's start is its logged end less its duration, and the end is logged a
        # moment after the statement ends (later still on a busy server); a sample is a read
        # of the lock table that takes time of its own: a sighting up to an interval before a
        # window's start, or after its end, is the same lock, not the next statement's.
        if span.granted and _covered(
            windows,
            span.pid,
            span.relation,
            span.mode,
            span.first,
            early=after.interval,
            late=after.interval,
        ):
            continue
        used = True
        started = [p for p in by_pid[span.pid] if logged[p].start <= span.first + CLOCK_SLACK]
        running = max(started, key=lambda p: logged[p].start, default=None)
        inside = running is not None and span.first <= logged[running].end + CLOCK_SLACK
        key = (running if inside else None, span.pid, span.relation, span.mode, span.granted)
        pieces = joined.setdefault(key, [])
        if key[0] is not None and pieces and span.first - pieces[-1][1] <= 2 * after.interval:
            pieces[-1] = (pieces[-1][0], max(pieces[-1][1], span.last))
        else:
            pieces.append((span.first, span.last))
        index = index_of.get(running) if running is not None else None
        first, last = pieces[-1]
        if span.granted:
            work.hold(index, span.relation, span.mode, last - first)
        else:
            work.wait(index, span.relation, span.mode, last - first)
    return used


def from_waits(
    work: Analysis, logged: Sequence[logparse.Statement], index_of: Mapping[int, int]
) -> None:
    """Waits ``log_lock_waits`` reported, on the statement that waited."""
    for position, stmt in enumerate(logged):
        for wait in stmt.waits:
            if wait.relation is None or not work.counts(wait.relation):
                continue
            try:
                work.wait(index_of.get(position), wait.relation, wait.mode, wait.seconds, "exact")
            except ValueError:
                continue


def _held(hold: Hold) -> float:
    """How long a lock was held once granted: a read or inferred hold runs from its
    statement's start, so it holds the statement's wait for the lock too, which is reported
    apart (``waited_seconds``); a sampled one is timed from its first granted sighting."""
    if hold.source == "sampled":
        return hold.held
    return tenth_ms(max(0.0, hold.held - hold.waited))


def lock_uses(work: Analysis) -> list[LockUse]:
    return [
        LockUse(
            relation=work.name(oid),
            kind=work.kind(oid),
            mode=mode,
            blocks=locks.blocks(mode),
            held_seconds=_held(hold),
            waited_seconds=hold.waited,
            statement=index,
            bytes=work.before[oid].bytes,
            table=work.name(work.owner(oid)),
            table_bytes=work.whole[work.owner(oid)],
            source=hold.source,
            dying=oid in work.dying and mode == documented.DYING,
        )
        for (index, oid, mode), hold in work.holds.items()
    ]


def worst_first(uses: Sequence[LockUse]) -> list[LockUse]:
    """Tables worst first (what their locks block, then how long, then the stronger mode), each
    table's own locks together; within a table, what it blocks first and the table before its
    indexes and TOAST table, so that a hold a sample or a rounding made a little longer never
    puts ``pg_toast.*`` or an index ahead of its table."""

    def rank(u: LockUse) -> tuple[int, float, int]:
        return (-locks.severity(u.blocks), -u.held_seconds, -locks.strength(u.mode))

    worst: dict[str, tuple[int, float, int]] = {}
    for u in uses:
        table = u.table or u.relation
        worst[table] = min(worst.get(table, rank(u)), rank(u))
    return sorted(
        uses,
        key=lambda u: (
            worst[u.table or u.relation],
            u.table or u.relation,
            -locks.severity(u.blocks),
            bool(u.table) and u.relation != u.table,
            rank(u),
            u.relation,
        ),
    )


def longest(uses: Sequence[LockUse]) -> list[LockUse]:
    """Per relation and mode, the longest hold (with the longest wait), worst first."""
    best: dict[tuple[str, str], LockUse] = {}
    for use in uses:
        key = (use.relation, use.mode)
        known = best.get(key)
        if known is None or use.held_seconds > known.held_seconds:
            waited = max(use.waited_seconds, known.waited_seconds if known else 0.0)
            best[key] = dataclasses.replace(use, waited_seconds=waited)
        else:
            waited = max(use.waited_seconds, known.waited_seconds)
            best[key] = dataclasses.replace(known, waited_seconds=waited)
    return worst_first(list(best.values()))
