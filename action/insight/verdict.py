"""One line per migration: is it safe to run online, and if not, what to do instead.

"over" when a lock that blocks reads or writes is held longer than ``max_blocking_lock`` or a
rewrite produces more than ``max_rewrite`` bytes; "notice" for a shorter blocking lock (from
``NOTICEABLE_SECONDS``) or a smaller rewrite; else "safe online". The advice comes from what
caused it: the statement's text and the rewrite's reasons.
"""

from __future__ import annotations

import re

import sqlparse

from pgoverlay.action.insight import locks
from pgoverlay.action.insight.model import (
    LockUse,
    MigrationInsight,
    Rewrite,
    Thresholds,
    Verdict,
    VerdictLevel,
)
from pgoverlay.runner.units import format_bytes

WITH_TABLE = "rebuilt with its table"  # an index or TOAST table rewritten with its table
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
        r"\bADD (CONSTRAINT \S+ )?(FOREIGN KEY|CHECK)\b(?!.*\bNOT VALID\b)",
        "add the constraint NOT VALID, then VALIDATE CONSTRAINT in its own transaction",
    ),
    (
        r"\bADD (CONSTRAINT \S+ )?(UNIQUE|PRIMARY KEY)\b(?!.*\bUSING INDEX\b)",
        "build a unique index CONCURRENTLY, then ADD CONSTRAINT ... USING INDEX",
    ),
    (
        r"^(VACUUM \(?FULL|CLUSTER\b)",
        "VACUUM FULL and CLUSTER rewrite under ACCESS EXCLUSIVE: "
        "use pg_repack or pg_squeeze on a live table",
    ),
)
_UNTIL_COMMIT = "the lock is held until COMMIT: run slow statements in a transaction of their own"


def decide(insight: MigrationInsight, thresholds: Thresholds) -> Verdict:
    """The migration's verdict, from what it measured."""
    blocking = [x for x in insight.locks if x.blocks != "ddl"]
    rewrites = [r for r in insight.rewrites if WITH_TABLE not in r.reasons]
    over_locks = [x for x in blocking if x.held_seconds > thresholds.max_blocking_lock]
    over_rewrites = [r for r in rewrites if r.bytes_after > thresholds.max_rewrite]
    notices = [x for x in blocking if x.held_seconds >= locks.NOTICEABLE_SECONDS]
    level: VerdictLevel = "over" if over_locks or over_rewrites else "notice"
    if over_locks or (notices and not over_rewrites):
        lock = (over_locks or notices)[0]
        rewrite = next((r for r in rewrites if r.relation == lock.relation), None)
        return Verdict(level, _lock_text(insight, lock, rewrite))
    if over_rewrites or rewrites:
        return Verdict(level, _rewrite_text(insight, (over_rewrites or rewrites)[0]))
    return Verdict("safe", "safe online")


def _lock_text(insight: MigrationInsight, lock: LockUse, rewrite: Rewrite | None) -> str:
    what = "reads and writes to" if lock.blocks == "reads and writes" else "writes to"
    text = f"blocks {what} `{lock.relation}` ({format_bytes(lock.bytes)})"
    text += f" for {locks.seconds_text(lock.held_seconds)}"
    if rewrite is not None:
        text += ", rewriting it" + (f" ({', '.join(rewrite.reasons)})" if rewrite.reasons else "")
    hint = _advice(insight, lock.statement, rewrite.reasons if rewrite else [])
    if not hint and _held_past_statement(insight, lock):
        hint = _UNTIL_COMMIT
    return f"{text}: {hint}" if hint else text


def _rewrite_text(insight: MigrationInsight, rewrite: Rewrite) -> str:
    text = f"rewrites `{rewrite.relation}` ({format_bytes(rewrite.bytes_after)}"
    text += f", {', '.join(rewrite.reasons)})" if rewrite.reasons else ")"
    hint = _advice(insight, rewrite.statement, rewrite.reasons)
    return f"{text}: {hint}" if hint else text


def _advice(insight: MigrationInsight, statement: int | None, reasons: list[str]) -> str:
    """What to do instead, from the rewrite's reasons, else the statement's text."""
    for reason, hint in _REASON_ADVICE:
        if reason in reasons:
            return hint
    if statement is None or statement >= len(insight.statements):
        return ""
    bare = sqlparse.format(insight.statements[statement].text, strip_comments=True)
    bare = " ".join(bare.upper().split())
    for pattern, hint in _TEXT_ADVICE:
        if re.search(pattern, bare):
            return hint
    return ""


def _held_past_statement(insight: MigrationInsight, lock: LockUse) -> bool:
    """Whether the lock outlived the statement that took it by more than a noticeable time."""
    if lock.statement is None or lock.statement >= len(insight.statements):
        return False
    own = insight.statements[lock.statement].seconds
    return own is not None and lock.held_seconds - own >= locks.NOTICEABLE_SECONDS
