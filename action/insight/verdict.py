"""One line per migration: what production would feel, and what to do about it.

The kind is the first rule of ``KINDS`` that applies, and depends on what was done, never on
how big the table is or how long the lock was held: a lock that blocks reads or writes is
reported however short, because in production it first waits behind any transaction running
on the table, and every query that needs the table waits behind it (the lock queue). Only
relations that existed before the migration count (the analysis leaves out the others).

The level says whether a threshold was crossed: "over" when a lock that blocks reads or writes
was held longer than ``max_blocking_lock``, or a table's rewrite (the table, its TOAST and its
indexes together) wrote more than ``max_rewrite`` bytes; else "notice" for every kind but
"safe online", which is "safe". The advice comes from what caused it: the rewrite's reasons,
else the statement's text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pgoverlay.action.insight import locks, sqltext
from pgoverlay.action.insight.model import (
    LockUse,
    MigrationInsight,
    Rewrite,
    RowWrites,
    Thresholds,
    Verdict,
    VerdictKind,
    VerdictLevel,
)
from pgoverlay.runner.units import format_bytes

WITH_TABLE = "rebuilt with its table"  # an index or TOAST table rewritten with its table
RECREATED = "re-created"  # an index dropped and built again under its name (new oid)
# Postgres's AT_REWRITE_* bits (commands/event_trigger.h) in a table_rewrite event, in words.
REWRITE_REASONS = (
    (1, "SET LOGGED/UNLOGGED"),  # AT_REWRITE_ALTER_PERSISTENCE
    (2, "volatile default"),  # AT_REWRITE_DEFAULT_VAL
    (4, "column type change"),  # AT_REWRITE_COLUMN_REWRITE
    (8, "access method"),  # AT_REWRITE_ACCESS_METHOD
)

_REASON_ADVICE = (
    (
        "column type change",
        "add a new column and backfill it in batches instead of changing the type in place",
    ),
    (
        "volatile default",
        "add the column without the volatile default, then backfill it in batches",
    ),
    (
        "SET LOGGED/UNLOGGED",
        "SET LOGGED/UNLOGGED rewrites the table: leave it to a maintenance window",
    ),
    (
        "access method",
        "changing the access method rewrites the table: leave it to a maintenance window",
    ),
)
# (pattern on the statement's text in capitals without comments, advice), first match wins.
_TEXT_ADVICE = (
    (r"^CREATE (UNIQUE )?INDEX (?!CONCURRENTLY)", "consider CREATE INDEX CONCURRENTLY"),
    (r"^DROP INDEX (?!CONCURRENTLY)", "consider DROP INDEX CONCURRENTLY"),
    (r"^REINDEX (?!.*CONCURRENTLY)", "consider REINDEX CONCURRENTLY"),
    (
        r"^REFRESH MATERIALIZED VIEW (?!CONCURRENTLY)",
        "consider REFRESH MATERIALIZED VIEW CONCURRENTLY (it needs a unique index)",
    ),
    (
        r"\bSET NOT NULL\b",
        "add a CHECK (... IS NOT NULL) NOT VALID constraint, VALIDATE it, "
        "then SET NOT NULL: it skips the scan",
    ),
    (
        r"\bADD (CONSTRAINT (\"[^\"]*\"|\S+) )?(FOREIGN KEY|CHECK)\b(?!.*\bNOT VALID\b)",
        "add the constraint NOT VALID, then VALIDATE CONSTRAINT in its own transaction",
    ),
    (
        r"\bADD (CONSTRAINT (\"[^\"]*\"|\S+) )?(UNIQUE|PRIMARY KEY)\b(?!.*\bUSING INDEX\b)",
        "build a unique index CONCURRENTLY, then ADD CONSTRAINT ... USING INDEX",
    ),
    (
        r"\bADD (COLUMN )?(IF NOT EXISTS )?"
        r"(?!(CONSTRAINT|FOREIGN|PRIMARY|UNIQUE|CHECK|EXCLUDE)\b)"
        r"(\"[^\"]*\"|\S+) [^,]*\bREFERENCES\b",
        "add the column without REFERENCES, then the foreign key NOT VALID, then VALIDATE it "
        "in its own transaction",
    ),
    (
        r"^(VACUUM\s*(\([^)]*\bFULL\b|FULL\b)|CLUSTER\b)",
        "VACUUM FULL and CLUSTER rewrite under ACCESS EXCLUSIVE: "
        "use pg_repack or pg_squeeze on a live table",
    ),
    (
        r"\bDETACH PARTITION\b(?!.*\bCONCURRENTLY\b)",
        "consider DETACH PARTITION ... CONCURRENTLY (outside a transaction block)",
    ),
    (
        r"\bATTACH PARTITION\b",
        "first add a CHECK constraint matching the partition bound to the partition "
        "(NOT VALID, then VALIDATE): ATTACH then skips its scan",
    ),
    (
        r"\bSET TABLESPACE\b",
        "SET TABLESPACE copies the table under ACCESS EXCLUSIVE: leave it to a maintenance window",
    ),
    (
        r"^TRUNCATE\b",
        "TRUNCATE takes ACCESS EXCLUSIVE: to empty a busy table, DELETE in batches",
    ),
)
# Checked before the rewrite's reasons: statements whose reason would give the wrong advice.
_TEXT_FIRST = (
    (
        r"\bGENERATED ALWAYS AS \(.*\) STORED\b",
        "a stored generated column rewrites the table: add a plain column, fill it in batches "
        "and keep it current with a trigger",
    ),
)
_UNTIL_COMMIT = "the lock is held until COMMIT: run slow statements in a transaction of their own"
_REMEDY = "set lock_timeout (e.g. SET lock_timeout = '2s') and retry"
_ROWS_ADVICE = (
    "update or delete in batches of a few thousand rows, each batch in its own transaction"
)


@dataclass(frozen=True)
class Kind:
    """One verdict class: its name and its rule, in the words docs/insight.md uses."""

    name: VerdictKind
    rule: str
    applies: Callable[[MigrationInsight], bool]


@dataclass(frozen=True)
class TableRewrite:
    """A table's rewrite, its indexes and TOAST table folded in."""

    table: str
    table_bytes: int  # the table's whole size before the migration
    bytes_after: int  # what the rewrite wrote: the sizes after of every relation rewritten
    reasons: list[str]  # Postgres's reasons, and "re-created" for an index built again
    statement: int | None


