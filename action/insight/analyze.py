"""One migration's trace -> ``MigrationInsight``: pure code on the marks taken before and
after it.

What production would feel is what is reported, so relations of the ledger schema (and, in
command mode, a migration tool's own tables: ``ledgers``) and relations the migration itself
created (nobody else can be using them) take no part in locks, rewrites or scans.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from pgoverlay.action import migrations
from pgoverlay.action.insight import (
    documented,
    ledgers,
    locks,
    logparse,
    marks,
    sqltext,
    tools,
    verdict,
)
from pgoverlay.action.insight import lint as lint_mod
from pgoverlay.action.insight.model import (
    LockSource,
    LockUse,
    MigrationInsight,
    Rewrite,
    RowWrites,
    Scan,
    StatementInsight,
    Thresholds,
    Verdict,
    Volume,
)
from pgoverlay.action.insight.verdict import RECREATED, REWRITE_REASONS, WITH_TABLE
from pgoverlay.runner.names import LEDGER_SCHEMA
from pgoverlay.runner.service.views import RelationState, TraceMark

KINDS = {
    "r": "table",
    "p": "partitioned table",
    "i": "index",
    "I": "partitioned index",
    "m": "materialized view",
    "S": "sequence",
    "t": "TOAST table",
    "v": "view",
    "f": "foreign table",
    "c": "composite type",
}
_TEXT_LIMIT = 500
# The log's times have millisecond precision: a sample may predate its statement's start by it.
_CLOCK_SLACK = 0.001

Relations = Mapping[int, RelationState]


class Book:
    """The branch's relations as the marks so far describe them: the first mark holds every
    relation, each later one only what changed and what was dropped."""

    def __init__(self, first: TraceMark) -> None:
        self._now: dict[int, RelationState] = {r.oid: r for r in first.relations}

    def advance(self, mark: TraceMark) -> tuple[dict[int, RelationState], dict[int, RelationState]]:
        """Apply the next mark; the relations before it and after it."""
        before = dict(self._now)
        for oid in mark.dropped:
            self._now.pop(oid, None)
        for rel in mark.relations:
            self._now[rel.oid] = rel
        return before, dict(self._now)


def rewrite_reasons(bits: int) -> list[str]:
    """Postgres's AT_REWRITE_* bits of a table_rewrite event, in words."""
    return [name for bit, name in REWRITE_REASONS if bits & bit]


def normalise(sql: str) -> str:
    """A statement's text without comments, whitespace or a final semicolon, to match what
    psql sent with what the file holds."""
    bare = sqltext.strip_comments(sql)
    return re.sub(r"\s+", "", bare).rstrip(";")


@dataclass
class _Hold:
    held: float = 0.0
    waited: float = 0.0
    source: LockSource = "sampled"


# How well a lock is known, worst first: an entry is as good as its best source.
_SOURCE_RANK: dict[LockSource, int] = {"sampled": 0, "inferred": 1, "exact": 2}


@dataclass(frozen=True)
class _Window:
    """A lock the trace read exactly: which backend held it, from when to when."""

    pid: int
    relation: int
    mode: str  # in capitals
    start: float
    end: float


@dataclass
class _Scanned:
    scans: int = 0
    rows: int = 0
    under: str = ""


@dataclass
class _Mapping:
    """Which logged statement is which statement of the migration."""

    index_of: dict[int, int]  # position in the parsed log -> statement index
    count: int
    lines: list[int | None]
    texts: list[str]
    notes: list[str]


