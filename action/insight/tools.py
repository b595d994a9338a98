"""A migrate command's statements told apart: the user's changes, and what the migration tool
sends for itself (bookkeeping); and the tool's migrations, named from the ledger rows it wrote.
Pure: no I/O.

A statement is bookkeeping, read from its own text (tokenised by sqlparse), when it is:

- session set-up: transaction control, ``SET``/``RESET``/``SHOW``/``DISCARD``/``DEALLOCATE``,
  or a ``SELECT`` that reads no relation and calls only ``SESSION_FUNCTIONS`` (``SELECT
  version()``, an advisory lock);
- a catalog lookup: a ``SELECT`` that reads only ``pg_catalog``, ``information_schema``;
- ledger: a statement every relation of which is a tool's own table (``ledgers.TOOL_TABLES``: its
  ledger of applied migrations, Django's content types and permissions, Rails' metadata, the
  lock tables of Knex and Liquibase), alone or with catalogs.

A statement that names any other relation is the user's. The tool's tables take no part in the
command's locks, rewrites, scans or row counts (``analyze``); folding a statement into the
bookkeeping line hides its row, never a lock it took on the user's tables.

Each row a tool writes to its ledger names one of its migrations (``ledgers.LEDGERS``). The user's
statements up to that write belong to it for a tool that records a migration after running it
(most tools), those from the write on for one that records it first (Prisma, golang-migrate).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlparse.sql import Token

from pgoverlay.action.insight import ledgers, sqltext, verdict
from pgoverlay.action.insight.model import (
    Bookkeeping,
    LockUse,
    MigrationInsight,
    Thresholds,
    ToolMigration,
    Volume,
)

SESSION = "session set-up"
CATALOG = "catalog lookup"
LEDGER = "ledger"
BOOKKEEPING = (SESSION, CATALOG, LEDGER)  # ``StatementInsight.bookkeeping``; "" is the user's


# No tool's own statement is this long; a longer one (a data migration's INSERT) is the user's
# without being read: sqlparse's lexer reads about 150 kB a second.
READ_LIMIT = 20_000
CATALOG_SCHEMAS = frozenset({"pg_catalog", "information_schema"})
SESSION_FUNCTIONS = frozenset(
    {
        "version",
        "current_schema",
        "current_schemas",
        "current_database",
        "current_user",
        "session_user",
        "current_setting",
        "set_config",
        "pg_backend_pid",
        "pg_is_in_recovery",
        "pg_advisory_lock",
        "pg_advisory_unlock",
        "pg_advisory_unlock_all",
        "pg_advisory_xact_lock",
        "pg_try_advisory_lock",
        "pg_try_advisory_xact_lock",
        "to_regclass",
        "now",
    }
)
_SESSION_COMMANDS = frozenset(
    {
        "BEGIN",
        "START",
        "COMMIT",
        "END",
        "ROLLBACK",
        "ABORT",
        "SAVEPOINT",
        "RELEASE",
        "SET",
        "RESET",
        "SHOW",
        "DISCARD",
        "DEALLOCATE",
    }
)
_READS = frozenset({"SELECT", "WITH", "VALUES"})


@dataclass(frozen=True)
class Logged:
    """One statement of the command as the server logged it, whole."""

    text: str
    parameters: str = ""  # the extended protocol's DETAIL values: "$1 = 'shop', $2 = NULL"


def classify(text: str) -> str:
    """The bookkeeping a statement is (``BOOKKEEPING``), or "" for the user's change. A text of
    several statements (a script a tool sends in one query) is bookkeeping only when each of
    them is; one longer than ``READ_LIMIT`` is the user's, unread."""
    if len(text) > READ_LIMIT:
        return ""
    roles = {_classify(tokens) for tokens in sqltext.statements(text)}
    if "" in roles:
        return ""
    return next((role for role in (LEDGER, CATALOG) if role in roles), SESSION)


def _classify(tokens: Sequence[Token]) -> str:
    first = tokens[0].normalized.upper()
    if first in _SESSION_COMMANDS:
        return SESSION
    relations = sqltext.relations(tokens)
    tools = [r for r in relations if ledgers.is_tool_table(r[1])]
    others = [r for r in relations if not ledgers.is_tool_table(r[1]) and not _catalog(r)]
    if others:
        return ""
    if tools:
        return LEDGER
    if first not in _READS or sqltext.writes(tokens):
        return ""
    if relations:
        return CATALOG
    return SESSION if sqltext.functions(tokens) <= SESSION_FUNCTIONS else ""