def table_rewrites(rewrites: Sequence[Rewrite]) -> list[TableRewrite]:
    """``rewrites`` folded onto their tables (``Rewrite.table``; the relation itself when it is
    unset), most bytes written first."""
    groups: dict[str, list[Rewrite]] = {}
    for r in rewrites:
        groups.setdefault(r.table or r.relation, []).append(r)
    found = []
    for table, group in groups.items():
        reasons: list[str] = []
        for r in group:
            reasons += [x for x in r.reasons if x != WITH_TABLE and x not in reasons]
        # the same relation rewritten by two statements counts once, at its size after
        written = {r.relation: r.bytes_after for r in group}
        statements = [r.statement for r in group if r.statement is not None]
        found.append(
            TableRewrite(
                table=table,
                table_bytes=max(
                    r.table_bytes or (r.bytes_before if r.relation == table else 0) for r in group
                ),
                bytes_after=sum(written.values()),
                reasons=reasons,
                statement=min(statements, default=None),
            )
        )
    return sorted(found, key=lambda t: (-t.bytes_after, t.table))


# What the rules count: tables and materialized views, their indexes and TOAST tables (not a
# sequence, a view or a foreign table).
COUNTED_KINDS = frozenset(
    {"table", "partitioned table", "materialized view", "index", "partitioned index",
     "TOAST table"}
)  # fmt: skip


def _counted_locks(insight: MigrationInsight) -> list[LockUse]:
    """The locks the rules count: on tables and what belongs to them, but a concurrent drop's
    last lock on a dead index (``LockUse.dying``)."""
    return [u for u in insight.locks if u.kind in COUNTED_KINDS and not u.dying]


def _counted_rewrites(insight: MigrationInsight) -> list[Rewrite]:
    return [r for r in insight.rewrites if r.kind in COUNTED_KINDS]


def _blocking(insight: MigrationInsight, what: str) -> bool:
    return any(u.blocks == what for u in _counted_locks(insight))