class _Analysis:
    """The state of one analysis: relation lookups and what was attributed to whom."""

    def __init__(self, before: Relations, after: Relations, *, command: bool = False) -> None:
        self.before = before
        self.after = after
        self.command = command  # a migrate command's: the tool's own tables are its bookkeeping
        self.holds: dict[tuple[int | None, int, str], _Hold] = defaultdict(_Hold)
        self.scanned: dict[tuple[int | None, int], _Scanned] = defaultdict(_Scanned)
        # Indexes a concurrent drop removed: their last lock decides nothing (``documented``).
        self.dying: set[int] = set()
        # Rows each of the migration's transactions wrote, by its own counters (the last read
        # of a transaction is its whole): (vxid, relation) -> (inserted, updated, deleted).
        self.written: dict[tuple[str, int], tuple[int, int, int]] = {}
        # Whether a read lacked them (a base prepared before the trace read them): the tables'
        # own counters are then the only count.
        self.uncounted = False
        # Each table's whole size before the migration: itself, its TOAST and their indexes.
        self.whole: dict[int, int] = defaultdict(int)
        for oid, rel in before.items():
            self.whole[self.owner(oid)] += rel.bytes

    def state(self, oid: int) -> RelationState | None:
        return self.before.get(oid) or self.after.get(oid)

    def counts(self, oid: int) -> bool:
        """Whether a relation is one production has: it existed before, outside the ledger."""
        rel = self.before.get(oid)
        return rel is not None and not self.ledger(rel)

    def ledger(self, rel: RelationState) -> bool:
        """Whether a relation is bookkeeping: pgoverlay's ledger, or a migration tool's (a
        tool's table, or an index or TOAST table of one: ``alembic_version_pkc``)."""
        if rel.schema_name == LEDGER_SCHEMA:
            return True
        if not self.command:
            return False
        table = self.state(rel.table_oid) if rel.table_oid is not None else None
        return ledgers.is_tool_table(rel.name) or (
            table is not None and ledgers.is_tool_table(table.name)
        )

    def name(self, oid: int) -> str:
        rel = self.state(oid)
        return f"{rel.schema_name}.{rel.name}" if rel else str(oid)

    def owner(self, oid: int) -> int:
        """The table a relation belongs to: an index's table, a TOAST table's table, the table
        of a TOAST table's index; itself for anything else."""
        for _ in range(2):
            rel = self.state(oid)
            if rel is None or rel.kind not in ("i", "I", "t") or rel.table_oid is None:
                break
            oid = rel.table_oid
        return oid

    def kind(self, oid: int) -> str:
        rel = self.state(oid)
        return KINDS.get(rel.kind, rel.kind) if rel else "relation"

    def hold(
        self, index: int | None, oid: int, mode: str, held: float, source: LockSource = "sampled"
    ) -> None:
        entry = self.holds[(index, oid, locks.sql_name(mode))]
        entry.held = max(entry.held, _tenth_ms(held))
        entry.source = _better(entry.source, source)

    def wait(
        self,
        index: int | None,
        oid: int,
        mode: str,
        waited: float,
        source: LockSource = "sampled",
    ) -> None:
        entry = self.holds[(index, oid, locks.sql_name(mode))]
        entry.waited = max(entry.waited, _tenth_ms(waited))
        entry.source = _better(entry.source, source)


def _better(a: LockSource, b: LockSource) -> LockSource:
    return a if _SOURCE_RANK[a] >= _SOURCE_RANK[b] else b


# What a full scan reads: a table or a materialized view (an index is read by an index scan).
_SCANNED_KINDS = frozenset({KINDS["r"], KINDS["m"]})
_INDEX_KINDS = frozenset({KINDS["i"], KINDS["I"]})
_CONCURRENTLY = re.compile(r"\bCONCURRENTLY\b", re.IGNORECASE)


def _tenth_ms(seconds: float) -> float:
    """A difference of two epoch times, rid of the float noise of their size (the log's times
    have millisecond precision, the samples' far less)."""
    return round(seconds, 4)