def sort_out(
    insight: MigrationInsight,
    logged: Sequence[Logged],
    *,
    thresholds: Thresholds,
    merge: Callable[[Sequence[LockUse]], list[LockUse]],
) -> MigrationInsight:
    """The command's insight with each statement marked as the user's or bookkeeping, the
    bookkeeping summed up, and one part per tool migration (none when no ledger row named
    one). ``logged[i]`` is statement ``i`` whole; ``merge`` turns the locks of a part's
    statements into its own, as for the whole command (per relation and mode, the longest)."""
    roles = [classify(x.text) for x in logged]
    statements = [
        dataclasses.replace(s, bookkeeping=role)
        for s, role in zip(insight.statements, roles, strict=True)
    ]
    writes = [
        ledgers.ledger_write(x.text, x.parameters) if role == LEDGER else None
        for x, role in zip(logged, roles, strict=True)
    ]
    kept = [s for s in statements if s.bookkeeping]
    tools = {w.ledger.tool for w in writes if w is not None}
    tools |= {
        ledgers.TOOL_TABLES[r[1]]
        for x, role in zip(logged, roles, strict=True)
        if role == LEDGER
        for tokens in sqltext.statements(x.text)
        for r in sqltext.relations(tokens)
        if ledgers.is_tool_table(r[1])
    }
    book = Bookkeeping(
        statements=len(kept),
        seconds=round(sum(s.seconds or 0.0 for s in kept), 6),
        tools=sorted(tools),
    )
    sorted_out = dataclasses.replace(insight, statements=statements, bookkeeping=book)
    spans = _spans(writes, [not role for role in roles])
    changing = {
        k for k, (_, _, span) in enumerate(spans) if any(_changes_rows(logged[i]) for i in span)
    }
    parts = [
        _part(
            sorted_out,
            tool,
            name,
            span,
            rows=insight.volume if k in changing else Volume(),
            thresholds=thresholds,
            merge=merge,
        )
        for k, (tool, name, span) in enumerate(spans)
    ]
    return dataclasses.replace(sorted_out, parts=parts)


def _spans(
    writes: Sequence[ledgers.LedgerWrite | None], users: Sequence[bool]
) -> list[tuple[str, str, list[int]]]:
    """(tool, migration, the statements of its span) in order; statements no row names, that
    include a user's one, make a part with no name. None at all without a ledger write."""
    if not any(w is not None for w in writes):
        return []
    spans: list[tuple[str, str, list[int]]] = []
    current: tuple[str, str] | None = None  # a first-writing tool's open migration
    pending: list[int] = []

    def close(owner: tuple[str, str] | None) -> None:
        nonlocal pending
        if owner is None and not any(users[i] for i in pending):
            pending = []
            return
        tool, name = owner or ("", "")
        if spans and owner is not None and spans[-1][:2] == owner:
            spans[-1][2].extend(pending)
        elif pending or owner is not None:
            spans.append((tool, name, pending))
        pending = []

    for i, write in enumerate(writes):
        if write is None or not write.name:
            pending.append(i)
            continue
        owner = (write.ledger.tool, write.name)
        if write.ledger.first:
            close(current)
            current = owner
            pending = [i]
        else:
            pending.append(i)
            close(owner)
            current = None
    close(current)
    return spans


def _part(
    insight: MigrationInsight,
    tool: str,
    name: str,
    span: Sequence[int],
    *,
    rows: Volume,
    thresholds: Thresholds,
    merge: Callable[[Sequence[LockUse]], list[LockUse]],
) -> ToolMigration:
    """One tool migration: its user's statements, and the locks, rewrites and scans of every
    statement of its span (a lock the sampler saw while the ledger row was written is still
    the migration's), judged as a migration of its own."""
    statements = [insight.statements[i] for i in span]
    own = [s.index for s in statements if not s.bookkeeping]
    volume = Volume(rows.rows_inserted, rows.rows_updated, rows.rows_deleted)
    alone = dataclasses.replace(
        insight,
        seconds=round(sum(insight.statements[i].seconds or 0.0 for i in own), 6),
        locks=merge([u for s in statements for u in s.locks]),
        rewrites=[r for s in statements for r in s.rewrites],
        scans=[x for s in statements for x in s.scans],
        volume=volume,
        findings=[],
        notes=[],
        parts=[],
    )
    return ToolMigration(
        name=name,
        tool=tool,
        statements=own,
        seconds=alone.seconds,
        locks=alone.locks,
        rewrites=alone.rewrites,
        scans=alone.scans,
        volume=volume,
        verdict=verdict.decide(alone, thresholds),
    )


def _changes_rows(logged: Logged) -> bool:
    """Whether a user's statement writes rows (the trace counts rows per command, not per
    statement: a part is given the command's counts when it has such a statement)."""
    if classify(logged.text):
        return False
    return any(sqltext.writes(t) for t in sqltext.statements(logged.text[:READ_LIMIT]))


def _catalog(relation: sqltext.Relation) -> bool:
    schema, name = relation
    return schema in CATALOG_SCHEMAS or (not schema and name.startswith("pg_"))
