"""What migration insight found for one migration: plain data, no I/O.

Times are seconds, sizes bytes. Statement indexes are 0-based positions in the migration's
statement list (``MigrationInsight.statements``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# What a lock stops in production, from Postgres's lock conflict table: a mode that conflicts
# with ACCESS SHARE (plain SELECT) blocks reads and writes; one that conflicts with ROW
# EXCLUSIVE (INSERT/UPDATE/DELETE) blocks writes; any other blocks only other DDL (and VACUUM).
Blocks = Literal["reads and writes", "writes", "ddl"]
FindingStatus = Literal["confirmed", "not observed", "not measurable"]
VerdictLevel = Literal["safe", "notice", "over"]  # over: a threshold is crossed
# What a migration does to production, worst first (verdict.KINDS holds each kind's rule).
VerdictKind = Literal[
    "rewrite", "blocks reads and writes", "blocks writes", "row locks", "safe online"
]
LockSource = Literal["exact", "inferred", "sampled"]


@dataclass(frozen=True)
class LockUse:
    """A lock mode taken on one relation, and how long it was held."""

    relation: str  # schema-qualified name, e.g. "public.orders"
    kind: str  # "table", "index", "sequence", "materialized view", "partitioned table", ...
    mode: str  # Postgres's name in capitals: "ACCESS EXCLUSIVE", "SHARE", ...
    blocks: Blocks
    held_seconds: float  # from acquisition to release (commit, for a transaction)
    waited_seconds: float = 0.0  # time spent waiting to get it
    statement: int | None = None  # the statement that took it, where statements are known
    bytes: int = 0  # the relation's size, for "blocks writes to orders (5.0 GiB)"
    # The table the relation belongs to: itself for a table, an index's table, a TOAST
    # table's table; and that table's whole size before the migration (table, TOAST, indexes).
    table: str = ""
    table_bytes: int = 0
    # How it is known: "exact" read from pg_locks by the trace while its transaction held it
    # (an event trigger or a statement mark), "inferred" from what Postgres documents for the
    # statement that ran (its mode is certain, its hold is the statement's to its commit),
    # "sampled" seen by the pg_locks sampler (it may miss a lock held less than an interval).
    source: LockSource = "sampled"
    # A concurrent drop's last lock on the index it removes (DROP INDEX CONCURRENTLY, REINDEX
    # CONCURRENTLY's old index): no query uses the index by then, so it decides no verdict.
    dying: bool = False


@dataclass(frozen=True)
class Rewrite:
    """A table or index whose storage was replaced (its relfilenode changed)."""

    relation: str
    kind: str
    reasons: list[str]  # from the table_rewrite event trigger; [] when Postgres gives none
    bytes_before: int
    bytes_after: int
    statement: int | None = None
    table: str = ""  # the table it belongs to (itself for a table), as ``LockUse.table``
    table_bytes: int = 0  # that table's whole size before the migration


@dataclass(frozen=True)
class Scan:
    """Full-table scans made while a lock that blocks writes was held on the table."""

    relation: str
    scans: int
    rows_read: int
    under: str  # the lock mode held meanwhile
    statement: int | None = None


@dataclass(frozen=True)
class Volume:
    rows_inserted: int = 0
    rows_updated: int = 0
    rows_deleted: int = 0
    wal_bytes: int = 0
    layer_bytes: int = 0  # physical growth of the branch's writable layer (may be negative)


@dataclass(frozen=True)
class Finding:
    """A lint (squawk) finding, checked against what the trace measured."""

    rule: str
    message: str
    line: int  # 1-based line of the migration file
    status: FindingStatus
    evidence: str  # what the trace saw, e.g. "no rewrite of public.orders" or "held 3 ms"
    statement: int | None = None


@dataclass(frozen=True)
class StatementInsight:
    index: int
    line: int | None  # first line in the file (SQL files); None for a command's statements
    text: str  # the statement, cut to at most 500 characters
    seconds: float | None  # from the server log; None when it was not logged
    locks: list[LockUse] = field(default_factory=list)
    rewrites: list[Rewrite] = field(default_factory=list)
    scans: list[Scan] = field(default_factory=list)
    # The lock_timeout in force when the statement ran, seconds: 0 for none, None if unknown.
    lock_timeout: float | None = None
    # Command mode: "" for the user's change, else which of the tool's bookkeeping it is
    # ("session set-up", "catalog lookup", "ledger"; ``tools.BOOKKEEPING``).
    bookkeeping: str = ""


@dataclass(frozen=True)
class RowWrites:
    """Rows of a table that existed before the migration, updated or deleted by it: each such
    row stays locked against other writers until the transaction commits."""

    relation: str
    rows_updated: int
    rows_deleted: int
    bytes: int = 0  # the table's size before the migration


@dataclass(frozen=True)
class Verdict:
    level: VerdictLevel
    text: str  # one line: "safe online", or "takes SHARE on `public.orders` (5.0 GiB) for ..."
    kind: VerdictKind = "safe online"


@dataclass(frozen=True)
class Bookkeeping:
    """Command mode: the statements the migration tool sent for itself, folded into one line."""

    statements: int = 0
    seconds: float = 0.0  # their total time, from the server log
    tools: list[str] = field(default_factory=list)  # whose ledger tables they used


@dataclass(frozen=True)
class ToolMigration:
    """Command mode: one migration of the tool, named from the ledger row it wrote, with its
    own statements (the user's, never the bookkeeping), locks, rewrites, scans and verdict."""

    name: str  # "shop.0003_order_amount", an Alembic revision; "" for statements no row named
    tool: str  # "Django", "Alembic", ...
    statements: list[int]  # indexes in ``MigrationInsight.statements``
    seconds: float  # its statements' time, from the server log
    locks: list[LockUse]
    rewrites: list[Rewrite]
    scans: list[Scan]
    volume: Volume  # rows: see ``tools.split`` (the trace counts rows per command)
    verdict: Verdict


@dataclass(frozen=True)
class TableBlocking:
    """How long the probe's queries on one existing table were kept waiting while the migration
    ran (``action/insight/probe.py``): live traffic, not a lock mode's inference."""

    relation: str
    reads_blocked: float = 0.0  # the read probes' waits, summed
    reads_worst: float = 0.0  # the longest a reader was kept waiting (a run of blocked probes)
    writes_blocked: float = 0.0  # the same for the write probes (table and row locks)
    writes_worst: float = 0.0
    reads: int = 0  # read probes run
    writes: int = 0  # write probes run (0: the role may not update the table)
    reads_queued: float | None = None  # with assume-long-transaction: how long reads queued
    # behind the migration while that transaction ran; None without it


@dataclass(frozen=True)
class MigrationInsight:
    seconds: float  # the migration's duration on the branch
    locks: list[LockUse]  # per relation and mode, the longest hold
    rewrites: list[Rewrite]
    scans: list[Scan]
    volume: Volume
    statements: list[StatementInsight]
    findings: list[Finding]
    verdict: Verdict
    interval: float  # the lock sampler's resolution, seconds
    notes: list[str] = field(default_factory=list)  # what was not measured, and why
    row_writes: list[RowWrites] = field(default_factory=list)  # per existing table
    # Command mode: the tool's own statements, and its migrations one by one (empty when no
    # ledger row named one).
    bookkeeping: Bookkeeping = field(default_factory=Bookkeeping)
    parts: list[ToolMigration] = field(default_factory=list)
    blocking: list[TableBlocking] = field(default_factory=list)  # per probed table
    long_transaction: float = 0.0  # the queue simulation's transaction, seconds (0: none)


@dataclass(frozen=True)
class Thresholds:
    """What the workflow allows (Action inputs ``max-blocking-lock``, ``max-rewrite``,
    ``fail-on-threshold``)."""

    max_blocking_lock: float = 5.0  # seconds a lock that blocks reads or writes may be held
    max_rewrite: int = 1024**3  # bytes a single rewrite may produce
    fail: bool = False  # crossing a threshold fails the step