KINDS: tuple[Kind, ...] = (
    Kind(
        "rewrite",
        "the storage of a table or materialized view that existed before was rewritten (its "
        "relfilenode changed), or one of its indexes was, including an index dropped and "
        "created again under its name",
        lambda i: bool(_counted_rewrites(i)),
    ),
    Kind(
        "blocks reads and writes",
        "a lock that conflicts with ACCESS SHARE (what SELECT takes) was taken on a table, "
        "materialized view, index or TOAST table, for any time, however short",
        lambda i: _blocking(i, "reads and writes"),
    ),
    Kind(
        "blocks writes",
        "a lock that conflicts with ROW EXCLUSIVE (what INSERT, UPDATE and DELETE take) was "
        "taken, for any time, however short",
        lambda i: _blocking(i, "writes"),
    ),
    Kind(
        "row locks",
        "rows of a table were updated or deleted: each stays locked against other writers "
        "until COMMIT",
        lambda i: bool(i.row_writes),
    ),
    Kind("safe online", "none of the above", lambda i: True),
)


def kind_of(insight: MigrationInsight) -> VerdictKind:
    """The first of ``KINDS`` whose rule applies."""
    return next(k.name for k in KINDS if k.applies(insight))


def decide(insight: MigrationInsight, thresholds: Thresholds) -> Verdict:
    """The migration's verdict, from what it measured."""
    kind = kind_of(insight)
    tables = locks.per_table(_counted_locks(insight))
    rewrites = table_rewrites(_counted_rewrites(insight))
    over_locks = [
        t for t in tables if t.blocks != "ddl" and t.held_seconds > thresholds.max_blocking_lock
    ]
    over_rewrites = [r for r in rewrites if r.bytes_after > thresholds.max_rewrite]
    over = bool(over_locks or over_rewrites)
    level: VerdictLevel = "over" if over else "safe" if kind == "safe online" else "notice"
    if kind == "safe online":
        return Verdict(level, "safe online", kind)
    if kind == "row locks":
        return Verdict(level, _rows_text(insight.row_writes[0]), kind)
    if kind == "rewrite":
        rewrite = (over_rewrites or rewrites)[0]
        if over_locks and not over_rewrites:
            rewrite = next((r for r in rewrites if r.table == over_locks[0].table), rewrite)
        lock = next((t for t in tables if t.table == rewrite.table), None)
        text = _rewrite_text(insight, rewrite, lock)
        others = [t for t in over_locks if t.table != rewrite.table]
        if others:
            text += f"; also takes {_lock_text(insight, others[0], with_advice=False)}"
        return Verdict(level, text, kind)
    lock = _headline(insight, over_locks or tables)
    others = [t for t in tables if t.blocks != "ddl" and t.table != lock.table]
    return Verdict(level, "takes " + _lock_text(insight, lock, with_advice=True, also=others), kind)


def _headline(insight: MigrationInsight, tables: Sequence[locks.TableLock]) -> locks.TableLock:
    """The table the verdict names, of ``tables`` (worst first): of those that block as much,
    in the same mode, for about as long as the worst (a foreign key's two tables), the one the
    migration scanned under its lock (whose writes stop while it is read through), else the
    largest, else the longest held."""
    worst = tables[0]
    scanned = {s.relation for s in insight.scans}
    peers = [
        t
        for t in tables
        if t.blocks == worst.blocks
        and t.mode == worst.mode
        and worst.held_seconds - t.held_seconds < locks.NOTICEABLE_SECONDS
    ]
    return min(
        peers, key=lambda t: (t.table not in scanned, -t.table_bytes, -t.held_seconds, t.table)
    )


def _size(n: int) -> str:
    return f" ({format_bytes(n)})" if n else ""


def _lock_text(
    insight: MigrationInsight,
    lock: locks.TableLock,
    *,
    with_advice: bool,
    also: Sequence[locks.TableLock] = (),
) -> str:
    """``ACCESS EXCLUSIVE on `public.t` (181.0 MiB) for 11 ms: it waits behind ...``; ``also``
    are other tables locked so that they block reads or writes (a foreign key's other table),
    named after it."""
    size = format_bytes(lock.table_bytes) if lock.table_bytes else ""
    text = f"{lock.what(size=size)} for {locks.seconds_text(lock.held_seconds)}"
    if also:
        text += f" (and {also[0].mode} on `{also[0].table}`"
        more = len(also) - 1
        text += f" and {more} more table{'s' if more > 1 else ''})" if more else ")"
    if not with_advice:
        return text
    advice = _advice(insight, lock.statement, [])
    if not advice and _held_past_statement(insight, lock):
        advice = _UNTIL_COMMIT
    return f"{text}: " + "; ".join(x for x in (advice, *_queue(insight, lock)) if x)


