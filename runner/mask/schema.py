"""Check masking rules against a database's catalog: the tables and columns exist, each strategy
fits its column's type, and foreign keys on masked columns will still match. Reads catalogs
only, which any role may read, so the same check runs against the source before anything is
copied and against the base before masking starts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg

from pgoverlay.errors import MaskError
from pgoverlay.runner.mask.rules import DETERMINISTIC, ColumnRule, QualifiedName, Rules

Connection = psycopg.Connection[tuple[Any, ...]]

EMAIL_LENGTH = 29  # 'u' + 16 hex digits + '@example.com'
HASH_LENGTH = 64
_DATE_TYPES = ("date", "timestamp", "timestamptz")


@dataclass(frozen=True)
class Column:
    name: str
    type_name: str  # pg_type.typname
    category: str  # pg_type.typcategory ('S' for strings)
    max_length: int | None  # of varchar(n) / char(n)
    not_null: bool
    generated: bool
    identity_always: bool
    sql_type: str = ""  # format_type(): the type as SQL, with its modifier (varchar(40))
    collation: tuple[str, str] | None = None  # (schema, name), when not the type's default


@dataclass(frozen=True)
class Table:
    oid: int
    kind: str  # pg_class.relkind
    columns: dict[str, Column]


def catalog(conn: Connection, names: Iterable[QualifiedName]) -> dict[QualifiedName, Table]:
    """The listed tables that exist, with their columns (catalogs only: any role can read them)."""
    wanted = sorted(set(names))
    rows = conn.execute(
        """
        SELECT n.nspname, c.relname, c.oid, c.relkind, a.attname, t.typname, t.typcategory,
               CASE WHEN t.typname IN ('varchar', 'bpchar') AND a.atttypmod > 4
                    THEN a.atttypmod - 4 END,
               a.attnotnull, a.attgenerated <> '', a.attidentity = 'a',
               format_type(a.atttypid, a.atttypmod), cn.nspname, co.collname
        FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        JOIN unnest(%s::text[], %s::text[]) AS w(nsp, rel)
          ON w.nsp = n.nspname AND w.rel = c.relname
        LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
        LEFT JOIN pg_type t ON t.oid = a.atttypid
        LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> t.typcollation
        LEFT JOIN pg_namespace cn ON cn.oid = co.collnamespace
        """,
        ([n.schema for n in wanted], [n.table for n in wanted]),
    ).fetchall()
    tables: dict[QualifiedName, Table] = {}
    for row in rows:
        nsp, rel, oid, kind, attname, typname, category, length, notnull, gen, ident = row[:11]
        sql_type, coll_schema, coll_name = row[11:]
        name = QualifiedName(str(nsp), str(rel))
        table = tables.setdefault(name, Table(oid=int(oid), kind=str(kind), columns={}))
        if attname is not None:
            table.columns[str(attname)] = Column(
                name=str(attname),
                type_name=str(typname),
                category=str(category),
                max_length=int(length) if length is not None else None,
                not_null=bool(notnull),
                generated=bool(gen),
                identity_always=bool(ident),
                sql_type=str(sql_type),
                collation=(str(coll_schema), str(coll_name)) if coll_name is not None else None,
            )
    return tables


def problems(conn: Connection, rules: Rules) -> list[str]:
    """Every way ``rules`` do not fit the connected database; empty when they fit."""
    columns = rules.columns()
    truncated = rules.truncated()
    found = catalog(conn, [*columns, *truncated])
    issues: list[str] = []
    for name in [*columns, *truncated]:
        table = found.get(name)
        if table is None:
            issues.append(f"table {name} does not exist")
        elif table.kind not in ("r", "p"):
            issues.append(
                f"{name} is not a table (relkind {table.kind!r}): mask the tables it reads "
                "(materialized views that read a masked table are refreshed)"
            )
    for name, rules_of_table in columns.items():
        table = found.get(name)
        if table is None or table.kind not in ("r", "p"):
            continue
        for column, rule in rules_of_table.items():
            col = table.columns.get(column)
            if col is None:
                issues.append(f"column {name}.{column} does not exist")
                continue
            issue = _fit(rule, col)
            if issue:
                issues.append(f"column {name}.{column} ({col.type_name}): {issue}")
    issues += _foreign_key_problems(conn, rules)
    return issues


def check(conn: Connection, rules: Rules, *, rules_name: str, where: str) -> None:
    found = problems(conn, rules)
    if found:
        raise MaskError(
            f"masking rules {rules_name} do not fit {where}: {'; '.join(found)}; "
            "fix the rules file (names are as in the catalog: schema.table, lower case unless "
            "created quoted)"
        )


def _fit(rule: ColumnRule, col: Column) -> str:
    """Why ``rule`` cannot mask ``col``, or ''."""
    if col.generated:
        return "a generated column: mask the columns it is computed from"
    if col.identity_always:
        return "an identity column GENERATED ALWAYS cannot be updated"
    strategy = rule.strategy
    if strategy == "null" and col.not_null:
        return "NOT NULL: use a fake, a hash or a value instead of null"
    if strategy == "fake":
        if col.category != "S":
            return f"fake {rule.argument} needs a text column; use {{sql: ...}} or {{value: ...}}"
        too_short = col.max_length is not None and col.max_length < EMAIL_LENGTH
        if rule.argument == "email" and too_short:
            return f"fake emails are {EMAIL_LENGTH} characters, longer than the column's limit"
    if strategy == "hash":
        if col.type_name == "uuid":
            return ""
        if col.category != "S":
            return "hash needs a text or uuid column"
        if col.max_length is not None and col.max_length < HASH_LENGTH:
            return f"hashes are {HASH_LENGTH} hex characters, longer than the column's limit"
    if strategy == "truncate_date" and col.type_name not in _DATE_TYPES:
        return "truncate_date needs a date or timestamp column"
    return ""


def _foreign_key_problems(conn: Connection, rules: Rules) -> list[str]:
    """Keys on masked columns must still match: both sides need the same deterministic rule."""
    rows = conn.execute(
        """
        SELECT k.conname, sn.nspname, s.relname, sa.attname, dn.nspname, d.relname, da.attname
        FROM pg_constraint k
        CROSS JOIN LATERAL unnest(k.conkey, k.confkey) AS u(src, dst)
        JOIN pg_class s ON s.oid = k.conrelid
        JOIN pg_namespace sn ON sn.oid = s.relnamespace
        JOIN pg_attribute sa ON sa.attrelid = k.conrelid AND sa.attnum = u.src
        JOIN pg_class d ON d.oid = k.confrelid
        JOIN pg_namespace dn ON dn.oid = d.relnamespace
        JOIN pg_attribute da ON da.attrelid = k.confrelid AND da.attnum = u.dst
        WHERE k.contype = 'f' AND k.conparentid = 0
        ORDER BY 1, 2, 3, 4
        """
    ).fetchall()
    truncated = set(rules.truncated())
    issues = []
    for conname, sn, s, sa, dn, d, da in rows:
        src, dst = QualifiedName(str(sn), str(s)), QualifiedName(str(dn), str(d))
        if src in truncated or dst in truncated:
            continue  # Postgres refuses to truncate a referenced table alone
        ours, theirs = rules.rule(src, str(sa)), rules.rule(dst, str(da))
        if ours is None and theirs is None:
            continue
        if ours is not None and ours.strategy == "null":
            continue
        if ours == theirs and ours is not None and ours.strategy in DETERMINISTIC:
            continue
        issues.append(
            f"column {src}.{sa} references {dst}.{da} (foreign key {conname}): give both the "
            f"same fake or hash rule so the keys still match (now: "
            f"{ours.describe() if ours else 'no rule'} and "
            f"{theirs.describe() if theirs else 'no rule'}), or null on {src}.{sa}"
        )
    return issues
