"""The tables migration tools keep for themselves, and the rows they write to their ledger of
applied migrations, read back into the migration each row names. Pure: no I/O.

Each row names one migration: Django's ``INSERT INTO "django_migrations" ("app", "name", ...)
VALUES ('shop', '0003_order_amount', ...)`` names ``shop.0003_order_amount``, Alembic's
``UPDATE alembic_version SET version_num='ae1027a6acf'`` the revision. The values are literals,
or ``$n`` parameters whose values the server log gives on the DETAIL line after the statement
(the extended protocol).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from sqlparse import tokens as T
from sqlparse.sql import Token

from pgoverlay.action.insight import sqltext

__all__ = ["LEDGERS", "TOOL_TABLES", "Ledger", "LedgerWrite", "is_tool_table", "ledger_write"]

_PARAMETER = re.compile(r"\$(\d+) = (NULL|'((?:[^']|'')*)')")


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
    Ledger("Entity Framework", "__EFMigrationsHistory", ("MigrationId",)),
    Ledger("node-pg-migrate", "pgmigrations", ("name",)),
    Ledger("Doctrine", "doctrine_migration_versions", ("version",)),
    Ledger("Phinx", "phinxlog", ("version", "migration_name"), joiner=" "),
    Ledger("MikroORM", "mikro_orm_migrations", ("name",)),
)
# Left out: tables named too plainly to be told from the user's own ("migrations" of TypeORM
# and Laravel, the "changes" and "events" of Sqitch's registry schema).
# Every table a tool keeps for itself -> the tool: its ledger, and what it maintains beside it.
TOOL_TABLES: dict[str, str] = {
    **{ledger.table: ledger.tool for ledger in LEDGERS},
    "schema_migrations": "Rails, dbmate, Ecto or golang-migrate",  # one name, four tools
    "django_content_type": "Django",
    "auth_permission": "Django",
    "ar_internal_metadata": "Rails",
    "knex_migrations_lock": "Knex",
    "databasechangeloglock": "Liquibase",
}


@dataclass(frozen=True)
class LedgerWrite:
    """A row a tool wrote to its ledger; ``name`` is "" when the row does not name a migration
    (Prisma's update of its row by id, a row copied by ``INSERT ... SELECT``)."""

    ledger: Ledger
    name: str


def is_tool_table(name: str) -> bool:
    """Whether a relation of this name is a migration tool's own table (in any schema), or the
    sequence of one's column, as Postgres names it for a ``serial`` or identity column
    (``django_migrations_id_seq``: the tool's insert of its ledger row takes a lock on it)."""
    if name in TOOL_TABLES:
        return True
    owner, _, column = name.removesuffix("_seq").rpartition("_")
    return name.endswith("_seq") and bool(column) and owner in TOOL_TABLES


def ledger_write(text: str, parameters: str = "") -> LedgerWrite | None:
    """The ledger row an ``INSERT`` or ``UPDATE`` wrote, with the migration it names; None for
    any other statement. ``parameters`` are the extended protocol's values of ``$n``."""
    tokens = sqltext.tokenise(text)
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
    name, at = sqltext.name_chain(tokens, at)
    if name is None:
        return None
    row = _inserted(tokens, at, values) if verb == "INSERT" else _assigned(tokens, at, values)
    ledger = _ledger(name[1], row)
    if ledger is None:
        return None
    named = [row[c] for c in ledger.columns if row.get(c)]
    return LedgerWrite(ledger, ledger.joiner.join(v for v in named if v is not None))


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
    names = [sqltext.identifier(c[0]) if c else None for c in columns]
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
        name = sqltext.identifier(tokens[at])
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