def _rewrite_text(
    insight: MigrationInsight, rewrite: TableRewrite, lock: locks.TableLock | None
) -> str:
    """``rewrites `public.t` (181.0 MiB; column type change) under ACCESS EXCLUSIVE for
    5.9 s: <advice>; <the lock queue>``."""
    why = [r for r in rewrite.reasons if r != RECREATED]
    if RECREATED in rewrite.reasons:
        why.append("its indexes built again" if not why else "indexes built again")
    size = format_bytes(rewrite.table_bytes or rewrite.bytes_after)
    verb = "empties" if _bare(insight, rewrite.statement).startswith("TRUNCATE") else "rewrites"
    text = f"{verb} `{rewrite.table}` ({size}" + (f"; {', '.join(why)})" if why else ")")
    if lock is not None and lock.blocks != "ddl":
        text += f" under {lock.mode} for {locks.seconds_text(lock.held_seconds)}"
    advice = _advice(insight, rewrite.statement, rewrite.reasons)
    hazard = _queue(insight, lock) if lock is not None and lock.blocks != "ddl" else []
    rest = [x for x in (advice, *hazard) if x]
    return f"{text}: {'; '.join(rest)}" if rest else text


def _queue(insight: MigrationInsight, lock: locks.TableLock) -> list[str]:
    """The lock queue in production, and its remedy."""
    victims = "every query on it" if lock.blocks == "reads and writes" else "every write to it"
    hazard = f"it waits behind any running transaction on `{lock.table}`, and {victims} "
    hazard += "waits behind it"
    timeout = (
        locks.timeout_in_force(insight.statements, lock.statement)
        if lock.statement is not None
        else 0.0
    )
    if timeout > 0:
        bound = f"lock_timeout ({locks.seconds_text(timeout)}) bounds that wait: retry when it "
        return [hazard, bound + "expires"]
    return [hazard, _REMEDY]


def _rows_text(rows: RowWrites) -> str:
    done = []
    if rows.rows_updated:
        done.append(f"updates {rows.rows_updated:,} row{'' if rows.rows_updated == 1 else 's'}")
    if rows.rows_deleted:
        done.append(f"deletes {rows.rows_deleted:,} row{'' if rows.rows_deleted == 1 else 's'}")
    text = f"{' and '.join(done)} of `{rows.relation}`{_size(rows.bytes)}: each row stays "
    return text + f"locked against other writers until COMMIT; {_ROWS_ADVICE}"


def _advice(insight: MigrationInsight, statement: int | None, reasons: list[str]) -> str:
    """What to do instead: for a statement Postgres gives a misleading reason for (a stored
    generated column is a "volatile default"), from its text; else from the rewrite's
    reasons; else from the statement's text."""
    bare = _bare(insight, statement)
    for pattern, hint in _TEXT_FIRST:
        if re.search(pattern, bare):
            return hint
    for reason, hint in _REASON_ADVICE:
        if reason in reasons:
            return hint
    for pattern, hint in _TEXT_ADVICE:
        if re.search(pattern, bare):
            return hint
    return ""


def _bare(insight: MigrationInsight, statement: int | None) -> str:
    """The statement's text in capitals, on one line, without comments; "" if unknown."""
    if statement is None or not 0 <= statement < len(insight.statements):
        return ""
    bare = sqltext.strip_comments(insight.statements[statement].text)
    return " ".join(bare.upper().split())


def _held_past_statement(insight: MigrationInsight, lock: locks.TableLock) -> bool:
    """Whether the lock outlived the statement that took it by more than a noticeable time."""
    if lock.statement is None or lock.statement >= len(insight.statements):
        return False
    own = insight.statements[lock.statement].seconds
    return own is not None and lock.held_seconds - own >= locks.NOTICEABLE_SECONDS
