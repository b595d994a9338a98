"""A migrate command's statements told apart: the user's changes, and what the migration tool
sends for itself (bookkeeping); and the tool's migrations, named from the ledger rows it wrote.
Pure: no I/O.

A statement is bookkeeping, read from its own text (tokenised by sqlparse), when it is:

- session set-up: transaction control, ``SET``/``RESET``/``SHOW``/``DISCARD``/``DEALLOCATE``,
  or a ``SELECT`` that reads no relation and calls only ``SESSION_FUNCTIONS`` (``SELECT
  version()``, an advisory lock);
- a catalog lookup: a ``SELECT`` that reads only ``pg_catalog``, ``information_schema``;
- ledger: a statement every relation of which is a tool's own table (``TOOL_TABLES``: its
  ledger of applied migrations, Django's content types and permissions, Rails' metadata, the
  lock tables of Knex and Liquibase), alone or with catalogs.

A statement that names any other relation is the user's. The tool's tables take no part in the
command's locks, rewrites, scans or row counts (``analyze``); folding a statement into the
bookkeeping line hides its row, never a lock it took on the user's tables.

Each row a tool writes to its ledger names one of its migrations (``LEDGERS``). The user's
statements up to that write belong to it for a tool that records a migration after running it
(most tools), those from the write on for one that records it first (Prisma, golang-migrate).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import sqlparse
from sqlparse import tokens as T
from sqlparse.sql import Token

from pgoverlay.action.insight import verdict
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


@dataclass(frozen=True)
class Ledger:
    """A tool's table of applied migrations, and which of a row's columns name the migration."""

    tool: str
    table: str  # as Postgres names it: folded to lower case unless the tool quotes it
    columns: tuple[str, ...]  # their values, joined with ``joiner``, name the migration
    joiner: str = "."
    first: bool = False  # the row is written before the migration's statements run
    marker: str = ""  # a column only this tool's rows have, where two tools share a table name


LEDGERS = (
    Ledger("Alembic", "alembic_version", ("version_num",)),
    Ledger("Django", "django_migrations", ("app", "name")),
    Ledger("Flyway", "flyway_schema_history", ("script",)),
    Ledger("Prisma", "_prisma_migrations", ("migration_name",), first=True),
    Ledger("golang-migrate", "schema_migrations", ("version",), first=True, marker="dirty"),
    Ledger("Rails, dbmate or Ecto", "schema_migrations", ("version",)),
    Ledger("Knex", "knex_migrations", ("name",)),
    Ledger("Sequelize", "SequelizeMeta", ("name",)),
    Ledger("Liquibase", "databasechangelog", ("filename", "id", "author"), joiner="::"),
    Ledger("Diesel", "__diesel_schema_migrations", ("version",)),
    Ledger("sqlx", "_sqlx_migrations", ("version", "description"), joiner=" "),
    Ledger("goose", "goose_db_version", ("version_id",)),
)
# Every table a tool keeps for itself -> the tool: its ledger, and what it maintains beside it.
TOOL_TABLES: dict[str, str] = {
    **{ledger.table: ledger.tool for ledger in reversed(LEDGERS)},
    "django_content_type": "Django",
    "auth_permission": "Django",
    "ar_internal_metadata": "Rails",
    "knex_migrations_lock": "Knex",
    "databasechangeloglock": "Liquibase",
}
TOOL_TABLES["schema_migrations"] = "Rails, dbmate, Ecto or golang-migrate"
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
# Keywords after which a relation's name follows (ON only in CREATE INDEX/TRIGGER/...).
_BEFORE_RELATION = frozenset(
    {"FROM", "INTO", "UPDATE", "TABLE", "REFERENCES", "TRUNCATE", "LOCK", "ON"}
)
_SKIPPED = frozenset(
    {"ONLY", "IF", "NOT", "EXISTS", "IF EXISTS", "IF NOT EXISTS", "TABLE", "LATERAL"}
)
_PARAMETER = re.compile(r"\$(\d+) = (NULL|'((?:[^']|'')*)')")

Relation = tuple[str, str]  # (schema or "", name)


@dataclass(frozen=True)
class Logged:
    """One statement of the command as the server logged it, whole."""

    text: str
    parameters: str = ""  # the extended protocol's DETAIL values: "$1 = 'shop', $2 = NULL"


@dataclass(frozen=True)
class LedgerWrite:
    """A row a tool wrote to its ledger; ``name`` is "" when the row does not name a migration
    (Prisma's update of its row by id, a row copied by ``INSERT ... SELECT``)."""

    ledger: Ledger
    name: str


def is_tool_table(name: str) -> bool:
    """Whether a relation of this name is a migration tool's own table (in any schema)."""
    return name in TOOL_TABLES


def classify(text: str) -> str:
    """The bookkeeping a statement is (``BOOKKEEPING``), or "" for the user's change."""
    tokens = _tokens(text)
    if not tokens:
        return SESSION
    first = tokens[0].normalized.upper()
    if first in _SESSION_COMMANDS:
        return SESSION
    relations = _relations(tokens)
    tools = [r for r in relations if is_tool_table(r[1])]
    others = [r for r in relations if not is_tool_table(r[1]) and not _catalog(r)]
    if others:
        return ""
    if tools:
        return LEDGER
    if first not in _READS or _writes(tokens):
        return ""
    if relations:
        return CATALOG
    return SESSION if _functions(tokens) <= SESSION_FUNCTIONS else ""


def ledger_write(text: str, parameters: str = "") -> LedgerWrite | None:
    """The ledger row an ``INSERT`` or ``UPDATE`` wrote, with the migration it names; None for
    any other statement. ``parameters`` are the extended protocol's values of ``$n``."""
    tokens = _tokens(text)
    verb = next((t.normalized.upper() for t in tokens if t.ttype is T.Keyword.DML), "")
    if verb not in ("INSERT", "UPDATE"):
        return None
    values = _parameters(parameters)
    start = next(i for i, t in enumerate(tokens) if t.normalized.upper() == verb)
    at = start + 1
    if verb == "INSERT":
        if at >= len(tokens) or tokens[at].normalized.upper() != "INTO":
            return None
        at += 1
    while at < len(tokens) and tokens[at].normalized.upper() == "ONLY":
        at += 1
    name, at = _name_chain(tokens, at)
    if name is None:
        return None
    row = _inserted(tokens, at, values) if verb == "INSERT" else _assigned(tokens, at, values)
    ledger = _ledger(name[1], row)
    if ledger is None:
        return None
    named = [row[c] for c in ledger.columns if row.get(c)]
    return LedgerWrite(ledger, ledger.joiner.join(v for v in named if v is not None))


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
        ledger_write(x.text, x.parameters) if role == LEDGER else None
        for x, role in zip(logged, roles, strict=True)
    ]
    kept = [s for s in statements if s.bookkeeping]
    tools = {w.ledger.tool for w in writes if w is not None}
    tools |= {
        TOOL_TABLES[r[1]]
        for x, role in zip(logged, roles, strict=True)
        if role == LEDGER
        for r in _relations(_tokens(x.text))
        if is_tool_table(r[1])
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
    writes: Sequence[LedgerWrite | None], users: Sequence[bool]
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
    return _writes(_tokens(logged.text))


# -- reading a statement --------------------------------------------------------------------


def _tokens(text: str) -> list[Token]:
    """The statement's tokens, without whitespace and comments."""
    parsed = sqlparse.parse(text)
    if not parsed:
        return []
    return [
        t
        for t in parsed[0].flatten()  # type: ignore[no-untyped-call]
        if not t.is_whitespace and t.ttype not in T.Comment and t.ttype is not T.Newline
    ]


def _identifier(token: Token) -> str | None:
    """A name as Postgres folds it ("Quoted" kept, unquoted in lower case), or None."""
    if token.ttype in T.Literal.String.Symbol:
        return str(token.value)[1:-1].replace('""', '"')
    if token.ttype in T.Name and token.ttype not in T.Name.Placeholder:
        return str(token.value).lower()
    if token.ttype is T.Keyword and token.normalized.upper() not in _SKIPPED:
        return str(token.value).lower()
    return None


def _name_chain(tokens: Sequence[Token], at: int) -> tuple[Relation | None, int]:
    """The (schema, name) at ``at`` (``a``, ``a.b``, ``"a"."b"``) and the position after it."""
    parts: list[str] = []
    while at < len(tokens):
        name = _identifier(tokens[at])
        if name is None:
            break
        parts.append(name)
        at += 1
        if at < len(tokens) and tokens[at].value == ".":
            at += 1
            continue
        break
    if not parts:
        return None, at
    return (parts[-2] if len(parts) > 1 else "", parts[-1]), at


def _relations(tokens: Sequence[Token]) -> list[Relation]:
    """The relations a statement names: after FROM, JOIN, INTO, UPDATE, TABLE, REFERENCES,
    TRUNCATE, LOCK (and ON, in a CREATE), less functions called in FROM."""
    creating = bool(tokens) and tokens[0].normalized.upper() == "CREATE"
    found: list[Relation] = []
    for i, token in enumerate(tokens):
        if token.ttype not in T.Keyword:
            continue
        word = token.normalized.upper()
        joins = word.endswith("JOIN")
        if not (joins or word in _BEFORE_RELATION) or (word == "ON" and not creating):
            continue
        if word == "FROM" and i and tokens[i - 1].normalized.upper() == "DISTINCT":
            continue  # IS DISTINCT FROM
        at = i + 1
        while at < len(tokens) and tokens[at].normalized.upper() in _SKIPPED:
            at += 1
        if word == "ON" and at < len(tokens) and tokens[at].ttype in T.Keyword:
            continue  # ON DELETE, ON UPDATE of a foreign key
        name, after = _name_chain(tokens, at)
        if name is None:
            continue
        if (joins or word == "FROM") and after < len(tokens) and tokens[after].value == "(":
            continue  # a function in FROM
        found.append(name)
    return found


def _catalog(relation: Relation) -> bool:
    schema, name = relation
    return schema in CATALOG_SCHEMAS or (not schema and name.startswith("pg_"))


def _writes(tokens: Sequence[Token]) -> bool:
    """Whether a statement writes rows (INSERT, UPDATE, DELETE, MERGE, SELECT ... INTO)."""
    for token in tokens:
        word = token.normalized.upper()
        if token.ttype is T.Keyword.DML and word != "SELECT":
            return True
        if token.ttype is T.Keyword and word in ("INTO", "MERGE", "COPY"):
            return True
    return False


def _functions(tokens: Sequence[Token]) -> set[str]:
    """The names of the functions a statement calls (a name before "(")."""
    called: set[str] = set()
    for token, after in zip(tokens, tokens[1:], strict=False):
        if after.value == "(" and token.ttype in T.Name:
            called.add(token.value.lower())
    return called


def _parameters(text: str) -> dict[int, str | None]:
    """The DETAIL line's values: "$1 = 'a''b', $2 = NULL" -> {1: "a'b", 2: None}."""
    return {
        int(n): None if raw == "NULL" else quoted.replace("''", "'")
        for n, raw, quoted in _PARAMETER.findall(text)
    }


def _value(group: Sequence[Token], values: dict[int, str | None]) -> str | None:
    """A literal, a ``$n`` parameter's value, or None (NULL, DEFAULT, an expression)."""
    for token in group:
        if token.ttype in T.Literal.String.Single:
            text = str(token.value)
            return text[text.index("'") + 1 : -1].replace("''", "'")
        if token.ttype in T.Literal.Number:
            return str(token.value)
        if token.ttype in T.Name.Placeholder and token.value.startswith("$"):
            return values.get(int(token.value[1:]))
        if token.ttype in T.Name or token.ttype in T.Keyword:
            return None
    return None


def _groups(tokens: Sequence[Token], at: int) -> tuple[list[list[Token]], int]:
    """The comma-separated items of the parenthesised list opening at ``at``, and the position
    after its closing parenthesis."""
    groups: list[list[Token]] = [[]]
    depth = 0
    for i in range(at, len(tokens)):
        value = tokens[i].value
        if value == "(":
            depth += 1
            if depth == 1:
                continue
        elif value == ")":
            depth -= 1
            if depth == 0:
                return groups, i + 1
        elif value == "," and depth == 1:
            groups.append([])
            continue
        groups[-1].append(tokens[i])
    return groups, len(tokens)


def _inserted(
    tokens: Sequence[Token], at: int, values: dict[int, str | None]
) -> dict[str, str | None]:
    """Column -> value of an INSERT's first row ({} for INSERT ... SELECT or DEFAULT VALUES)."""
    if at >= len(tokens) or tokens[at].value != "(":
        return {}
    columns, at = _groups(tokens, at)
    names = [_identifier(c[0]) if c else None for c in columns]
    if at >= len(tokens) or tokens[at].normalized.upper() != "VALUES":
        return dict.fromkeys((n for n in names if n), None)
    row, _ = _groups(tokens, at + 1)
    return {
        name: _value(group, values)
        for name, group in zip(names, row, strict=False)
        if name is not None
    }


def _assigned(
    tokens: Sequence[Token], at: int, values: dict[int, str | None]
) -> dict[str, str | None]:
    """Column -> value of an UPDATE's ``SET a = x, b = y``."""
    if at >= len(tokens) or tokens[at].normalized.upper() != "SET":
        return {}
    row: dict[str, str | None] = {}
    at += 1
    while at < len(tokens):
        name = _identifier(tokens[at])
        if name is None or at + 2 >= len(tokens) or tokens[at + 1].value != "=":
            break
        end = at + 2
        depth = 0
        while end < len(tokens):
            value = tokens[end].value
            depth += (value == "(") - (value == ")")
            if depth == 0 and (value == "," or tokens[end].ttype is T.Keyword):
                break
            end += 1
        row[name] = _value(tokens[at + 2 : end], values)
        if end >= len(tokens) or tokens[end].value != ",":
            break
        at = end + 1
    return row


def _ledger(table: str, row: dict[str, str | None]) -> Ledger | None:
    """The ledger a write to ``table`` of a row with these columns is: one whose marker
    column the row has, else the table's ledger without a marker."""
    candidates = [ledger for ledger in LEDGERS if ledger.table == table]
    marked = [ledger for ledger in candidates if ledger.marker and ledger.marker in row]
    plain = [ledger for ledger in candidates if not ledger.marker]
    found = marked or plain
    return found[0] if found else None