def analyze(
    *,
    before: TraceMark,
    after: TraceMark,
    relations_before: Relations,
    relations_after: Relations,
    seconds: float,
    statements: Sequence[migrations.Statement] | None,
    ignore_pids: Collection[int],
    lint: Sequence[lint_mod.Raw],
    thresholds: Thresholds,
    marked: marks.Marked | None = None,
) -> MigrationInsight:
    """What one migration did, from the marks around it. ``statements`` are the file's (SQL
    mode); None in command mode, where the logged statements become the statements.
    ``marked`` is the file as psql read it, when its statements were marked."""
    parsed = logparse.parse(after.log, ignore_pids=ignore_pids)
    accepted, mark_notes = marks.accepted(parsed.statements, marked)
    mapped = _map(
        parsed.statements, statements, fixed={p: m.statement for p, m in accepted.items()}
    )
    work = _Analysis(relations_before, relations_after, command=statements is None)
    windows = _from_events(work, parsed.statements, mapped.index_of, accepted)
    inferred = _from_documented(work, parsed.statements, mapped.index_of, accepted, windows)
    sampled = _from_samples(
        work,
        before,
        after,
        parsed.statements,
        mapped.index_of,
        ignore_pids,
        [*windows, *(w for found in inferred.values() for w in found)],
    )
    _from_waits(work, parsed.statements, mapped.index_of)
    uses = _lock_uses(work)
    rewrites = _rewrites(work, parsed.statements, mapped.index_of, uses)
    timeouts = {
        mapped.index_of[p]: m.lock_timeout_ms / 1000
        for p, m in accepted.items()
        if m.lock_timeout_ms is not None and p in mapped.index_of
    }
    per_statement = [
        StatementInsight(
            index=i,
            line=mapped.lines[i],
            text=mapped.texts[i][:_TEXT_LIMIT],
            seconds=_seconds(parsed.statements, mapped.index_of, i),
            locks=_worst_first([u for u in uses if u.statement == i]),
            rewrites=[r for r in rewrites if r.statement == i],
            scans=_statement_scans(work, i),
            lock_timeout=timeouts.get(i),
        )
        for i in range(mapped.count)
    ]
    migration_locks = _longest(uses)
    rows = _rows(work, instrumented=before.instrumented and after.instrumented)
    insight = MigrationInsight(
        seconds=seconds,
        locks=migration_locks,
        rewrites=_first_per_relation(rewrites),
        scans=_migration_scans(work, migration_locks),
        volume=_volume(before, after, rows),
        statements=per_statement,
        findings=lint_mod.check(lint, file_statements=statements, measured=per_statement),
        verdict=Verdict("safe", ""),
        interval=after.interval,
        notes=[
            *_notes(before, after, parsed, mapped, sampled),
            *mark_notes,
            *_missed(work, parsed.statements, mapped, uses, rewrites, accepted, inferred, after),
        ],
        row_writes=_row_writes(work, rows),
    )
    insight = dataclasses.replace(insight, verdict=verdict.decide(insight, thresholds))
    if statements is not None:
        return insight
    whole = {i: parsed.statements[p] for p, i in mapped.index_of.items()}
    logged = [tools.Logged(whole[i].text, whole[i].parameters) for i in range(mapped.count)]
    return tools.sort_out(insight, logged, thresholds=thresholds, merge=_longest)


# -- which statement is which ---------------------------------------------------------------


def _map(
    logged: Sequence[logparse.Statement],
    statements: Sequence[migrations.Statement] | None,
    *,
    fixed: Mapping[int, int] | None = None,
) -> _Mapping:
    """SQL mode: the file's statements matched in order and by normalised text with the logged
    ones (psql's own BEGIN and COMMIT match nothing, silently), or, for a statement whose
    mark was accepted, by the index it carries (``fixed``). Command mode: the logged
    statements, less transaction control."""
    if statements is None:
        kept = [p for p, s in enumerate(logged) if not s.control]
        return _Mapping(
            index_of={p: i for i, p in enumerate(kept)},
            count=len(kept),
            lines=[None] * len(kept),
            texts=[logged[p].text for p in kept],
            notes=[],
        )
    matcher = difflib.SequenceMatcher(
        None, [normalise(s.text) for s in logged], [normalise(s.text) for s in statements], False
    )
    index_of: dict[int, int] = {}
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            index_of[block.a + k] = block.b + k
    if fixed:
        taken = set(fixed.values())
        index_of = {p: i for p, i in index_of.items() if i not in taken}
        index_of.update({p: i for p, i in fixed.items() if i < len(statements)})
    notes: list[str] = []
    strays = [s for p, s in enumerate(logged) if p not in index_of and not s.control]
    if strays:
        notes.append(
            f"{_count(len(strays), 'logged statement')} matched no statement of the file "
            f"(first: `{_short(strays[0].text)}`)"
        )
    if logged:
        seen = set(index_of.values())
        missing = [s for i, s in enumerate(statements) if i not in seen]
        if missing:
            notes.append(
                f"{_count(len(missing), 'statement')} of the file not seen in the server log "
                f"(first at line {missing[0].start_line})"
            )
    return _Mapping(
        index_of=index_of,
        count=len(statements),
        lines=[s.start_line for s in statements],
        texts=[_without_leading_comments(s.text) for s in statements],
        notes=notes,
    )


def _without_leading_comments(text: str) -> str:
    """A file's statement as psql sends it: the ``--`` lines before it are not part of it (its
    line number is already where the statement itself starts)."""
    lines = text.splitlines()
    while lines and (not lines[0].strip() or lines[0].lstrip().startswith("--")):
        lines.pop(0)
    return "\n".join(lines) or text


def _seconds(
    logged: Sequence[logparse.Statement], index_of: Mapping[int, int], index: int
) -> float | None:
    found = [logged[p].seconds for p, i in index_of.items() if i == index]
    return sum(found) if found else None


# -- locks ----------------------------------------------------------------------------------


def _from_events(
    work: _Analysis,
    logged: Sequence[logparse.Statement],
    index_of: Mapping[int, int],
    accepted: Mapping[int, logparse.StatementMark],
) -> list[_Window]:
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
    windows: dict[tuple[str, int, str], _Window] = {}
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
                    windows[(event.vxid, lock.relation, mode)] = _Window(
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
                full = work.kind(count.relation) in _SCANNED_KINDS
                if count.seq_scan > scans0 and under and work.counts(count.relation) and full:
                    entry = work.scanned[(index, count.relation)]
                    entry.scans += count.seq_scan - scans0
                    entry.rows += count.seq_tup_read - rows0
                    entry.under = _stronger(entry.under, under)
    return list(windows.values())


def _written(work: _Analysis, vxid: str, count: logparse.ScanCount) -> None:
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


def _from_documented(
    work: _Analysis,
    logged: Sequence[logparse.Statement],
    index_of: Mapping[int, int],
    accepted: Mapping[int, logparse.StatementMark],
    windows: Sequence[_Window],
) -> dict[int, list[_Window]]:
    """Locks of statements no mark read, where Postgres documents the mode the statement took
    (``documented``): held from the statement's start to its transaction's end; for the
    CONCURRENTLY forms and VACUUM, which run outside a transaction block, that is the whole
    statement, every internal transaction of it. A lock the trace read exactly is left as
    it is. The windows inferred are returned, by the position of the statement that gave
    each (samples inside one add nothing)."""
    gave: dict[int, list[_Window]] = defaultdict(list)
    for position, stmt in enumerate(logged):
        if stmt.control:
            continue
        for oid, mode in documented.locks(stmt.text, work.before):
            gone = work.kind(oid) in _INDEX_KINDS and oid not in work.after
            dying = mode == documented.DYING and gone and _CONCURRENTLY.search(stmt.text)
            if dying:  # a concurrent drop's last lock, however it was seen (a mark included)
                work.dying.add(oid)
            if position in accepted or not work.counts(oid):
                continue
            if _covered(windows, stmt.pid, oid, mode, stmt.start):
                continue
            start = stmt.transaction_end if dying else stmt.start  # at the end, an instant
            held = stmt.transaction_end - start
            work.hold(index_of.get(position), oid, mode, held, "inferred")
            window = _Window(stmt.pid, oid, mode, start, stmt.transaction_end)
            gave[position].append(window)
    return gave


def _covered(
    windows: Sequence[_Window],
    pid: int,
    oid: int,
    mode: str,
    at: float,
    *,
    early: float = _CLOCK_SLACK,
    late: float = _CLOCK_SLACK,
) -> bool:
    """Whether the trace read (or inferred) this lock in a window around ``at``, which may
    precede the window's start by ``early`` or follow its end by ``late``."""
    name = locks.sql_name(mode)
    return any(
        w.pid == pid
        and w.relation == oid
        and w.mode == name
        and w.start - early <= at <= w.end + max(late, _CLOCK_SLACK)
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


def _stronger(a: str, b: str) -> str:
    if not a:
        return b
    return a if locks.strength(a) >= locks.strength(b) else b


def _from_samples(
    work: _Analysis,
    before: TraceMark,
    after: TraceMark,
    logged: Sequence[logparse.Statement],
    index_of: Mapping[int, int],
    ignore_pids: Collection[int],
    windows: Sequence[_Window],
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
        started = [p for p in by_pid[span.pid] if logged[p].start <= span.first + _CLOCK_SLACK]
        running = max(started, key=lambda p: logged[p].start, default=None)
        inside = running is not None and span.first <= logged[running].end + _CLOCK_SLACK
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


def _from_waits(
    work: _Analysis, logged: Sequence[logparse.Statement], index_of: Mapping[int, int]
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


def _held(hold: _Hold) -> float:
    """How long a lock was held once granted: a read or inferred hold runs from its
    statement's start, so it holds the statement's wait for the lock too, which is reported
    apart (``waited_seconds``); a sampled one is timed from its first granted sighting."""
    if hold.source == "sampled":
        return hold.held
    return _tenth_ms(max(0.0, hold.held - hold.waited))


def _lock_uses(work: _Analysis) -> list[LockUse]:
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


def _worst_first(uses: Sequence[LockUse]) -> list[LockUse]:
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


def _longest(uses: Sequence[LockUse]) -> list[LockUse]:
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
    return _worst_first(list(best.values()))


# -- rewrites and scans ---------------------------------------------------------------------


def _rewrites(
    work: _Analysis,
    logged: Sequence[logparse.Statement],
    index_of: Mapping[int, int],
    uses: Sequence[LockUse],
) -> list[Rewrite]:
    """Relations whose filenode changed, with the reasons and statement of the rewrite events
    that named them or their table (else the statement that held ACCESS EXCLUSIVE on them)."""
    changed = {
        oid: (old, new)
        for oid, new in work.after.items()
        if (old := work.before.get(oid)) is not None
        and not work.ledger(old)
        and old.filenode
        and new.filenode
        and old.filenode != new.filenode
    }
    events: dict[int, list[tuple[int | None, int]]] = defaultdict(list)
    for position, stmt in enumerate(logged):
        for event in stmt.rewrites:
            events[event.relation].append((index_of.get(position), event.reason))
    found: list[Rewrite] = []
    for oid, (old, new) in changed.items():
        table = new.table_oid
        named = events[oid] or (events[table] if table is not None else [])
        statement = named[0][0] if named else _exclusive_holder(work, uses, oid, table)
        reasons: list[str] = []
        for index, bits in events[oid]:
            if index == statement:
                reasons += [r for r in rewrite_reasons(bits) if r not in reasons]
        if table is not None and table in changed:
            reasons.append(WITH_TABLE)
        found.append(
            _rewrite(work, oid, old, new, reasons, statement, table=work.owner(oid))
        )
        found += _later_rewrites(found[-1], named, with_table=WITH_TABLE in reasons)
    found += _recreated(work, uses, events, rewritten={o for o in changed})
    return sorted(found, key=lambda r: (-r.bytes_after, r.relation, r.statement or 0))


def _recreated(
    work: _Analysis,
    uses: Sequence[LockUse],
    events: Mapping[int, Sequence[tuple[int | None, int]]],
    *,
    rewritten: Collection[int],
) -> list[Rewrite]:
    """Indexes and TOAST tables of tables that existed before, dropped and made again by the
    migration under the same name: ``ALTER COLUMN ... TYPE`` creates its column's indexes
    again with new OIDs (a rewrite of the index), and a table's rewrite gives it a new TOAST
    table (and TOAST index) renamed as the old one was. One whose storage was kept (a
    binary-coercible type change, such as varchar widening, keeps its index's relfilenode) was
    not built again and is not one."""
    dropped: dict[tuple[str, str, int], RelationState] = {
        (old.schema_name, old.name, work.owner(oid)): old
        for oid, old in work.before.items()
        if oid not in work.after
        and old.kind in ("i", "I", "t")
        and old.table_oid is not None
        and old.schema_name != LEDGER_SCHEMA
    }
    found: list[Rewrite] = []
    for oid, new in work.after.items():
        old = dropped.get((new.schema_name, new.name, work.owner(oid)))
        if oid in work.before or old is None or new.filenode == old.filenode:
            continue
        table = work.owner(old.oid)
        named = events.get(table, [])
        statement = named[0][0] if named else _exclusive_holder(work, uses, table, None)
        toast = old.kind == "t" or work.owner(old.table_oid or 0) != old.table_oid
        reasons = [WITH_TABLE] if toast else [RECREATED]
        if not toast and table in rewritten:
            reasons.append(WITH_TABLE)
        found.append(
            _rewrite(work, oid, old, new, reasons, statement, table=table)
        )
    return found


def _later_rewrites(
    first: Rewrite, named: Sequence[tuple[int | None, int]], *, with_table: bool
) -> list[Rewrite]:
    """The same relation rewritten again by later statements of the migration (two ALTERs of
    one table): one entry for each, with that statement's own reasons. Sizes are the
    migration's: the trace measures them before and after it, not between statements."""
    by_statement: dict[int, list[str]] = {}
    for index, bits in named:
        if index is None or index == first.statement:
            continue
        own = by_statement.setdefault(index, [])
        if first.kind == "table" or not with_table:
            own += [r for r in rewrite_reasons(bits) if r not in own]
    return [
        dataclasses.replace(
            first, reasons=[*reasons, *([WITH_TABLE] if with_table else [])], statement=index
        )
        for index, reasons in by_statement.items()
    ]


def _rewrite(
    work: _Analysis,
    oid: int,
    old: RelationState,
    new: RelationState,
    reasons: list[str],
    statement: int | None,
    *,
    table: int,
) -> Rewrite:
    """Relation ``oid`` rewritten from ``old`` to ``new`` (sizes), counted on ``table``."""
    return Rewrite(
        relation=work.name(oid),
        kind=work.kind(oid),
        reasons=reasons,
        bytes_before=old.bytes,
        bytes_after=new.bytes,
        statement=statement,
        table=work.name(table),
        table_bytes=work.whole[table],
    )


def _first_per_relation(rewrites: Sequence[Rewrite]) -> list[Rewrite]:
    """One entry per relation for the migration, with every statement's reasons."""
    merged: dict[str, Rewrite] = {}
    for r in sorted(rewrites, key=lambda r: r.statement if r.statement is not None else -1):
        known = merged.get(r.relation)
        if known is None:
            merged[r.relation] = r
        else:
            reasons = [*known.reasons, *(x for x in r.reasons if x not in known.reasons)]
            merged[r.relation] = dataclasses.replace(known, reasons=reasons)
    return sorted(merged.values(), key=lambda r: (-r.bytes_after, r.relation))


def _exclusive_holder(
    work: _Analysis, uses: Sequence[LockUse], oid: int, table: int | None
) -> int | None:
    """The first statement that held ACCESS EXCLUSIVE on the relation or its table."""
    names = {work.name(oid)} | ({work.name(table)} if table is not None else set())
    holders = [
        u.statement
        for u in uses
        if u.relation in names and u.mode == "ACCESS EXCLUSIVE" and u.statement is not None
    ]
    return min(holders, default=None)


def _statement_scans(work: _Analysis, index: int) -> list[Scan]:
    return sorted(
        (
            Scan(work.name(oid), s.scans, s.rows, s.under, index)
            for (i, oid), s in work.scanned.items()
            if i == index
        ),
        key=lambda s: (-s.rows_read, s.relation),
    )


def _migration_scans(work: _Analysis, migration_locks: Sequence[LockUse]) -> list[Scan]:
    """Per table, the larger of the statements' scans and the table's own counters' delta,
    on tables that had a lock blocking writes in the window."""
    under: dict[int, str] = {}
    by_name = {work.name(oid): oid for oid in work.before}
    for use in migration_locks:
        oid = by_name.get(use.relation)
        if oid is not None and locks.covers(use.blocks, "writes"):
            under[oid] = _stronger(under.get(oid, ""), use.mode)
    totals: dict[int, _Scanned] = defaultdict(_Scanned)
    statements: dict[int, set[int | None]] = defaultdict(set)
    for (index, oid), s in work.scanned.items():
        totals[oid].scans += s.scans
        totals[oid].rows += s.rows
        totals[oid].under = _stronger(totals[oid].under, s.under)
        statements[oid].add(index)
    found: list[Scan] = []
    for oid in set(under) | set(totals):
        if work.kind(oid) not in _SCANNED_KINDS:
            continue
        old, new = work.before.get(oid), work.after.get(oid)
        scans, rows = totals[oid].scans, totals[oid].rows
        if old is not None and new is not None and oid in under:
            scans = max(scans, new.seq_scan - old.seq_scan)
            rows = max(rows, new.seq_tup_read - old.seq_tup_read)
        if scans <= 0:
            continue
        who = statements[oid]
        found.append(
            Scan(
                relation=work.name(oid),
                scans=scans,
                rows_read=rows,
                under=_stronger(totals[oid].under, under.get(oid, "")),
                statement=next(iter(who)) if len(who) == 1 else None,
            )
        )
    return sorted(found, key=lambda s: (-s.rows_read, s.relation))


def _rows(work: _Analysis, *, instrumented: bool) -> dict[int, tuple[int, int, int]]:
    """Rows the migration inserted, updated and deleted, per table (not the ledger's).

    What its transactions' own counters say (read exactly, with its locks, at each statement
    mark and DDL event), so another session's writes to the same table meanwhile (a preview
    app, a reviewer) are never counted as the migration's. A table's own counters (the
    statistics views' delta over the migration, which count every session's writes) stand in
    only where no transaction counter could see the writes: a table the migration created
    (nobody else knew it), one it held ``ROW EXCLUSIVE`` on through a statement no mark or
    event read (a data change in a migrate command, whose mode is inferred or sampled), and
    every table when the trace read no counters (no event triggers, or a base prepared
    before they were read)."""
    exact: dict[int, tuple[int, int, int]] = {}
    for (_, oid), (ins, upd, dele) in work.written.items():
        known = exact.get(oid, (0, 0, 0))
        exact[oid] = (known[0] + ins, known[1] + upd, known[2] + dele)
    unread = {
        oid
        for (index, oid, mode), hold in work.holds.items()
        if mode == "ROW EXCLUSIVE" and hold.source != "exact"
        and (index is not None or work.command)
    }  # fmt: skip
    whole = work.uncounted or not instrumented
    found: dict[int, tuple[int, int, int]] = {}
    for oid, rel in work.after.items():
        if rel.kind != "r" or work.ledger(rel):
            continue
        prior = work.before.get(oid)
        if whole or prior is None or oid in unread:
            counted = (
                max(0, rel.n_tup_ins - (prior.n_tup_ins if prior else 0)),
                max(0, rel.n_tup_upd - (prior.n_tup_upd if prior else 0)),
                max(0, rel.n_tup_del - (prior.n_tup_del if prior else 0)),
            )
        else:
            counted = exact.get(oid, (0, 0, 0))
        if any(counted):
            found[oid] = counted
    return found


def _row_writes(work: _Analysis, rows: Mapping[int, tuple[int, int, int]]) -> list[RowWrites]:
    """Tables that existed before the migration (not the ledger) whose rows it updated or
    deleted, most rows first."""
    found = [
        RowWrites(work.name(oid), upd, dele, work.whole[oid])
        for oid, (_, upd, dele) in rows.items()
        if (upd or dele) and work.counts(oid)
    ]
    return sorted(found, key=lambda w: (-(w.rows_updated + w.rows_deleted), w.relation))


def _volume(
    before: TraceMark, after: TraceMark, rows: Mapping[int, tuple[int, int, int]]
) -> Volume:
    """Rows the migration wrote to tables (``_rows``), WAL written, and the layer's growth."""
    return Volume(
        rows_inserted=sum(r[0] for r in rows.values()),
        rows_updated=sum(r[1] for r in rows.values()),
        rows_deleted=sum(r[2] for r in rows.values()),
        wal_bytes=max(0, after.wal_lsn - before.wal_lsn),
        layer_bytes=after.layer.physical_bytes - before.layer.physical_bytes,
    )


# -- notes ----------------------------------------------------------------------------------


def _notes(
    before: TraceMark,
    after: TraceMark,
    parsed: logparse.ParsedLog,
    mapped: _Mapping,
    sampled: bool,
) -> list[str]:
    """What was not measured, and why."""
    notes = list(after.notes)
    if not (before.instrumented and after.instrumented):
        notes.append(
            "the trace's event triggers were not in place: locks come from sampling alone, "
            "and rewrite reasons and per-statement scans are unknown"
        )
    if after.log_truncated:
        notes.append("the server log of this migration was larger than is kept: it was cut")
    if not after.log:
        notes.append(
            "the server log had no entries for this migration: statement times are unknown"
        )
    elif not parsed.statements:
        notes.append(
            "the server log had no statement durations for this migration "
            "(log_min_duration_statement must be 0)"
        )
    if parsed.malformed:
        notes.append(f"{_count(parsed.malformed, 'trace line')} could not be read")
    if sampled:
        notes.append(f"locks seen by sampling pg_locks are timed to {after.interval * 1000:.0f} ms")
    return notes + mapped.notes


# Statements that take no lock beyond ACCESS SHARE (or none): a lock missed on them is no loss.
_READ_ONLY = re.compile(
    r"^(SELECT\b(?!.*\bFOR\s+(UPDATE|NO\s+KEY\s+UPDATE|SHARE|KEY\s+SHARE)\b)(?!.*\bINTO\b)"
    r"|SHOW\b|SET\b|RESET\b|SAVEPOINT\b|RELEASE\b|EXPLAIN\b(?!.*\bANALY[SZ]E\b)"
    r"|DISCARD\b|DEALLOCATE\b|LISTEN\b|UNLISTEN\b|VALUES\b)",
    re.IGNORECASE | re.DOTALL,
)


def _missed(
    work: _Analysis,
    logged: Sequence[logparse.Statement],
    mapped: _Mapping,
    uses: Sequence[LockUse],
    rewrites: Sequence[Rewrite],
    accepted: Mapping[int, logparse.StatementMark],
    inferred: Collection[int],
    after: TraceMark,
) -> list[str]:
    """Where the sampler may have missed a lock: a relation rewritten with no lock seen on its
    table, and statements whose locks nothing read exactly or inferred that ran for less than
    a sampling interval."""
    notes: list[str] = []
    locked = {u.relation for u in uses}
    by_name = {work.name(oid): oid for oid in work.before}
    unlocked = []
    for r in rewrites:
        oid = by_name.get(r.relation)
        table = work.before[oid].table_oid if oid is not None else None
        names = {r.relation} | ({work.name(table)} if table is not None else set())
        if not names & locked and r.relation not in unlocked:
            unlocked.append(r.relation)
    if unlocked:
        notes.append(
            f"`{unlocked[0]}`{f' and {len(unlocked) - 1} more' if len(unlocked) > 1 else ''} "
            "rewritten with no lock seen on its table: a lock was missed (held for less than "
            f"the sampling interval, {after.interval * 1000:.0f} ms)"
        )
    short = [
        stmt
        for position, stmt in enumerate(logged)
        if position not in accepted
        and position not in inferred
        and not stmt.ddl
        and not stmt.control
        and (mapped.index_of.get(position) is not None)
        and not _READ_ONLY.match(_without_leading_comments(stmt.text).lstrip())
        and stmt.seconds < after.interval
        # a migrate command's bookkeeping (its own tables, the catalogs): not the migration's
        and not (work.command and tools.classify(stmt.text))
    ]
    if short:
        notes.append(
            f"{_count(len(short), 'statement')} whose locks were only sampled ran for less "
            f"than the sampling interval ({after.interval * 1000:.0f} ms): a lock "
            f"{'it' if len(short) == 1 else 'they'} took may be missing (first: "
            f"`{_short(short[0].text)}`)"
        )
    return notes


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _short(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= 60 else flat[:57] + "..."
